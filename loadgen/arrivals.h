// Arrivals: when each request of a benchmark starts and how long its prompt and output are.
//
// Two sources, each giving a list of PlannedRequest sorted by `at_s`:
//   - random arrivals (PlanRandomArrivals): gaps between starts drawn from a gamma distribution
//     with shape = burstiness and scale = 1 / (rate * burstiness), so the mean gap is 1 / rate
//     and the coefficient of variation is 1 / sqrt(burstiness) (burstiness 1 = Poisson, < 1 =
//     burstier), as `vllm bench serve` draws them. rate = inf: every request at t = 0. A linear
//     ramp-up moves the rate from start_rps to end_rps over the requests (request i uses
//     start + (end - start) * i / (n - 1), vLLM's definition);
//   - an Azure LLM inference trace CSV (LoadAzureTrace + PlanTrace): header
//     `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps "YYYY-MM-DD HH:MM:SS[.fffffff]";
//     arrival = (timestamp - first timestamp in the window) / speedup.
// Lengths are in tokens and at least 1.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/status.h"

namespace pw::loadgen {

struct PlannedRequest {
  double at_s = 0;         // start time, seconds after the benchmark's start
  int32_t input_len = 1;   // prompt tokens
  int32_t output_len = 1;  // max_tokens (exact with ignore_eos)
};

struct RandomArrivalOptions {
  int64_t num_prompts = 1000;
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s
  double burstiness = 1.0;                                        // gamma shape, > 0
  // Linear ramp-up: when ramp_end_rps > 0 the rate goes from ramp_start_rps to ramp_end_rps
  // over the requests and request_rate is not used.
  double ramp_start_rps = 0;
  double ramp_end_rps = 0;
  double duration_s = 0;  // > 0: no request starts at or after this time
  int32_t input_len = 1024;
  int32_t output_len = 128;
  // Lengths drawn uniformly in [len * (1 - ratio), len * (1 + ratio)] (vLLM's
  // --random-range-ratio), 0 = exact.
  double range_ratio = 0;
  uint64_t seed = 0;
};

// Checks the options (rates > 0, burstiness > 0, lengths >= 1, 0 <= ratio < 1).
Status ValidateRandomArrivals(const RandomArrivalOptions& o);
std::vector<PlannedRequest> PlanRandomArrivals(const RandomArrivalOptions& o);

// One row of an Azure trace.
struct TraceRow {
  double t_s = 0;  // the timestamp as seconds since 1970-01-01 00:00:00 (no time zone)
  int32_t context_tokens = 0;
  int32_t generated_tokens = 0;
};

// Parses the CSV. Errors name the file and the line: a missing or different header, a bad
// timestamp or count, timestamps going backwards.
Result<std::vector<TraceRow>> LoadAzureTrace(const std::string& path);
Result<std::vector<TraceRow>> ParseAzureTrace(const std::string& text, const std::string& name);

struct TraceOptions {
  double speedup = 1.0;       // arrival times divided by this
  double window_start_s = 0;  // rows with start <= (t - first row's t) < end, trace seconds
  double window_end_s = std::numeric_limits<double>::infinity();
  int32_t clip_context = 0;  // > 0: prompts longer than this are cut to it
  int32_t clip_output = 0;   // > 0: outputs longer than this are cut to it
  int64_t max_requests = 0;  // > 0: at most this many rows (from the window's start)
  double duration_s = 0;     // > 0: requests at or after this (scaled) time are dropped
};
Status ValidateTraceOptions(const TraceOptions& o);
// The window's rows as requests; arrivals relative to the window's first row.
std::vector<PlannedRequest> PlanTrace(const std::vector<TraceRow>& rows, const TraceOptions& o);

}  // namespace pw::loadgen
