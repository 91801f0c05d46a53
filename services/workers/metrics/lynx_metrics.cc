#include "services/workers/metrics/lynx_metrics.h"

namespace pw::workers {

std::unique_ptr<LynxMetrics> LynxMetrics::Register(prometheus::Registry& r,
                                                   const std::string& worker_id) {
  auto m = std::make_unique<LynxMetrics>();
  const std::map<std::string, std::string> id{{"worker", worker_id}};
  m->layer_calls = &prometheus::BuildCounter().Name("pagedweight_lynx_layer_calls_total")
                        .Help("MoE layer calls of decode batches the LYNX remap ran on")
                        .Register(r).Add(id);
  auto& distinct = prometheus::BuildCounter().Name("pagedweight_lynx_distinct_experts_total")
                       .Help("Distinct experts of remapped layer calls, summed, before/after the remap")
                       .Register(r);
  m->distinct_before = &distinct.Add({{"worker", worker_id}, {"stage", "before"}});
  m->distinct_after = &distinct.Add({{"worker", worker_id}, {"stage", "after"}});
  auto& tokens = prometheus::BuildCounter().Name("pagedweight_lynx_tokens_total")
                     .Help("Tokens of remapped layer calls: seen, and changed (expert set differs)")
                     .Register(r);
  m->tokens_seen = &tokens.Add({{"worker", worker_id}, {"state", "seen"}});
  m->tokens_changed = &tokens.Add({{"worker", worker_id}, {"state", "changed"}});
  m->assignments_remapped =
      &prometheus::BuildCounter().Name("pagedweight_lynx_remapped_assignments_total")
           .Help("(token, expert) pairs the remap put outside the token's router top-k")
           .Register(r).Add(id);
  m->remap_seconds = &prometheus::BuildCounter().Name("pagedweight_lynx_remap_seconds_total")
                          .Help("Time spent in the LYNX routing hook").Register(r).Add(id);
  return m;
}

void LynxMetrics::Export(const engine::LynxHookStats& now) {
  layer_calls->Increment(static_cast<double>(now.applied_calls - last_.applied_calls));
  distinct_before->Increment(static_cast<double>(now.distinct_before - last_.distinct_before));
  distinct_after->Increment(static_cast<double>(now.distinct_after - last_.distinct_after));
  tokens_seen->Increment(static_cast<double>(now.tokens - last_.tokens));
  tokens_changed->Increment(static_cast<double>(now.tokens_changed - last_.tokens_changed));
  assignments_remapped->Increment(static_cast<double>(now.pairs_replaced - last_.pairs_replaced));
  remap_seconds->Increment(now.seconds - last_.seconds);
  last_ = now;
}

}  // namespace pw::workers
