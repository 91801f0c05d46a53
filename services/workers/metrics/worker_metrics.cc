#include "services/workers/metrics/worker_metrics.h"

namespace pw::workers {

WorkerMetrics::~WorkerMetrics() { http_.reset(); }  // no handler runs past here

void WorkerMetrics::SetNotReady(const std::string& reason) {
  std::lock_guard<std::mutex> lock(ready_mu_);
  not_ready_ = reason;
}

void WorkerMetrics::SetKvPages(const memory::KvBlockPool& pool) {
  // Pages by the kind of their layer: every allocated block holds its pages of a layer (a
  // recurrent state's several), except a sliding layer's released ones, which are counted
  // (LayerPagesInUse walks the blocks: only for those layers, this runs every loop).
  int64_t by_kind[4] = {};
  for (size_t l = 0; l < pool.specs().size(); ++l) {
    const int layer = static_cast<int>(l);
    by_kind[static_cast<size_t>(pool.specs()[l].kind)] +=
        pool.specs()[l].kind == memory::KvKind::kSlidingWindow
            ? pool.LayerPagesInUse(layer)
            : static_cast<int64_t>(pool.num_used()) * pool.LayerPages(layer);
  }
  const auto set = [&](prometheus::Gauge* g, memory::KvKind kind) {
    g->Set(static_cast<double>(by_kind[static_cast<size_t>(kind)]));
  };
  set(kv_pages_full, memory::KvKind::kFullAttention);
  set(kv_pages_sliding, memory::KvKind::kSlidingWindow);
  set(kv_pages_latent, memory::KvKind::kLatent);
  set(kv_pages_state, memory::KvKind::kRecurrentState);
}

std::string WorkerMetrics::NotReadyReason() const {
  std::lock_guard<std::mutex> lock(ready_mu_);
  return not_ready_;
}

Result<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(const std::string& bind,
                                                             const std::string& worker_id,
                                                             int64_t main_loop_stale_ms) {
  auto m = std::make_unique<WorkerMetrics>();
  m->beat = std::make_unique<service::MainLoopBeat>(main_loop_stale_ms);
  m->registry = std::make_shared<prometheus::Registry>();
  auto& r = *m->registry;
  const std::map<std::string, std::string> id{{"worker", worker_id}};
  auto& kv = prometheus::BuildGauge().Name("pagedweight_kv_blocks")
                 .Help("KV blocks of this worker's pool by state").Register(r);
  m->kv_blocks_free = &kv.Add({{"worker", worker_id}, {"state", "free"}});
  m->kv_blocks_used = &kv.Add({{"worker", worker_id}, {"state", "used"}});
  m->kv_blocks_reserved = &kv.Add({{"worker", worker_id}, {"state", "reserved"}});
  auto& pages = prometheus::BuildGauge().Name("pagedweight_kv_pages")
                    .Help("KV pages held by this worker's pool, by the kind of their layer")
                    .Register(r);
  m->kv_pages_full = &pages.Add({{"worker", worker_id}, {"kind", "full_attention"}});
  m->kv_pages_sliding = &pages.Add({{"worker", worker_id}, {"kind", "sliding_window"}});
  m->kv_pages_latent = &pages.Add({{"worker", worker_id}, {"kind", "latent"}});
  m->kv_pages_state = &pages.Add({{"worker", worker_id}, {"kind", "recurrent_state"}});
  m->requests_running = &prometheus::BuildGauge().Name("pagedweight_worker_num_requests_running")
                             .Help("Requests in the running batch").Register(r).Add(id);
  m->requests_waiting = &prometheus::BuildGauge().Name("pagedweight_worker_num_requests_waiting")
                             .Help("Requests queued (prefill) or leased (decode)")
                             .Register(r).Add(id);
  m->tokens_generated = &prometheus::BuildCounter().Name("pagedweight_worker_generation_tokens_total")
                             .Help("Output tokens generated").Register(r).Add(id);
  m->prompt_tokens = &prometheus::BuildCounter().Name("pagedweight_worker_prompt_tokens_total")
                          .Help("Prompt tokens prefilled").Register(r).Add(id);
  auto& ucx = prometheus::BuildCounter().Name("pagedweight_ucx_bytes_total")
                  .Help("Bytes moved over UCX by this process").Register(r);
  m->ucx_put_bytes = &ucx.Add({{"worker", worker_id}, {"op", "put"}});
  m->ucx_get_bytes = &ucx.Add({{"worker", worker_id}, {"op", "get"}});
  m->worker_id_ = worker_id;
  m->kv_transfer_bytes_ = &prometheus::BuildCounter().Name("pagedweight_kv_transfer_bytes_total")
                               .Help("KV bytes put into decode workers' pools, by UCX transport")
                               .Register(r);
  m->preemptions = &prometheus::BuildCounter().Name("pagedweight_worker_num_preemptions_total")
                        .Help("Sequences preempted for lack of KV blocks").Register(r).Add(id);
  m->leases_expired = &prometheus::BuildCounter().Name("pagedweight_kv_leases_expired_total")
                           .Help("KV reservations freed by their lease timeout")
                           .Register(r).Add(id);
  auto& held = prometheus::BuildCounter().Name("pagedweight_kv_reservations_held_total")
                   .Help("KV reservations held for a lowering of expert widths: held, then fit or waited_out")
                   .Register(r);
  m->reserve_held = &held.Add({{"worker", worker_id}, {"outcome", "held"}});
  m->reserve_held_fit = &held.Add({{"worker", worker_id}, {"outcome", "fit"}});
  m->reserve_held_waited_out = &held.Add({{"worker", worker_id}, {"outcome", "waited_out"}});
  auto& fin = prometheus::BuildCounter().Name("pagedweight_worker_requests_total")
                  .Help("Requests that ended on this worker, by status").Register(r);
  m->requests_finished_ok = &fin.Add({{"worker", worker_id}, {"status", "ok"}});
  m->requests_finished_error = &fin.Add({{"worker", worker_id}, {"status", "error"}});
  m->requests_cancelled = &fin.Add({{"worker", worker_id}, {"status", "cancelled"}});
  m->frames_dropped = &prometheus::BuildGauge().Name("pagedweight_control_frames_dropped")
                           .Help("Control frames refused (malformed, wrong version, unregistered)")
                           .Register(r).Add(id);
  const prometheus::Histogram::BucketBoundaries seconds = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24};
  m->request_queue_time = &prometheus::BuildHistogram()
                               .Name("pagedweight_worker_request_queue_time_seconds")
                               .Help("Prefill: request received -> admitted to a forward pass")
                               .Register(r).Add(id, seconds);
  m->request_prefill_time = &prometheus::BuildHistogram()
                                 .Name("pagedweight_worker_request_prefill_time_seconds")
                                 .Help("Prefill: admitted -> KV written to the decode worker")
                                 .Register(r).Add(id, seconds);
  if (!bind.empty()) {
    WorkerMetrics* self = m.get();
    auto ready = [self] {
      const std::string reason = self->NotReadyReason();
      return service::MetricsHttp::Reply{reason.empty() ? 200 : 503,
                                         (reason.empty() ? std::string("ready") : "not ready: " + reason) + "\n"};
    };
    PW_ASSIGN_OR_RETURN(m->http_, service::MetricsHttp::Create(bind, m->registry, m->beat.get(), {{"/ready", ready}}));
  }
  return m;
}

prometheus::Counter& WorkerMetrics::KvTransferBytes(const std::string& transport) {
  return kv_transfer_bytes_->Add({{"worker", worker_id_}, {"transport", transport}});
}

uint16_t WorkerMetrics::port() const { return http_ ? http_->port() : 0; }

}  // namespace pw::workers
