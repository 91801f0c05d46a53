#include "services/workers/metrics/paged_metrics.h"

namespace pw::workers {

std::unique_ptr<PagedMetrics> PagedMetrics::Register(prometheus::Registry& r,
                                                     const std::string& worker_id, int num_layers) {
  auto m = std::make_unique<PagedMetrics>();
  m->worker_id_ = worker_id;
  m->num_layers_ = num_layers;
  const prometheus::Labels w = {{"worker", worker_id}};
  m->pool_pages_ = &prometheus::BuildGauge().Name("pagedweight_pool_pages")
                        .Help("Pages of the decode worker's page pool by tenant").Register(r);
  m->page_bytes_ = &prometheus::BuildGauge().Name("pagedweight_pool_page_bytes")
                        .Help("Bytes of one page of the pool").Register(r).Add(w);
  m->balanced_ = &prometheus::BuildGauge().Name("pagedweight_pool_balanced")
                      .Help("1 while the page pool's accounting balances to the page").Register(r).Add(w);
  m->weight_bytes_ = &prometheus::BuildGauge().Name("pagedweight_weight_bytes")
                          .Help("Page bytes of expert blocks committed at each width").Register(r);
  m->by_layer_ = &prometheus::BuildGauge().Name("pagedweight_committed_blocks_by_layer")
                      .Help("Expert blocks per committed width and layer").Register(r);
  m->mean_bits_ = &prometheus::BuildGauge().Name("pagedweight_committed_width_mean")
                       .Help("Mean committed width of the expert blocks, per layer and layer=\"all\"").Register(r);
  m->pending_ = &prometheus::BuildGauge().Name("pagedweight_weight_changes_pending")
                     .Help("Expert blocks whose desired width differs from the committed one")
                     .Register(r).Add(w);
  m->plans_applied = &prometheus::BuildCounter().Name("pagedweight_plans_applied_total")
                          .Help("Plans received from the broker and applied").Register(r).Add(w);
  auto& moved = prometheus::BuildCounter().Name("pagedweight_planes_moved_total")
                    .Help("Bit-planes made resident (raise) or released (lower)").Register(r);
  m->planes_raised_ = &moved.Add({{"worker", worker_id}, {"direction", "raise"}});
  m->planes_lowered_ = &moved.Add({{"worker", worker_id}, {"direction", "lower"}});
  auto& bytes = prometheus::BuildCounter().Name("pagedweight_plane_bytes_moved_total")
                    .Help("Bytes read from the store by raises, page bytes released by lowers")
                    .Register(r);
  m->bytes_raised_ = &bytes.Add({{"worker", worker_id}, {"direction", "raise"}});
  m->bytes_released_ = &bytes.Add({{"worker", worker_id}, {"direction", "lower"}});
  auto& tr = prometheus::BuildCounter().Name("pagedweight_weight_transitions_total")
                 .Help("Expert block width changes by result").Register(r);
  m->committed_ = &tr.Add({{"worker", worker_id}, {"result", "committed"}});
  m->failed_ = &tr.Add({{"worker", worker_id}, {"result", "failed"}});
  m->raise_seconds_ = &prometheus::BuildHistogram().Name("pagedweight_raise_seconds")
                           .Help("Time from starting a block's transition to its arrival")
                           .Register(r)
                           .Add(w, prometheus::Histogram::BucketBoundaries{0.001, 0.002, 0.005, 0.01, 0.02,
                                                                          0.05, 0.1, 0.2, 0.5, 1, 2, 5});
  m->sync_fetches_ = &prometheus::BuildCounter().Name("pagedweight_sync_fetches_total")
                          .Help("Expert blocks fetched synchronously (not resident when routed)")
                          .Register(r).Add(w);
  m->sync_fetch_bytes_ = &prometheus::BuildCounter().Name("pagedweight_sync_fetch_bytes_total")
                              .Help("Bytes of synchronous fetches").Register(r).Add(w);
  m->paced_ = &prometheus::BuildCounter().Name("pagedweight_plane_mover_paced_total")
                   .Help("Background plane gets held back while a synchronous fetch or an engine step ran")
                   .Register(r).Add(w);
  m->paced_seconds_ = &prometheus::BuildCounter().Name("pagedweight_plane_mover_paced_seconds_total")
                           .Help("Time background plane gets were held back by pacing")
                           .Register(r).Add(w);
  return m;
}

void PagedMetrics::Export(const memory::PagePool& pool, PagedWeights* weights) {
  for (auto t : {memory::Tenant::kKv, memory::Tenant::kWeights, memory::Tenant::kFree}) {
    pool_pages_->Add({{"worker", worker_id_}, {"tenant", memory::TenantName(t)}}).Set(pool.Count(t));
  }
  page_bytes_->Set(static_cast<double>(pool.page_bytes()));
  const bool table_ok = weights == nullptr || weights->table().pages_held() == pool.Count(memory::Tenant::kWeights);
  balanced_->Set(pool.Balanced() && table_ok ? 1 : 0);
  if (weights == nullptr) return;
  const auto& table = weights->table();
  const std::vector<uint64_t> bytes = table.CommittedPageBytes();
  for (int b : {0, 3, 4, 5, 6, 7, 8}) {
    weight_bytes_->Add({{"worker", worker_id_}, {"bits", std::to_string(b)}}).Set(static_cast<double>(bytes[b]));
  }
  double all_bits = 0;
  for (int l = 0; l < table.num_layers(); ++l) {
    int count[9] = {};
    for (int e = 0; e < table.num_experts(); ++e) {
      count[table.entry(table.Index(l, e, ExpertProj::kGateUp)).committed]++;
      count[table.entry(table.Index(l, e, ExpertProj::kDown)).committed]++;
    }
    for (int b : {0, 3, 4, 5, 6, 7, 8}) {
      by_layer_->Add({{"worker", worker_id_}, {"layer", std::to_string(l)}, {"bits", std::to_string(b)}})
          .Set(count[b]);
    }
    double bits = 0;
    for (int b = 0; b <= 8; ++b) bits += b * count[b];
    all_bits += bits;
    mean_bits_->Add({{"worker", worker_id_}, {"layer", std::to_string(l)}})
        .Set(table.num_experts() > 0 ? bits / (2.0 * table.num_experts()) : 0);
  }
  mean_bits_->Add({{"worker", worker_id_}, {"layer", "all"}})
      .Set(table.num_blocks() > 0 ? all_bits / table.num_blocks() : 0);
  pending_->Set(weights->pending());
  const PagedWeightsStats& s = weights->stats();
  planes_raised_->Increment(static_cast<double>(s.planes_raised - last_.planes_raised));
  planes_lowered_->Increment(static_cast<double>(s.planes_lowered - last_.planes_lowered));
  bytes_raised_->Increment(static_cast<double>(s.bytes_raised - last_.bytes_raised));
  bytes_released_->Increment(static_cast<double>(s.bytes_released - last_.bytes_released));
  committed_->Increment(static_cast<double>(s.transitions_committed - last_.transitions_committed));
  failed_->Increment(static_cast<double>(s.transitions_failed - last_.transitions_failed));
  sync_fetches_->Increment(static_cast<double>(s.sync_fetches - last_.sync_fetches));
  sync_fetch_bytes_->Increment(static_cast<double>(s.sync_fetch_bytes - last_.sync_fetch_bytes));
  for (double v : weights->TakeRaiseSeconds()) raise_seconds_->Observe(v);
  const PlaneMover::PacingStats p = weights->pacing();
  paced_->Increment(static_cast<double>(p.waits - last_pacing_.waits));
  paced_seconds_->Increment(static_cast<double>(p.wait_us - last_pacing_.wait_us) * 1e-6);
  last_pacing_ = p;
  last_ = s;
}

}  // namespace pw::workers
