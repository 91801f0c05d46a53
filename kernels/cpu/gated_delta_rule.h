// The per-token kernels of a Gated DeltaNet layer (linear attention; engine/layers/
// gated_delta_net.h runs the layer): a step of a causal depthwise conv over a fixed-size conv
// state, and a step of the gated delta rule over a head's [dk, dv] state matrix. Scalar
// reference code in fp32: the recurrence is the step-by-step form, which the chunked form of
// HF transformers' torch_chunk_gated_delta_rule computes in another order.
#pragma once

#include <cstddef>

namespace pw::cpu {

// out[c] = silu(sum_j weight[c][j] * w_j) over the window w = (state[c][0..K-2], x[c]) (oldest
// first, weight[c][K-1] multiplies x), then the window slides: state[c] = its last K-1 values.
// weight [C][K]; state [C][K-1]; C channels.
void CausalConv1dSiluStep(const float* x, const float* weight, size_t channels, size_t kernel,
                          float* state, float* out);

// One step of the gated delta rule for one head, state S [dk][dv]:
//   S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
// (q already L2-normalised and scaled, k L2-normalised, as the caller's layer defines).
void GatedDeltaRuleStep(const float* q, const float* k, const float* v, float g, float beta,
                        size_t dk, size_t dv, float* state, float* out);

// x *= 1 / sqrt(sum(x^2) + eps), as FLA's (and HF's) l2norm.
void L2NormalizeInPlace(float* x, size_t n, float eps);

}  // namespace pw::cpu
