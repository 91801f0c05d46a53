// BatchRemapper: a rule that rewrites one MoE layer's token -> expert choices for a whole
// batch (LYNX: lynx_remap.h; the piggyback baseline: piggyback_remap.h), and what it reads and
// returns. Pure: a function of router logits and a few flags, no engine types, so a simulator
// replaying router-logit traces, a unit test and the engine's routing hook run the same code.
//
// Contract of Remap: every token keeps exactly k distinct experts; a token's slots are sorted
// by its original logit, descending (lower expert id first on ties), as the router ranks them.
// When the rule does not apply (not a pure-decode batch, an exempt layer, or nothing to gain)
// every token keeps its router top-k and `applied` is false. The result lives in the
// remapper's buffers until the next call. Not thread-safe; Reserve() sizes the buffers so the
// call does not allocate (a larger batch than reserved grows them once).
#pragma once

#include <cstdint>
#include <vector>

namespace pw::lynx {

// One MoE layer of one batch.
struct RemapInput {
  int layer = 0;                // for per-layer exemption
  int num_tokens = 0;           // T (the batch: one token per sequence in decode)
  int num_experts = 0;          // N
  int top_k = 0;                // k, 1 <= k <= N
  bool norm_topk_prob = false;  // the router renormalises its top-k weights to sum 1
  bool pure_decode = false;     // phase gate: only pure-decode batches are remapped
  const float* logits = nullptr;  // [T, N] router logits (pre-softmax)
  const float* probs = nullptr;   // [T, N] softmax of logits, or null (computed here); for a
                                  // sigmoid router, its unbiased scores, with `logits` the
                                  // selection scores it ranked by
  float weight_scale = 1.f;       // every gate weight's factor (routed_scaling_factor)
};

// One selected expert of a token.
struct RemapSlot {
  int32_t expert = 0;
  float weight = 0.f;      // gate weight (gate_weights.h)
  int16_t orig_rank = -1;  // its rank in the token's original top-k, -1 if it replaced one
};

// Per-call counts (what the decode worker exports and the benchmarks report).
struct RemapStats {
  bool applied = false;     // the rule ran (phase gate open, layer not exempt)
  int distinct_before = 0;  // |union of the tokens' original top-k|
  int distinct_after = 0;   // |union of the tokens' remapped top-k|
  int tokens_changed = 0;   // tokens whose set differs from their top-k
  int pairs_replaced = 0;   // (token, expert) pairs not in the token's top-k
};

struct RemapOutput {
  const RemapSlot* slots = nullptr;  // [T, k] token-major
  const uint8_t* changed = nullptr;  // [T] 1 when the token's set differs from its top-k
  RemapStats stats;
};

class BatchRemapper {
 public:
  virtual ~BatchRemapper() = default;
  // Sizes the buffers for batches up to max_tokens of num_experts experts, top_k each.
  virtual void Reserve(int max_tokens, int num_experts, int top_k) = 0;
  // Requires 1 <= top_k <= num_experts, num_tokens >= 0, logits non-null when num_tokens > 0.
  virtual const RemapOutput& Remap(const RemapInput& in) = 0;
};

}  // namespace pw::lynx
