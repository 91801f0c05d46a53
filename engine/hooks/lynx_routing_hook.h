// LynxRoutingHook: runs a batch remap rule (policies/lynx: LYNX or the piggyback baseline) as
// the engine's routing hook (moe.h, seam (c)), and counts what it did.
//
// The rule sees the layer's router logits and probabilities and the phase flag (for a sigmoid
// gate: its selection scores in logit units, and its unbiased scores); when it
// applies, every token whose set changed gets its k new entries (rank = the expert's rank in
// the router's top-k, -1 for a replacement; weight per the rule's gate-weight option); other
// tokens' entries stay exactly as the router wrote them, so a remap that changes nothing (or a
// disabled hook) leaves the step bit-identical. It must run first in a hook chain: it expects
// the router's top-k, token-major (kInternal otherwise). Driving thread only; no allocation
// per call once the rule's buffers are reserved (Reserve).
#pragma once

#include <cstdint>
#include <vector>

#include "policies/lynx/batch_remapper.h"
#include "engine/experts/moe.h"

namespace pw::engine {

// Sums over the hook's calls (one call = one MoE layer of one batch).
struct LynxHookStats {
  int64_t calls = 0;               // calls with at least one token
  int64_t applied_calls = 0;       // ... where the rule ran (pure decode, layer not exempt)
  int64_t distinct_before = 0;     // sum over applied calls of |union of router top-k|
  int64_t distinct_after = 0;      // sum over applied calls of |union after the remap|
  int64_t tokens = 0;              // sum over applied calls of T
  int64_t tokens_changed = 0;      // tokens whose expert set changed
  int64_t pairs_replaced = 0;      // (token, expert) pairs not in the router's top-k
  double seconds = 0;              // wall time inside Rewrite (the remap's overhead)
};

class LynxRoutingHook final : public RoutingHook {
 public:
  // `remapper` is borrowed and must outlive the hook.
  explicit LynxRoutingHook(lynx::BatchRemapper* remapper) : remapper_(remapper) {}
  // Sizes the rule's buffers (batches up to max_tokens) so Rewrite does not allocate.
  void Reserve(int max_tokens, int num_experts, int top_k) {
    remapper_->Reserve(max_tokens, num_experts, top_k);
    selection_logits_.reserve(static_cast<size_t>(max_tokens) * static_cast<size_t>(num_experts));
  }
  Status Rewrite(const RoutingContext& ctx, std::vector<ExpertAssignment>* assignments) override;

  // A disabled hook returns at once (the router's choice runs).
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  const LynxHookStats& stats() const { return stats_; }
  void ResetStats() { stats_ = {}; }

 private:
  lynx::BatchRemapper* remapper_;
  std::vector<float> selection_logits_;  // [T, E] a sigmoid gate's selection, in logit units
  bool enabled_ = true;
  LynxHookStats stats_;
};

}  // namespace pw::engine
