#include "engine/experts/bf16_experts.h"

#include <cstring>
#include <vector>

#include "engine/experts/expert_activation.h"
#include "engine/experts/expert_tiles.h"
#include "engine/experts/expert_workspace.h"
#include "engine/ops/linear.h"

namespace pw::engine {

bool PackBf16Experts(Bf16ExpertForm form) {
  return form == Bf16ExpertForm::kPacked || (form == Bf16ExpertForm::kAuto && cpu::PackingPays(cpu::Kernels()));
}

Status RunBf16Experts(const ExpertLayerCall& call, const Bf16Expert* experts,
                      const kernels::DenseKernels& k) {
  const size_t H = call.hidden, I = call.ffn, R = call.rows.size();
  PW_ASSIGN_OR_RETURN(const ExpertActivationFn act_fn, ExpertActivationOp(call.activation, k));
  ExpertWorkspace& ws = *call.workspace;
  float* xe = ws.Array<float>(0, R * H);
  float* gate_up = ws.Array<float>(1, R * 2 * I);
  float* act = ws.Array<float>(2, R * I);
  float* ye = ws.Array<float>(3, R * H);
  for (const ExpertGroup& e : call.groups) {
    for (size_t r = static_cast<size_t>(e.begin); r < static_cast<size_t>(e.end); ++r) {
      std::memcpy(xe + r * H, call.x + static_cast<size_t>(call.rows[r].token) * H, H * sizeof(float));
    }
  }
  std::vector<ExpertTile>& tiles = ws.tiles();
  tiles.clear();
  for (size_t g = 0; g < call.groups.size(); ++g) {
    const ExpertGroup& e = call.groups[g];
    AppendExpertTiles(static_cast<int32_t>(g), e.begin, e.size(), static_cast<int32_t>(2 * I),
                      static_cast<int32_t>(I), &tiles);
  }
  PW_RETURN_IF_ERROR(RunExpertTiles(call.pool, tiles, H, kMinParallelMacs, [&](const ExpertTile& t) {
    const Bf16Expert& w = experts[t.group];
    const float* x = xe + static_cast<size_t>(t.row0) * H;
    float* y = gate_up + static_cast<size_t>(t.row0) * 2 * I;
    const auto tokens = static_cast<size_t>(t.tokens);
    // Rows [0, I) are gate's, [I, 2I) up's: a tile lies in one of them.
    const bool up = static_cast<size_t>(t.r0) >= I;
    const size_t off = up ? I : 0, r0 = t.r0 - off, r1 = t.r1 - off;
    const cpu::PackedBf16Matrix* packed = up ? w.up_packed : w.gate_packed;
    if (packed != nullptr) {
      MatmulPacked(k, x, H, tokens, packed->view(), r0, r1, y + off, 2 * I);
    } else {
      k.matmul_bf16(x, H, tokens, up ? w.up : w.gate, H, r0, r1, y + off, 2 * I);
    }
    return Status::Ok();
  }, TileCalls::kCoalesce));
  for (const ExpertGroup& e : call.groups) {
    for (size_t r = static_cast<size_t>(e.begin); r < static_cast<size_t>(e.end); ++r) {
      if (call.gate_up_bias != nullptr) {
        k.axpy(1.f, call.gate_up_bias + static_cast<size_t>(e.expert) * 2 * I, 2 * I,
               gate_up + r * 2 * I);
      }
      act_fn(gate_up + r * 2 * I, gate_up + r * 2 * I + I, I, act + r * I);
    }
  }
  tiles.clear();
  for (size_t g = 0; g < call.groups.size(); ++g) {
    const ExpertGroup& e = call.groups[g];
    AppendExpertTiles(static_cast<int32_t>(g), e.begin, e.size(), static_cast<int32_t>(H), 0, &tiles);
  }
  PW_RETURN_IF_ERROR(RunExpertTiles(call.pool, tiles, I, kMinParallelMacs, [&](const ExpertTile& t) {
    const float* a = act + static_cast<size_t>(t.row0) * I;
    float* y = ye + static_cast<size_t>(t.row0) * H;
    if (experts[t.group].down_packed != nullptr) {
      MatmulPacked(k, a, I, static_cast<size_t>(t.tokens), experts[t.group].down_packed->view(),
                   static_cast<size_t>(t.r0), static_cast<size_t>(t.r1), y, H);
      return Status::Ok();
    }
    k.matmul_bf16(a, I, static_cast<size_t>(t.tokens), experts[t.group].down, I, static_cast<size_t>(t.r0),
                  static_cast<size_t>(t.r1), y, H);
    return Status::Ok();
  }, TileCalls::kCoalesce));
  for (const ExpertGroup& e : call.groups) {
    for (size_t r = static_cast<size_t>(e.begin); r < static_cast<size_t>(e.end); ++r) {
      if (call.down_bias != nullptr) {
        k.axpy(1.f, call.down_bias + static_cast<size_t>(e.expert) * H, H, ye + r * H);
      }
      k.axpy(call.rows[r].weight, ye + r * H, H, call.out + static_cast<size_t>(call.rows[r].token) * H);
    }
  }
  return Status::Ok();
}

}  // namespace pw::engine
