// RunExpertsByBlock: an ExpertLayerCall computed one expert block at a time, from a per-block
// product. For providers whose natural unit is one block (a reference path, a calibration
// recorder that looks at each block's input, a test double): for each group in order, its
// tokens' rows of x are gathered, block(gate_up) gives [n, 2I], h = act(gate, up) (the call's
// activation; an unknown kind is kUnsupported before any block runs), block(down) gives
// [n, H], and out[token] += weight * y. The block function may use the call's pool; the
// staging buffers come from the call's workspace (slots 0..3).
#pragma once

#include <algorithm>
#include <cstring>

#include "common/status.h"
#include "kernels/cpu/dense.h"
#include "engine/experts/expert_activation.h"
#include "engine/experts/expert_layer_call.h"
#include "engine/experts/expert_workspace.h"
#include "engine/experts/moe.h"

namespace pw::engine {

// block(expert, proj, x, ldx, n, y, ldy) -> Status computes y[t * ldy + r] = sum_k W[r, k] *
// x[t * ldx + k] for t < n and every row r of block (expert, proj) of call.layer.
template <typename BlockFn>
Status RunExpertsByBlock(const ExpertLayerCall& call, const kernels::DenseKernels& k,
                         BlockFn&& block) {
  const size_t H = call.hidden, I = call.ffn;
  PW_ASSIGN_OR_RETURN(const ExpertActivationFn act_fn, ExpertActivationOp(call.activation, k));
  size_t most = 0;
  for (const ExpertGroup& g : call.groups) most = std::max(most, static_cast<size_t>(g.size()));
  ExpertWorkspace& ws = *call.workspace;
  float* xe = ws.Array<float>(0, most * H);
  float* gate_up = ws.Array<float>(1, most * 2 * I);
  float* act = ws.Array<float>(2, most * I);
  float* ye = ws.Array<float>(3, most * H);
  for (const ExpertGroup& g : call.groups) {
    const size_t n = static_cast<size_t>(g.size());
    for (size_t r = 0; r < n; ++r) {
      std::memcpy(xe + r * H, call.x + static_cast<size_t>(call.rows[g.begin + r].token) * H,
                  H * sizeof(float));
    }
    PW_RETURN_IF_ERROR(block(g.expert, ExpertProj::kGateUp, xe, H, n, gate_up, 2 * I));
    for (size_t r = 0; r < n; ++r) {
      if (call.gate_up_bias != nullptr) {
        k.axpy(1.f, call.gate_up_bias + static_cast<size_t>(g.expert) * 2 * I, 2 * I,
               gate_up + r * 2 * I);
      }
      act_fn(gate_up + r * 2 * I, gate_up + r * 2 * I + I, I, act + r * I);
    }
    PW_RETURN_IF_ERROR(block(g.expert, ExpertProj::kDown, act, I, n, ye, H));
    for (size_t r = 0; r < n; ++r) {
      const ExpertRow& row = call.rows[g.begin + r];
      if (call.down_bias != nullptr) {
        k.axpy(1.f, call.down_bias + static_cast<size_t>(g.expert) * H, H, ye + r * H);
      }
      k.axpy(row.weight, ye + r * H, H, call.out + static_cast<size_t>(row.token) * H);
    }
  }
  return Status::Ok();
}

}  // namespace pw::engine
