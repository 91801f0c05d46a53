// The bytes one decode step must move: what pw-bench-engine's floor divides by bandwidth.
//
// Counted from the loaded model itself, so every family is counted by what it holds, not by a
// formula of one architecture: every non-expert matrix of every layer (attention of any kind:
// q/k/v/o, a hybrid's linear-attention projections, MLA's projections; the router, the shared
// expert and its gate, a dense MLP) at the bytes the engine reads it at (1 for an int8 copy,
// the planes and int8 table of an any-precision one: Model::QuantizeDense; else 2), every norm, bias and small tensor as fp32, lm_head, the
// final norm and one embedding row per sequence; plus what each layer's KV spec keeps
// (memory/kv_spec.h): K and V of every position for full attention, of the last `window` for a
// sliding layer, one latent per position for MLA, and for a recurrent state its bytes twice per
// sequence (read, then written back); plus the routed experts' bytes, given by the caller from
// the experts the router actually chose. Not counted: the routed experts' biases (gpt_oss:
// 2I + H values per expert read) and activations, which stay in cache.
#pragma once

#include "engine/models/model.h"

namespace pw::bench {

struct StepBytes {
  double weights = 0;  // non-expert matrices and vectors, lm_head, embedding rows
  double kv = 0;       // K/V (or latents) of every position the step attends to
  double state = 0;    // recurrent states, read and written
  double experts = 0;  // the routed experts, as given
  double total() const { return weights + kv + state + experts; }
};

// One decode step of `batch` sequences at mean context `ctx` positions, KV elements of
// `kv_elem_bytes` (4 for fp32, 2 for bf16), the routed experts reading
// `expert_bytes_per_moe_layer` in each MoE layer.
StepBytes DecodeStepBytes(const engine::Model& model, int batch, double ctx, double kv_elem_bytes,
                          double expert_bytes_per_moe_layer);

}  // namespace pw::bench
