// LynxMetrics: the decode worker's LYNX counters (pagedweight_lynx_*), fed from the routing
// hook's running sums (engine/hooks/lynx_routing_hook.h) after each engine step.
//
//   pagedweight_lynx_layer_calls_total                 MoE layer calls the remap ran on (pure
//                                                      decode, layer not exempt, >= 2 tokens)
//   pagedweight_lynx_distinct_experts_total{stage}     sum over those calls of the distinct
//                                                      experts of the batch, stage="before" (the
//                                                      router's top-k) or "after" (the remap's);
//                                                      mean per call = rate(..) / rate(calls)
//   pagedweight_lynx_tokens_total{state}               tokens of those calls, state="seen" or
//                                                      "changed" (their expert set changed)
//   pagedweight_lynx_remapped_assignments_total        (token, expert) pairs not in the
//                                                      token's router top-k
//   pagedweight_lynx_remap_seconds_total               time inside the hook
#pragma once

#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "engine/hooks/lynx_routing_hook.h"

namespace pw::workers {

class LynxMetrics {
 public:
  static std::unique_ptr<LynxMetrics> Register(prometheus::Registry& registry,
                                               const std::string& worker_id);
  // Adds what `now` (the hook's sums) gained since the last call.
  void Export(const engine::LynxHookStats& now);

  prometheus::Counter* layer_calls = nullptr;
  prometheus::Counter* distinct_before = nullptr;
  prometheus::Counter* distinct_after = nullptr;
  prometheus::Counter* tokens_seen = nullptr;
  prometheus::Counter* tokens_changed = nullptr;
  prometheus::Counter* assignments_remapped = nullptr;
  prometheus::Counter* remap_seconds = nullptr;

 private:
  engine::LynxHookStats last_;
};

}  // namespace pw::workers
