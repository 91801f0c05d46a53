// Prometheus metrics of a prefill or decode worker (names pagedweight_*, units in names),
// served on /metrics by prometheus-cpp's Exposer when a bind address is given.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace pw::workers {

struct WorkerMetrics {
  // `bind` "127.0.0.1:9100" (port 0 = any free port); empty = no HTTP endpoint.
  static Result<std::unique_ptr<WorkerMetrics>> Create(const std::string& bind,
                                                       const std::string& worker_id);
  // Port /metrics listens on (0 without an endpoint).
  uint16_t port() const;

  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Gauge* kv_blocks_free = nullptr;
  prometheus::Gauge* kv_blocks_used = nullptr;
  prometheus::Gauge* kv_blocks_reserved = nullptr;
  prometheus::Gauge* requests_running = nullptr;
  prometheus::Gauge* requests_waiting = nullptr;
  prometheus::Counter* tokens_generated = nullptr;
  prometheus::Counter* prompt_tokens = nullptr;
  prometheus::Counter* ucx_put_bytes = nullptr;
  prometheus::Counter* ucx_get_bytes = nullptr;
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
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace pw::workers
