// ResidencyMetrics: a decode worker's expert residency budget (paged_residency.h) on /metrics,
// refreshed at every iteration boundary from the policy's MissStats and the residency's sums.
//
//   pagedweight_expert_selections_total{result="hit|miss"}    selected experts resident or not
//   pagedweight_expert_misses_total{action="fetched|substituted"}
//                                                             how each miss was served
//   pagedweight_substituted_gate_mass_total                 sum over (token, layer) of the
//                                                             substituted gate mass m
//   pagedweight_expert_token_layers_total                     (token, layer) pairs decided
//                                                             (mean m = the two divided)
//   pagedweight_expert_fetches_total{path="pages|scratch"}    synchronous expert fetches: into
//                                                             pool pages, or left to the
//                                                             provider's scratch path
//   pagedweight_expert_fetch_bytes_total                      bytes fetched into pool pages
//   pagedweight_expert_fetch_seconds (histogram)              one expert's synchronous fetch
//   pagedweight_expert_fetch_phase_seconds{phase="get|check|table"} (histogram)
//                                                             where a fetch into pages spent
//                                                             it: UCX gets, checksums and LUT
//                                                             quantization, page-table work
//   pagedweight_step_fetch_wait_seconds (histogram)           per step that fetched, its time
//                                                             waiting on synchronous fetches
//   pagedweight_expert_admissions_total{state="started|committed"}
//                                                             background admissions
//   pagedweight_expert_evictions_total                        experts evicted
//   pagedweight_experts_resident                              experts resident (the policy's)
//   pagedweight_experts_resident_capacity                     the budget: experts resident per
//                                                             MoE layer times the layers
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "services/workers/weights/paged_residency.h"

namespace pw::workers {

class ResidencyMetrics {
 public:
  static std::unique_ptr<ResidencyMetrics> Register(prometheus::Registry& registry,
                                                    const std::string& worker_id);
  // Adds what the sums gained since the last call; sets the gauges.
  void Export(PagedResidency& residency);

 private:
  prometheus::Counter *hits_ = nullptr, *misses_ = nullptr;
  prometheus::Counter *fetched_ = nullptr, *substituted_ = nullptr;
  prometheus::Counter *mass_ = nullptr, *token_layers_ = nullptr;
  prometheus::Counter *fetch_pages_ = nullptr, *fetch_scratch_ = nullptr, *fetch_bytes_ = nullptr;
  prometheus::Histogram* fetch_seconds_ = nullptr;
  prometheus::Histogram *phase_get_ = nullptr, *phase_check_ = nullptr, *phase_table_ = nullptr;
  prometheus::Histogram* step_wait_ = nullptr;
  prometheus::Counter *admit_started_ = nullptr, *admit_committed_ = nullptr;
  prometheus::Counter* evictions_ = nullptr;
  prometheus::Gauge *resident_ = nullptr, *capacity_ = nullptr;
  misses::MissStats last_policy_;
  ResidencyStats last_;
};

}  // namespace pw::workers
