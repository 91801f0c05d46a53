// The results of one benchmark run: per-request records in, the summary `vllm bench serve`
// writes out (same keys), plus ours.
//
// Per successful request (output_len = completion tokens from the stream's usage, else the
// number of tokens counted; tokens are counted and timed as stream_client.h says: every token
// of one event at that event's arrival):
//   TTFT  = first token's arrival - request sent
//   ITL   = every gap between consecutive tokens (0 between tokens of one event)
//   TPOT  = (E2EL - TTFT) / (output_len - 1), requests with output_len >= 2
//   E2EL  = last byte of the response - request sent
// Statistics per metric: mean, median, std (population), and the requested percentiles with
// linear interpolation between order statistics (numpy's default), all in milliseconds:
// keys mean_<m>_ms, median_<m>_ms, std_<m>_ms, p<P>_<m>_ms (P printed like vLLM: 99, 99.9).
// Throughputs divide by the benchmark duration (first request sent -> last one finished).
// Goodput (request_goodput) counts successful requests meeting every given SLO (ms).
// `failed` counts unsuccessful requests but those cancelled at the end of a duration's drain
// (error_kind "cancelled", benchmark.h), which are `cancelled`; neither enters the statistics.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace pw::loadgen {

struct RequestRecord {
  double scheduled_s = 0;  // planned start, seconds after the benchmark's start
  double sent_s = 0;       // actual send, same clock
  bool success = false;
  std::string error_kind;  // see StreamOutcome
  std::string error;
  int32_t input_len = 0;   // prompt tokens sent
  int32_t output_len = 0;  // tokens generated
  double ttft_s = 0;
  double latency_s = 0;
  std::vector<double> itl_s;
  std::string text;
};

// One sample per progress tick.
struct TimelineSample {
  double t_s = 0;
  int64_t sent = 0, completed = 0, failed = 0, in_flight = 0;
  int64_t tokens = 0;  // output tokens counted so far (StreamClient's token count)
};

struct SloSpec {
  // <= 0: no SLO on that metric.
  double ttft_ms = 0, tpot_ms = 0, e2el_ms = 0;
  bool any() const { return ttft_ms > 0 || tpot_ms > 0 || e2el_ms > 0; }
};
// Parses vLLM's --goodput values: "ttft:500", "tpot:50", "e2el:2000" (ms), one per item.
Result<SloSpec> ParseGoodput(const std::vector<std::string>& items);

struct SummaryOptions {
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};  // of ttft tpot itl e2el
  std::vector<double> percentiles = {99};
  SloSpec goodput;
};
// Parses "--percentile-metrics ttft,tpot,itl" and "--metric-percentiles 25,50,99".
Status ParsePercentileOptions(const std::string& metrics, const std::string& percentiles,
                              SummaryOptions* out);

// Linear-interpolation percentile of `v` (q in [0, 100]); 0 for an empty list.
double Percentile(std::vector<double> v, double q);
// vLLM's key spelling of a percentile: 99 -> "99", 99.9 -> "99.9".
std::string PercentileKey(double q);

// The summary (vLLM's keys and ours) of `records`. `duration_s` as above.
nlohmann::json Summarize(const std::vector<RequestRecord>& records, double duration_s,
                         int64_t max_in_flight, const SummaryOptions& opts);
// vLLM's human-readable table of a summary.
std::string FormatTable(const nlohmann::json& summary, const SummaryOptions& opts);

}  // namespace pw::loadgen
