// RunBenchmark: sends a planned list of requests at their times and collects what came back.
//
// The dispatcher (the calling thread) builds each request's body ahead of time, sleeps until its
// planned start (steady clock), waits for a free slot when --max-concurrency is reached, and
// hands it to the StreamClient. Warm-up requests (the first lengths of the plan, sent at once)
// run and finish before the timed part and are not recorded.
//
// A duration (`duration_s` > 0, --duration) bounds the timed part whatever the rate, inf
// included: no request is sent at or after duration_s (one the plan puts later, or one still
// waiting for a slot then, is not sent and not recorded); the requests in flight at duration_s
// may finish within `drain_s` more seconds, and those still in flight then are cancelled
// (their connections closed; recorded with error_kind "cancelled", counted apart from the
// failures). So the part lasts at most duration_s + drain_s (and a slot wait's wake-up). vLLM's
// `bench serve` has no duration and waits for every request it sent; with drain_s = inf this
// does the same. A progress thread prints a status
// line (sent, completed, failed, in flight, request and token rates over the last interval) to
// stderr each second on a terminal (every 10 s otherwise) unless quiet, and samples the same
// counters into the timeline every second.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "loadgen/arrivals.h"
#include "loadgen/bench_result.h"
#include "loadgen/prompt_source.h"
#include "loadgen/stream_client.h"

namespace pw::loadgen {

struct BenchmarkOptions {
  HttpTarget target;
  std::string model = "tiny-moe";
  bool chat = false;        // /v1/chat/completions body (messages) instead of a prompt
  bool ignore_eos = false;  // exact output lengths
  double temperature = 0;
  int64_t max_concurrency = 0;  // 0 = no limit
  int64_t num_warmups = 0;
  int io_threads = 2;
  std::chrono::milliseconds request_timeout{600000};
  bool keep_text = false;
  bool quiet = false;
  double duration_s = 0;  // > 0: the timed part's sending window, seconds (above)
  double drain_s = 30;    // with duration_s: how long requests in flight at its end may run on
  std::string label;  // printed at the start of the progress line (e.g. the sweep's rate)
  // How generated tokens are counted (stream_client.h); the request body asks the server for
  // what the counting needs (continuous usage stats, or log-probabilities).
  TokenCount token_count = TokenCount::kUsage;
  std::function<SteadyClock::time_point()> clock;  // StreamClient::Options::clock (tests)
};

struct BenchmarkRun {
  std::vector<RequestRecord> records;  // the timed requests that were sent, in plan order
  std::vector<TimelineSample> timeline;
  SteadyClock::time_point t0;  // the benchmark's start (records' times are relative to it)
  double duration_s = 0;       // first planned start -> last request finished
  int64_t max_in_flight = 0;
  bool interrupted = false;  // `stop` became true before the plan was sent
  int64_t cancelled = 0;     // requests in flight when the drain ended, cancelled
};

// The JSON body of one request (stream with usage, max_tokens = output_len), asking for what
// o.token_count needs: kUsage adds stream_options.continuous_usage_stats, kLogprobs
// log-probabilities of the chosen token ("logprobs": 1, or for chat "logprobs": true with
// "top_logprobs": 1 — llama-server sends none for 0). `probe` asks for both.
Result<std::string> BuildRequestBody(const BenchmarkOptions& o, const PromptSource& prompts,
                                     const PlannedRequest& p, uint64_t index, bool probe = false);

// --token-count auto: sends one request (the plan's first prompt, at most 16 output tokens)
// asking for continuous usage and log-probabilities, and picks kUsage when every event with a
// choice carried usage.completion_tokens, else kLogprobs when every event with text carried
// log-probabilities, else kChunks. `why` (may be null) gets a line saying what was seen. A
// probe that fails is an error (the server is not usable).
Result<TokenCount> DetectTokenCount(const BenchmarkOptions& o, const PromptSource& prompts,
                                    const PlannedRequest& p, std::string* why);

// `stop` (may be null): when it becomes true no further request is sent; what is in flight
// still finishes.
Result<BenchmarkRun> RunBenchmark(const std::vector<PlannedRequest>& plan,
                                  const PromptSource& prompts, const BenchmarkOptions& o,
                                  const std::atomic<bool>* stop = nullptr);

}  // namespace pw::loadgen
