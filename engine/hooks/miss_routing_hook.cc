#include "engine/hooks/miss_routing_hook.h"

#include <chrono>
#include <string>

namespace pw::engine {

Status MissRoutingHook::Rewrite(const RoutingContext& ctx, std::vector<ExpertAssignment>* assignments) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t T = static_cast<size_t>(ctx.num_tokens), E = static_cast<size_t>(ctx.num_experts);
  masses_.assign(T, 0.f);
  std::vector<ExpertAssignment>& a = *assignments;
  int32_t last_token = -1;
  for (size_t begin = 0; begin < a.size();) {
    const int32_t t = a[begin].token;
    if (t <= last_token || t < 0 || static_cast<size_t>(t) >= T) {
      return Internal("miss policy hook expects each token's assignments contiguous, in token order, in layer " +
                      std::to_string(ctx.layer));
    }
    last_token = t;
    size_t end = begin;
    while (end < a.size() && a[end].token == t) ++end;
    const size_t n = end - begin;
    slots_.resize(n);
    actions_.resize(n);
    for (size_t j = 0; j < n; ++j) slots_[j] = {a[begin + j].expert, a[begin + j].weight};
    // The policy ranks substitutes (and scores residency) by what the gate selects by: the
    // probabilities of a softmax gate; a sigmoid gate's scores plus its selection bias (finite:
    // a substitute may come from any group, and score-ema averages these values).
    const float* ranking = ctx.router_probs + static_cast<size_t>(t) * E;
    if (ctx.selection_bias != nullptr) {
      biased_.resize(E);
      for (size_t e = 0; e < E; ++e) biased_[e] = ranking[e] + ctx.selection_bias[e];
      ranking = biased_.data();
    }
    masses_[static_cast<size_t>(t)] = policy_->DecideToken(
        ctx.layer, slots_.data(), static_cast<int>(n), ranking, actions_.data());
    for (size_t j = 0; j < n; ++j) {
      if (actions_[j] == misses::SlotAction::kSubstituted) {
        a[begin + j].expert = slots_[j].expert;
        a[begin + j].rank = -1;
      }
    }
    begin = end;
  }
  Status s = Status::Ok();
  if (ctx.fetcher != nullptr) {
    for (const misses::CacheEvent& ev : policy_->events()) {
      switch (ev.kind) {
        case misses::CacheEvent::kFetch: s = ctx.fetcher->Fetch(ev.layer, ev.expert); break;
        case misses::CacheEvent::kAdmitRequest: s = ctx.fetcher->Admit(ev.layer, ev.expert); break;
        case misses::CacheEvent::kEvict: ctx.fetcher->Evict(ev.layer, ev.expert); break;
        case misses::CacheEvent::kAdmitted: break;
      }
      if (!s.ok()) break;
    }
  }
  policy_->ClearEvents();
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

}  // namespace pw::engine
