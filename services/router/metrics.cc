#include "services/router/metrics.h"

#include <prometheus/text_serializer.h>

namespace pw::router {

namespace {

using prometheus::Histogram;

Histogram::BucketBoundaries LatencyBuckets() {
  // 100 us .. 82 s: a decode step of a small model takes well under a millisecond.
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,  0.02,  0.04,  0.08,
          0.16,   0.32,    0.64,   1.28,  2.56,   5.12,  10.24, 20.48, 40.96, 81.92};
}

Histogram::BucketBoundaries TokenBuckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000};
}

template <typename Builder>
auto& Make(Builder b, const char* name, const char* help, prometheus::Registry& r) {
  return b.Name(name).Help(help).Register(r);
}

}  // namespace

RouterMetrics::RouterMetrics(std::shared_ptr<prometheus::Registry> registry)
    : ttft(Make(prometheus::BuildHistogram(), "pagedweight_router_time_to_first_token_seconds",
                "Time from admission to the first token sent to the client", *registry)
               .Add({}, LatencyBuckets())),
      itl(Make(prometheus::BuildHistogram(), "pagedweight_router_inter_token_latency_seconds",
               "Gap between consecutive tokens streamed for one request", *registry)
              .Add({}, LatencyBuckets())),
      e2e(Make(prometheus::BuildHistogram(), "pagedweight_router_e2e_request_latency_seconds",
               "Time from admission to the end of the response", *registry)
              .Add({}, LatencyBuckets())),
      queue_time(Make(prometheus::BuildHistogram(), "pagedweight_router_request_queue_time_seconds",
                      "Time from admission to the hand-over to the workers", *registry)
                     .Add({}, LatencyBuckets())),
      running(Make(prometheus::BuildGauge(), "pagedweight_router_num_requests_running",
                   "Requests submitted to the workers and not finished", *registry)
                  .Add({})),
      waiting(Make(prometheus::BuildGauge(), "pagedweight_router_num_requests_waiting",
                   "Requests admitted and queued at the router", *registry)
                  .Add({})),
      prompt_tokens(Make(prometheus::BuildCounter(), "pagedweight_router_prompt_tokens_total",
                         "Prompt tokens of admitted requests", *registry)
                        .Add({})),
      generation_tokens(Make(prometheus::BuildCounter(),
                             "pagedweight_router_generation_tokens_total",
                             "Tokens generated and received from the workers", *registry)
                            .Add({})),
      rejected(Make(prometheus::BuildCounter(), "pagedweight_router_rejected_requests_total",
                    "Requests refused by admission, by reason", *registry)),
      free_kv_blocks(Make(prometheus::BuildGauge(), "pagedweight_router_backend_free_kv_blocks",
                          "Free KV blocks over live decode workers (last heartbeats)", *registry)
                         .Add({})),
      used_kv_blocks(Make(prometheus::BuildGauge(), "pagedweight_router_backend_used_kv_blocks",
                          "Used KV blocks over live decode workers (last heartbeats)", *registry)
                         .Add({})),
      decode_workers(Make(prometheus::BuildGauge(), "pagedweight_router_backend_decode_workers",
                          "Live decode workers registered with the router", *registry)
                         .Add({})),
      requests_replaced(
          Make(prometheus::BuildCounter(), "pagedweight_router_backend_requests_replaced_total",
               "Requests placed again on other workers after a worker failure", *registry)
              .Add({})),
      kv_admission(Make(prometheus::BuildGauge(), "pagedweight_router_kv_admission_blocks",
                        "KV admission: blocks the decode workers can hold (capacity), of "
                        "candidates at the workers (committed) and waiting (queued)",
                        *registry)),
      registry_(std::move(registry)),
      requests_(&Make(prometheus::BuildCounter(), "pagedweight_router_requests_total",
                      "Finished HTTP requests by endpoint and status code", *registry_)),
      success_(&Make(prometheus::BuildCounter(), "pagedweight_router_request_success_total",
                     "Completed generations by finish reason", *registry_)),
      request_prompt_tokens_(&Make(prometheus::BuildHistogram(),
                                   "pagedweight_router_request_prompt_tokens",
                                   "Prompt tokens of each completed request", *registry_)
                                  .Add({}, TokenBuckets())),
      request_generation_tokens_(&Make(prometheus::BuildHistogram(),
                                       "pagedweight_router_request_generation_tokens",
                                       "Generated tokens of each completed request", *registry_)
                                      .Add({}, TokenBuckets())),
      kv_usage_(&Make(prometheus::BuildGauge(), "pagedweight_router_kv_cache_usage_perc",
                      "Fraction of the live decode workers' KV blocks in use (0..1)", *registry_)
                     .Add({})) {}

void RouterMetrics::CountSuccess(const std::string& finished_reason, int64_t prompt_tokens,
                                 int64_t generation_tokens) {
  success_->Add({{"finished_reason", finished_reason}}).Increment();
  request_prompt_tokens_->Observe(static_cast<double>(prompt_tokens));
  request_generation_tokens_->Observe(static_cast<double>(generation_tokens));
}

void RouterMetrics::CountRequest(const std::string& endpoint, int http_status) {
  requests_->Add({{"endpoint", endpoint}, {"code", std::to_string(http_status)}}).Increment();
}

std::string RouterMetrics::Serialize() const {
  const double used = used_kv_blocks.Value(), total = used + free_kv_blocks.Value();
  kv_usage_->Set(total > 0 ? used / total : 0.0);
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace pw::router
