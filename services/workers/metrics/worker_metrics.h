// Prometheus metrics of a prefill or decode worker (names pagedweight_*, units in names),
// served on /metrics when a bind address is given, and beside them the worker's readiness on
// /ready: 200 "ready" once the worker has said so (registered with the router, its weights
// resident), 503 with the reason until then and whenever it says otherwise (a Kubernetes
// readinessProbe), and /live from the worker's main-loop beat (services/common/main_loop_beat.h:
// the startup and liveness probes). /metrics answers from the start, before the weights load.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "memory/kv_blocks.h"
#include "services/common/main_loop_beat.h"
#include "services/common/metrics_http.h"

namespace pw::workers {

struct WorkerMetrics {
  // `bind` "127.0.0.1:9100" (port 0 = any free port); empty = no HTTP endpoint.
  // `main_loop_stale_ms`: /live fails once the beat is this old.
  static Result<std::unique_ptr<WorkerMetrics>> Create(const std::string& bind,
                                                       const std::string& worker_id,
                                                       int64_t main_loop_stale_ms = service::kDefaultMainLoopStaleMs);
  ~WorkerMetrics();
  // Port /metrics, /ready and /live listen on (0 without an endpoint).
  uint16_t port() const;

  // What /ready answers: not ready with `reason` (e.g. "loading weights", "not registered with
  // the router"), or ready. Not ready ("starting") from Create on. Any thread.
  void SetNotReady(const std::string& reason);
  void SetReady() { SetNotReady(""); }
  // "" when ready.
  std::string NotReadyReason() const;

  std::shared_ptr<prometheus::Registry> registry;
  // The worker's main loop (its Run) beats this on every iteration: /live.
  std::unique_ptr<service::MainLoopBeat> beat;
  prometheus::Gauge* kv_blocks_free = nullptr;
  prometheus::Gauge* kv_blocks_used = nullptr;
  prometheus::Gauge* kv_blocks_reserved = nullptr;
  // KV pages held, by the kind of their layer (memory/kv_spec.h): sliding-window layers give
  // the pages behind each sequence's window back, so theirs stay bounded in a long stream.
  // The others hold their pages in every used block (a recurrent state several). SetKvPages.
  prometheus::Gauge* kv_pages_full = nullptr;
  prometheus::Gauge* kv_pages_sliding = nullptr;
  prometheus::Gauge* kv_pages_latent = nullptr;
  prometheus::Gauge* kv_pages_state = nullptr;
  // Sets the kv_pages gauges of every kind from `pool`, read on the thread that owns it (the
  // decode worker's main loop, the prefill worker's compute thread); the gauges are any-thread.
  void SetKvPages(const memory::KvBlockPool& pool);
  prometheus::Gauge* requests_running = nullptr;
  prometheus::Gauge* requests_waiting = nullptr;
  prometheus::Counter* tokens_generated = nullptr;
  prometheus::Counter* prompt_tokens = nullptr;
  prometheus::Counter* ucx_put_bytes = nullptr;
  prometheus::Counter* ucx_get_bytes = nullptr;
  // Prefill: KV bytes put into decode workers' pools, by the UCX transports of the endpoint
  // (pagedweight_kv_transfer_bytes_total{transport="tcp"}). Any thread.
  prometheus::Counter& KvTransferBytes(const std::string& transport);
  prometheus::Counter* preemptions = nullptr;
  prometheus::Counter* leases_expired = nullptr;
  // Decode: reservations held for a lowering (reserve_wait.h), and how the hold ended.
  prometheus::Counter* reserve_held = nullptr;
  prometheus::Counter* reserve_held_fit = nullptr;
  prometheus::Counter* reserve_held_waited_out = nullptr;
  prometheus::Counter* requests_finished_ok = nullptr;
  prometheus::Counter* requests_finished_error = nullptr;
  prometheus::Counter* requests_cancelled = nullptr;
  prometheus::Gauge* frames_dropped = nullptr;  // malformed + wrong version + unregistered
  // Prefill worker (as vllm:request_queue_time_seconds / vllm:request_prefill_time_seconds):
  // PrefillRequest received -> admitted to a forward pass, and admitted -> KV written.
  prometheus::Histogram* request_queue_time = nullptr;
  prometheus::Histogram* request_prefill_time = nullptr;

 private:
  std::string worker_id_;
  prometheus::Family<prometheus::Counter>* kv_transfer_bytes_ = nullptr;
  mutable std::mutex ready_mu_;
  std::string not_ready_ = "starting";  // guarded by ready_mu_; "" = ready
  std::unique_ptr<service::MetricsHttp> http_;  // declared last: stopped first
};

}  // namespace pw::workers
