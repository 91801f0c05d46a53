// RunBf16Experts: an ExpertLayerCall over bf16 expert matrices (the checkpoint's, or a copy
// fetched from the broker), the whole layer at once:
//   1. the rows of x each group reads are gathered into [rows, H];
//   2. ONE pool dispatch computes every group's gate and up rows (tiles of ExpertTiles);
//   3. h = act(gate, up) for every row (the call's activation, expert_activation.h);
//   4. ONE pool dispatch computes every group's down rows;
//   5. out[token] += weight * y, in group order.
// Each output element is the same matmul_bf16 dot product a per-block Linear computes, so
// results are bit-identical to computing the experts one block at a time. Staging buffers
// come from the call's workspace (slots 0..3). An activation kind without a CPU op is
// kUnsupported before anything is computed.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kernels/cpu/dense.h"
#include "engine/experts/expert_layer_call.h"

namespace pw::engine {

// One expert's matrices, row-major bf16 bits: gate and up [I, H], down [H, I].
struct Bf16Expert {
  const uint16_t* gate = nullptr;
  const uint16_t* up = nullptr;
  const uint16_t* down = nullptr;
};

// experts[g] holds the matrices of call.groups[g].expert.
Status RunBf16Experts(const ExpertLayerCall& call, const Bf16Expert* experts,
                      const kernels::DenseKernels& k);

}  // namespace pw::engine
