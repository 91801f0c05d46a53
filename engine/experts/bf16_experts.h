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
#include "kernels/cpu/packed_bf16.h"
#include "engine/experts/expert_layer_call.h"

namespace pw::engine {

// One expert's matrices, row-major bf16 bits: gate and up [I, H], down [H, I]. A matrix whose
// packed copy is given (kernels/cpu/packed_bf16.h) is multiplied from it by
// cpu::MatmulPackedBf16 (the same values; the plain kernel's bits but for rows with exceptions
// at 1-4 tokens, packed_bf16.h).
struct Bf16Expert {
  const uint16_t* gate = nullptr;
  const uint16_t* up = nullptr;
  const uint16_t* down = nullptr;
  const cpu::PackedBf16Matrix* gate_packed = nullptr;
  const cpu::PackedBf16Matrix* up_packed = nullptr;
  const cpu::PackedBf16Matrix* down_packed = nullptr;
};

// How bf16 experts are held: as the checkpoint (or the broker) has them, packed losslessly
// (kernels/cpu/packed_bf16.h: the same values in ~0.75x the bytes a step reads), or auto:
// packed where packing pays (cpu::PackingPays of cpu::Kernels(): AVX512-BF16 with bf16
// activations). PackBf16Experts resolves auto.
enum class Bf16ExpertForm { kAuto, kPlain, kPacked };
bool PackBf16Experts(Bf16ExpertForm form);

// experts[g] holds the matrices of call.groups[g].expert.
Status RunBf16Experts(const ExpertLayerCall& call, const Bf16Expert* experts,
                      const kernels::DenseKernels& k);

}  // namespace pw::engine
