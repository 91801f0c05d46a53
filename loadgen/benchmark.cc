#include "loadgen/benchmark.h"

#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

namespace pw::loadgen {

namespace {

constexpr uint64_t kWarmupBase = uint64_t{1} << 40;

double Seconds(SteadyClock::duration d) { return std::chrono::duration<double>(d).count(); }

// State shared by the dispatcher, the I/O threads' done callback and the progress thread.
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  int64_t in_flight = 0;
  int64_t max_in_flight = 0;
  int64_t sent = 0, completed = 0, failed = 0, cancelled = 0;
  int64_t warmups_left = 0;
  std::vector<RequestRecord>* records = nullptr;
  std::vector<PlannedRequest> const* plan = nullptr;
  SteadyClock::time_point t0;
  SteadyClock::time_point last_done;
  std::string warmup_error;
};

RequestRecord ToRecord(const StreamOutcome& o, const PlannedRequest& p,
                       SteadyClock::time_point t0) {
  RequestRecord r;
  r.scheduled_s = p.at_s;
  r.sent_s = Seconds(o.sent - t0);
  r.success = o.success;
  r.error_kind = o.error_kind;
  r.error = o.error;
  r.input_len = o.prompt_tokens >= 0 ? static_cast<int32_t>(o.prompt_tokens) : p.input_len;
  r.output_len = o.completion_tokens >= 0 ? static_cast<int32_t>(o.completion_tokens)
                                          : static_cast<int32_t>(o.token_times.size());
  r.latency_s = Seconds(o.done - o.sent);
  r.ttft_s = o.token_times.empty() ? r.latency_s : Seconds(o.token_times.front() - o.sent);
  // One gap per token after the first; tokens of one event are 0 apart.
  for (size_t i = 1; i < o.token_times.size(); ++i) {
    r.itl_s.push_back(Seconds(o.token_times[i] - o.token_times[i - 1]));
  }
  r.text = o.text;
  return r;
}

}  // namespace

Result<std::string> BuildRequestBody(const BenchmarkOptions& o, const PromptSource& prompts,
                                     const PlannedRequest& p, uint64_t index, bool probe) {
  nlohmann::json b;
  b["model"] = o.model;
  b["max_tokens"] = p.output_len;
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  if (probe || o.token_count == TokenCount::kUsage) {
    b["stream_options"]["continuous_usage_stats"] = true;
  }
  if (probe || o.token_count == TokenCount::kLogprobs) {
    if (o.chat) {
      b["logprobs"] = true;
      b["top_logprobs"] = 1;
    } else {
      b["logprobs"] = 1;
    }
  }
  b["temperature"] = o.temperature;
  if (o.ignore_eos) b["ignore_eos"] = true;
  if (o.chat) {
    PW_ASSIGN_OR_RETURN(std::string text, prompts.Text(p.input_len, index));
    b["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", text}}});
  } else {
    b["prompt"] = prompts.Tokens(p.input_len, index);
  }
  return b.dump();
}

Result<TokenCount> DetectTokenCount(const BenchmarkOptions& o, const PromptSource& prompts,
                                    const PlannedRequest& p, std::string* why) {
  PlannedRequest probe = p;
  probe.output_len = std::min<int32_t>(p.output_len, 16);
  PW_ASSIGN_OR_RETURN(std::string body, BuildRequestBody(o, prompts, probe, 0, /*probe=*/true));
  StreamClient::Options co;
  co.io_threads = 1;
  co.request_timeout = o.request_timeout;
  co.token_count = TokenCount::kChunks;  // counts nothing it could refuse
  co.clock = o.clock;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<StreamOutcome> got;
  StreamClient client(o.target, co, [&](StreamOutcome out) {
    std::lock_guard<std::mutex> lock(mu);
    got = std::move(out);
    cv.notify_all();
  });
  PW_RETURN_IF_ERROR(client.Start());
  client.Submit(0, std::move(body));
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return got.has_value(); });
  }
  client.Stop();
  const StreamOutcome& out = *got;
  if (!out.success) {
    return Unavailable("the token-count probe request failed (" + out.error_kind + ": " +
                       out.error + ")");
  }
  TokenCount c = TokenCount::kChunks;
  if (out.choice_events > 0 && out.usage_events == out.choice_events) {
    c = TokenCount::kUsage;
  } else if (out.logprob_events > 0 && out.text_events_without_logprobs == 0) {
    c = TokenCount::kLogprobs;
  }
  if (why) {
    *why = "token count: " + std::string(TokenCountName(c)) + " (probe: " +
           std::to_string(out.choice_events) + " events with a choice, " +
           std::to_string(out.usage_events) + " with usage, " +
           std::to_string(out.logprob_events) + " with log-probabilities, " +
           std::to_string(out.text_events_without_logprobs) + " with text without)";
  }
  return c;
}

Result<BenchmarkRun> RunBenchmark(const std::vector<PlannedRequest>& plan,
                                  const PromptSource& prompts, const BenchmarkOptions& o,
                                  const std::atomic<bool>* stop) {
  BenchmarkRun run;
  run.records.resize(plan.size());
  Shared sh;
  sh.records = &run.records;
  sh.plan = &plan;
  StreamClient::Options co;
  co.io_threads = o.io_threads;
  co.request_timeout = o.request_timeout;
  co.keep_text = o.keep_text;
  co.token_count = o.token_count;
  co.clock = o.clock;
  StreamClient client(o.target, co, [&](StreamOutcome out) {
    std::lock_guard<std::mutex> lock(sh.mu);
    --sh.in_flight;
    if (out.index >= kWarmupBase) {
      if (!out.success && sh.warmup_error.empty()) {
        sh.warmup_error = out.error_kind + ": " + out.error;
      }
      --sh.warmups_left;
    } else {
      (*sh.records)[out.index] = ToRecord(out, (*sh.plan)[out.index], sh.t0);
      if (out.success)
        ++sh.completed;
      else if (out.error_kind == "cancelled")  // only the client's Stop: the drain's end
        ++sh.cancelled;
      else
        ++sh.failed;
      if (out.done > sh.last_done) sh.last_done = out.done;
    }
    sh.cv.notify_all();
  });
  PW_RETURN_IF_ERROR(client.Start());

  auto acquire = [&]() {
    std::unique_lock<std::mutex> lock(sh.mu);
    sh.cv.wait(lock, [&] { return o.max_concurrency <= 0 || sh.in_flight < o.max_concurrency; });
    ++sh.in_flight;
    sh.max_in_flight = std::max(sh.max_in_flight, sh.in_flight);
  };

  // Warm-up: the plan's first lengths, all at once (bounded by the concurrency limit).
  if (o.num_warmups > 0 && !plan.empty()) {
    {
      std::lock_guard<std::mutex> lock(sh.mu);
      sh.warmups_left = o.num_warmups;
    }
    for (int64_t i = 0; i < o.num_warmups; ++i) {
      PW_ASSIGN_OR_RETURN(std::string body,
                          BuildRequestBody(o, prompts, plan[i % plan.size()], kWarmupBase + i));
      acquire();
      client.Submit(kWarmupBase + i, std::move(body));
    }
    std::unique_lock<std::mutex> lock(sh.mu);
    sh.cv.wait(lock, [&] { return sh.warmups_left == 0; });
    if (!sh.warmup_error.empty()) {
      lock.unlock();
      client.Stop();
      return Unavailable("a warm-up request failed (" + sh.warmup_error + ")");
    }
    sh.max_in_flight = 0;
  }

  const bool tty = isatty(STDERR_FILENO) == 1;
  std::mutex progress_mu;
  std::condition_variable progress_cv;
  bool progress_stop = false;
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    sh.t0 = SteadyClock::now();
    sh.last_done = sh.t0;
  }
  std::thread progress([&] {
    const auto t0 = sh.t0;
    int64_t last_completed = 0, last_tokens = 0;
    auto last_print = t0;
    int64_t tick = 0;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(progress_mu);
        if (progress_cv.wait_until(lock, t0 + std::chrono::seconds(tick + 1),
                                   [&] { return progress_stop; })) {
          break;
        }
      }
      ++tick;
      TimelineSample s;
      s.t_s = static_cast<double>(tick);
      {
        std::lock_guard<std::mutex> lock(sh.mu);
        s.sent = sh.sent;
        s.completed = sh.completed;
        s.failed = sh.failed;
        s.in_flight = sh.in_flight;
      }
      s.tokens = client.tokens_received();
      run.timeline.push_back(s);
      const auto now = SteadyClock::now();
      const double since = Seconds(now - last_print);
      if (o.quiet || (!tty && since < 9.99)) continue;
      const double req_rate = (s.completed - last_completed) / since;
      const double tok_rate = (s.tokens - last_tokens) / since;
      std::fprintf(stderr,
                   "%s%s[%6.1f s] sent %lld/%zu  completed %lld  failed %lld  in flight %lld  "
                   "| %.1f req/s  %.0f tok/s%s",
                   tty ? "\r\033[K" : "", o.label.c_str(), s.t_s, static_cast<long long>(s.sent),
                   plan.size(), static_cast<long long>(s.completed),
                   static_cast<long long>(s.failed), static_cast<long long>(s.in_flight), req_rate,
                   tok_rate, tty ? "" : "\n");
      std::fflush(stderr);
      last_print = now;
      last_completed = s.completed;
      last_tokens = s.tokens;
    }
    if (!o.quiet && tty) std::fprintf(stderr, "\n");
  });

  auto after = [&](double s) {
    return sh.t0 +
           std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(s));
  };
  const bool bounded = o.duration_s > 0;
  const SteadyClock::time_point send_end =
      bounded ? after(o.duration_s) : SteadyClock::time_point::max();
  // A slot before the duration's end (false: none came free in time, nothing taken).
  auto acquire_by_end = [&]() {
    std::unique_lock<std::mutex> lock(sh.mu);
    auto free = [&] { return o.max_concurrency <= 0 || sh.in_flight < o.max_concurrency; };
    if (!bounded) {
      sh.cv.wait(lock, free);
    } else if (!sh.cv.wait_until(lock, send_end, free) || SteadyClock::now() >= send_end) {
      return false;
    }
    ++sh.in_flight;
    sh.max_in_flight = std::max(sh.max_in_flight, sh.in_flight);
    return true;
  };
  size_t sent = 0;
  Status failure = Status::Ok();
  for (size_t i = 0; i < plan.size(); ++i) {
    if (stop && stop->load()) {
      run.interrupted = true;
      break;
    }
    if (bounded && plan[i].at_s >= o.duration_s) break;
    auto body = BuildRequestBody(o, prompts, plan[i], i);
    if (!body.ok()) {
      failure = body.status().WithContext("request " + std::to_string(i));
      break;
    }
    std::this_thread::sleep_until(after(plan[i].at_s));
    if (!acquire_by_end()) break;  // the duration ended while it waited for a slot
    {
      std::lock_guard<std::mutex> lock(sh.mu);
      ++sh.sent;
    }
    client.Submit(i, std::move(*body));
    ++sent;
  }
  {
    std::unique_lock<std::mutex> lock(sh.mu);
    auto all_back = [&] {
      return sh.completed + sh.failed + sh.cancelled == static_cast<int64_t>(sent);
    };
    if (bounded && std::isfinite(o.drain_s) &&
        !sh.cv.wait_until(lock,
                          send_end + std::chrono::duration_cast<SteadyClock::duration>(
                                         std::chrono::duration<double>(o.drain_s)),
                          all_back)) {
      // The drain is over: what is still in flight is cancelled (the client calls back for each,
      // error_kind "cancelled", before Stop returns).
      lock.unlock();
      client.Stop();
      lock.lock();
    }
    sh.cv.wait(lock, all_back);
    run.t0 = sh.t0;
    run.duration_s = Seconds(sh.last_done - sh.t0);
    run.max_in_flight = sh.max_in_flight;
    run.cancelled = sh.cancelled;
  }
  {
    std::lock_guard<std::mutex> lock(progress_mu);
    progress_stop = true;
  }
  progress_cv.notify_all();
  progress.join();
  client.Stop();
  PW_RETURN_IF_ERROR(failure);
  run.records.resize(sent);
  return run;
}

}  // namespace pw::loadgen
