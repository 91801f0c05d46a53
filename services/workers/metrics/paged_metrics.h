// PagedMetrics: a decode worker's page pool and weight page table on /metrics, refreshed at
// every iteration boundary from the pool's counts and PagedWeights' running sums.
//
//   pagedweight_pool_pages{tenant="kv|weights|free"}          pages of the pool by tenant
//   pagedweight_pool_page_bytes                               bytes of one page
//   pagedweight_pool_balanced                                 1 while the pool's counts by
//                                                             tenant add up page by page and
//                                                             the weight table holds exactly
//                                                             the pool's weight pages
//   pagedweight_weight_bytes{bits="0|3|..|8"}                 page bytes of expert blocks
//                                                             committed at each width
//   pagedweight_committed_blocks_by_layer{layer, bits}        blocks per committed width
//   pagedweight_weight_changes_pending                        blocks whose desired width
//                                                             differs from the committed one
//   pagedweight_plans_applied_total                           plans received and applied
//   pagedweight_planes_moved_total{direction="raise|lower"}   planes made resident / released
//   pagedweight_plane_bytes_moved_total{direction}            bytes read from the store
//                                                             (raise) / page bytes released
//   pagedweight_weight_transitions_total{result="committed|failed"}
//   pagedweight_raise_seconds (histogram)                     submit to arrival of a raise
//   pagedweight_sync_fetches_total, pagedweight_sync_fetch_bytes_total
//                                                             blocks fetched synchronously
//                                                             because they were not resident
//   pagedweight_plane_mover_paced_total                       background gets held back while
//                                                             a synchronous fetch or a step
//                                                             ran (PagedWeightsOptions::pacing)
//   pagedweight_plane_mover_paced_seconds_total               time they were held back
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "memory/page_pool.h"
#include "services/workers/weights/paged_weights.h"

namespace pw::workers {

class PagedMetrics {
 public:
  static std::unique_ptr<PagedMetrics> Register(prometheus::Registry& registry,
                                                const std::string& worker_id, int num_layers);
  // The pool's counts; with `weights`, the table's widths and what its sums gained.
  void Export(const memory::PagePool& pool, PagedWeights* weights);
  prometheus::Counter* plans_applied = nullptr;

 private:
  prometheus::Family<prometheus::Gauge>* pool_pages_ = nullptr;
  prometheus::Gauge* page_bytes_ = nullptr;
  prometheus::Gauge* balanced_ = nullptr;
  prometheus::Family<prometheus::Gauge>* weight_bytes_ = nullptr;
  prometheus::Family<prometheus::Gauge>* by_layer_ = nullptr;
  prometheus::Family<prometheus::Gauge>* mean_bits_ = nullptr;  // per layer, and layer="all"
  prometheus::Gauge* pending_ = nullptr;
  prometheus::Counter* planes_raised_ = nullptr;
  prometheus::Counter* planes_lowered_ = nullptr;
  prometheus::Counter* bytes_raised_ = nullptr;
  prometheus::Counter* bytes_released_ = nullptr;
  prometheus::Counter* committed_ = nullptr;
  prometheus::Counter* failed_ = nullptr;
  prometheus::Histogram* raise_seconds_ = nullptr;
  prometheus::Counter* sync_fetches_ = nullptr;
  prometheus::Counter* sync_fetch_bytes_ = nullptr;
  prometheus::Counter* paced_ = nullptr;
  prometheus::Counter* paced_seconds_ = nullptr;
  PlaneMover::PacingStats last_pacing_;
  std::string worker_id_;
  int num_layers_ = 0;
  PagedWeightsStats last_;
};

}  // namespace pw::workers
