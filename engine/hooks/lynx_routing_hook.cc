#include "engine/hooks/lynx_routing_hook.h"

#include <chrono>
#include <string>

namespace pw::engine {

Status LynxRoutingHook::Rewrite(const RoutingContext& ctx,
                                std::vector<ExpertAssignment>* assignments) {
  if (!enabled_ || ctx.num_tokens <= 0) return Status::Ok();
  const auto t0 = std::chrono::steady_clock::now();
  lynx::RemapInput in;
  in.layer = ctx.layer;
  in.num_tokens = ctx.num_tokens;
  in.num_experts = ctx.num_experts;
  in.top_k = ctx.top_k;
  in.norm_topk_prob = ctx.norm_topk_prob;
  in.pure_decode = ctx.pure_decode;
  // LYNX ranks and bins what the gate ranked by: the logits of a softmax gate (the same order
  // as its probabilities); for a sigmoid gate its biased, group-masked selection scores, in
  // logit units: times 4, the inverse of the sigmoid's slope at 0 (a power of two, so the order
  // is exactly the gate's). The weights come from the gate's scores (the unbiased sigmoid),
  // times its factor.
  if (ctx.gate == GateKind::kSoftmaxTopK) {
    in.logits = ctx.router_logits;
  } else {
    const size_t n = static_cast<size_t>(ctx.num_tokens) * static_cast<size_t>(ctx.num_experts);
    selection_logits_.resize(n);
    for (size_t i = 0; i < n; ++i) selection_logits_[i] = 4.f * ctx.selection_scores[i];
    in.logits = selection_logits_.data();
  }
  in.probs = ctx.router_probs;
  in.weight_scale = ctx.weight_scale;
  const lynx::RemapOutput& out = remapper_->Remap(in);
  stats_.calls++;
  if (out.stats.applied) {
    const size_t T = static_cast<size_t>(ctx.num_tokens), k = static_cast<size_t>(ctx.top_k);
    if (assignments->size() != T * k) {
      return Internal("LYNX hook expects the router's top-k (" + std::to_string(T * k) +
                      " assignments), got " + std::to_string(assignments->size()) + " in layer " +
                      std::to_string(ctx.layer));
    }
    for (size_t t = 0; t < T; ++t) {
      if (!out.changed[t]) continue;
      for (size_t j = 0; j < k; ++j) {
        ExpertAssignment& a = (*assignments)[t * k + j];
        if (a.token != static_cast<int32_t>(t)) {
          return Internal("LYNX hook expects token-major assignments in layer " +
                          std::to_string(ctx.layer));
        }
        const lynx::RemapSlot& s = out.slots[t * k + j];
        a.expert = s.expert;
        a.weight = s.weight;
        a.rank = s.orig_rank;
      }
    }
    stats_.applied_calls++;
    stats_.distinct_before += out.stats.distinct_before;
    stats_.distinct_after += out.stats.distinct_after;
    stats_.tokens += ctx.num_tokens;
    stats_.tokens_changed += out.stats.tokens_changed;
    stats_.pairs_replaced += out.stats.pairs_replaced;
  }
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::Ok();
}

}  // namespace pw::engine
