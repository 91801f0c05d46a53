// RouterMetrics: the router's Prometheus metrics, declared once here.
//
// Names follow pagedweight_router_<what>_<unit>, and vLLM's name (vllm:<what>) wherever vLLM
// has the metric. Latencies are seconds:
//   requests_total{endpoint,code}   counter: finished HTTP requests by route and status code
//   request_success_total{finished_reason}  counter: completed generations by reason (stop,
//                                   length), as vllm:request_success_total
//   time_to_first_token_seconds     histogram: admission -> first token sent to the client
//   inter_token_latency_seconds     histogram: gap between consecutive tokens of one request
//   e2e_request_latency_seconds     histogram: admission -> last byte queued to the client
//   request_queue_time_seconds      histogram: admission -> handed to the backend (waiting for
//                                   a decode slot)
//   request_prompt_tokens / request_generation_tokens  histograms: per completed request
//   num_requests_running / num_requests_waiting  gauges: at the backend / in the admission queue
//   kv_cache_usage_perc             gauge: used / (used + free) KV blocks of the live decode
//                                   workers, 0..1 (computed when /metrics is read)
//   prompt_tokens_total, generation_tokens_total  counters
//   rejected_requests_total{reason} counter: 429 (queue_full, kv_queue_full), 400
//                                   (kv_capacity_exceeded), 503 (draining, no_workers)
//   backend_free_kv_blocks / backend_used_kv_blocks / backend_decode_workers gauges
//   backend_requests_replaced_total counter: requests placed again after a worker failure
//   kv_admission_blocks{state}      gauges: KV admission (kv_admission.h): capacity (what the
//                                   decode workers can hold), committed (candidates at the
//                                   backend), queued (candidates waiting), in KV blocks
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

namespace pw::router {

class RouterMetrics {
 public:
  explicit RouterMetrics(std::shared_ptr<prometheus::Registry> registry);

  // Counts one finished request (io thread).
  void CountRequest(const std::string& endpoint, int http_status);
  // Counts one completed generation: its finish reason and token counts.
  void CountSuccess(const std::string& finished_reason, int64_t prompt_tokens,
                    int64_t generation_tokens);
  // Prometheus text exposition format of the whole registry.
  std::string Serialize() const;

  prometheus::Histogram& ttft;
  prometheus::Histogram& itl;
  prometheus::Histogram& e2e;
  prometheus::Histogram& queue_time;
  prometheus::Gauge& running;
  prometheus::Gauge& waiting;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generation_tokens;
  prometheus::Family<prometheus::Counter>& rejected;
  prometheus::Gauge& free_kv_blocks;
  prometheus::Gauge& used_kv_blocks;
  prometheus::Gauge& decode_workers;
  prometheus::Counter& requests_replaced;
  prometheus::Family<prometheus::Gauge>& kv_admission;  // by state

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* success_;
  prometheus::Histogram* request_prompt_tokens_;
  prometheus::Histogram* request_generation_tokens_;
  prometheus::Gauge* kv_usage_;
};

}  // namespace pw::router
