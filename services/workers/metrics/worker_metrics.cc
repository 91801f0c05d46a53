#include "services/workers/metrics/worker_metrics.h"

#include <CivetServer.h>
#include <prometheus/text_serializer.h>

#include <exception>

namespace pw::workers {

// /metrics (the registry in Prometheus' text format) and /ready (the readiness WorkerMetrics
// holds), on civetweb as prometheus-cpp's Exposer serves /metrics: one server, one port.
class WorkerMetrics::Handler : public CivetHandler {
 public:
  enum class Kind { kMetrics, kReady };
  Handler(WorkerMetrics* m, Kind kind) : m_(m), kind_(kind) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    int code = 200;
    std::string type = "text/plain; charset=utf-8";
    std::string body;
    if (kind_ == Kind::kMetrics) {
      type = "text/plain; version=0.0.4; charset=utf-8";
      body = prometheus::TextSerializer().Serialize(m_->registry->Collect());
    } else {
      const std::string reason = m_->NotReadyReason();
      code = reason.empty() ? 200 : 503;
      body = (reason.empty() ? std::string("ready") : "not ready: " + reason) + "\n";
    }
    mg_printf(conn,
              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
              "Connection: close\r\n\r\n",
              code, code == 200 ? "OK" : "Service Unavailable", type.c_str(), body.size());
    mg_write(conn, body.data(), body.size());
    return true;
  }

 private:
  WorkerMetrics* m_;
  Kind kind_;
};

WorkerMetrics::~WorkerMetrics() { server_.reset(); }  // no handler runs past here

void WorkerMetrics::SetNotReady(const std::string& reason) {
  std::lock_guard<std::mutex> lock(ready_mu_);
  not_ready_ = reason;
}

std::string WorkerMetrics::NotReadyReason() const {
  std::lock_guard<std::mutex> lock(ready_mu_);
  return not_ready_;
}

Result<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(const std::string& bind,
                                                             const std::string& worker_id) {
  auto m = std::make_unique<WorkerMetrics>();
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
    try {
      m->metrics_handler_ = std::make_unique<Handler>(m.get(), Handler::Kind::kMetrics);
      m->ready_handler_ = std::make_unique<Handler>(m.get(), Handler::Kind::kReady);
      m->server_ = std::make_unique<CivetServer>(
          std::vector<std::string>{"listening_ports", bind, "num_threads", "2"});
      m->server_->addHandler("/metrics", m->metrics_handler_.get());
      m->server_->addHandler("/ready", m->ready_handler_.get());
    } catch (const std::exception& e) {
      return Unavailable("cannot serve /metrics on '" + bind + "': " + e.what());
    }
  }
  return m;
}

uint16_t WorkerMetrics::port() const {
  if (!server_) return 0;
  auto ports = server_->getListeningPorts();
  return ports.empty() ? 0 : static_cast<uint16_t>(ports[0]);
}

}  // namespace pw::workers
