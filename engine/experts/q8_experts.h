// RunQ8Experts: an ExpertLayerCall on the any-precision fast path (kernels/anyprec/q8.h), the
// whole layer at once:
//   1. x [T, H] is quantized to int8 ONCE for the layer (not once per expert), and each
//      group's rows are gathered from it;
//   2. ONE pool dispatch computes every group's gate_up rows at their blocks' widths (tiles of
//      expert_tiles.h; tokens in chunks of kMaxTokens per kernel call);
//   3. h = act(gate, up) (the call's activation), quantized for every row of the layer at once;
//   4. ONE pool dispatch computes every group's down rows;
//   5. out[token] += weight * y, in group order.
// Activation quantization is per token row, so a row's int8 values are the same whichever
// rows it is quantized with: results are bit-identical to ApplyQ8Block per block. Staging
// buffers come from the call's workspace (slots 0..5). Used by every provider that reads
// planes (a mapped store, pool pages), so a block gives the same bits wherever it lives.
// An activation kind without a CPU op is kUnsupported before anything is computed.
#pragma once

#include "common/status.h"
#include "kernels/anyprec/anyprec.h"
#include "kernels/anyprec/q8.h"
#include "kernels/cpu/dense.h"
#include "engine/experts/expert_layer_call.h"

namespace pw::anyprec {

// One block as the fast path reads it: its planes, int8 LUT and width (3..8).
struct Q8ExpertBlock {
  BlockView view;
  Q8Lut lut;
  int bits = 0;
};

// gate_up[g] and down[g]: the blocks of call.groups[g].expert ([2I, H] and [H, I]). A kernel
// error (a bad view, non-finite activations) names the layer and expert.
Status RunQ8Experts(kernels::Backend backend, const engine::ExpertLayerCall& call,
                    const Q8ExpertBlock* gate_up, const Q8ExpertBlock* down,
                    const kernels::DenseKernels& k);

}  // namespace pw::anyprec
