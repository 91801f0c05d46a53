#include "loadgen/loadgen_cli.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "loadgen/arrivals.h"
#include "loadgen/bench_result.h"
#include "loadgen/benchmark.h"
#include "loadgen/prompt_source.h"

namespace pw::loadgen {

void AddFlags(CLI::App& app, CliOptions* o) {
  app.add_option("--base-url", o->base_url,
                 "server URL, http://HOST:PORT (default from --host/--port)");
  app.add_option("--host", o->host, "server host when --base-url is not given");
  app.add_option("--port", o->port, "server port when --base-url is not given");
  app.add_option("--endpoint", o->endpoint, "API path (/v1/completions or /v1/chat/completions)");
  app.add_option("--backend", o->backend, "openai, openai-chat or vllm (chat follows the endpoint)")
      ->check(CLI::IsMember({"openai", "openai-chat", "vllm"}));
  app.add_option("--model", o->model, "model name sent in each request");
  app.add_option("--tokenizer", o->tokenizer, "model directory with tokenizer.json (text prompts)");
  app.add_option("--dataset-name", o->dataset_name, "random (token ids) or text (--dataset-path)")
      ->check(CLI::IsMember({"random", "text"}));
  app.add_option("--dataset-path", o->dataset_path, "text file prompts are cut from");
  app.add_option(
      "--num-prompts", o->num_prompts,
      "requests to send (default 1000; with --duration or --trace and not given: no limit)");
  app.add_option("--random-input-len", o->random_input_len, "prompt tokens");
  app.add_option("--random-output-len", o->random_output_len, "output tokens (max_tokens)");
  app.add_option("--random-range-ratio", o->random_range_ratio,
                 "lengths uniform in [len*(1-r), len*(1+r)]");
  app.add_option("--random-token-min", o->random_token_min, "smallest token id of random prompts");
  app.add_option("--random-token-max", o->random_token_max,
                 "token ids of random prompts are below this");
  app.add_flag("--ignore-eos", o->ignore_eos, "generate exactly max_tokens (ignore_eos)");
  app.add_option("--temperature", o->temperature, "sampling temperature");
  app.add_option("--request-rate", o->request_rate, "requests per second, or inf (all at once)");
  app.add_option("--burstiness", o->burstiness,
                 "gamma shape of the gaps (1 = Poisson, < 1 burstier)");
  app.add_option("--max-concurrency", o->max_concurrency,
                 "requests in flight at most (0: no limit)");
  app.add_option("--ramp-up-strategy", o->ramp_up_strategy, "linear: rate from start to end rps")
      ->check(CLI::IsMember({"linear"}));
  app.add_option("--ramp-up-start-rps", o->ramp_up_start_rps, "ramp-up: first rate");
  app.add_option("--ramp-up-end-rps", o->ramp_up_end_rps, "ramp-up: last rate");
  app.add_option("--num-warmups", o->num_warmups,
                 "requests sent first and left out of the results");
  app.add_option("--seed", o->seed, "random seed (arrivals, lengths, prompts)");
  app.add_option("--trace", o->trace, "Azure LLM inference trace CSV to replay");
  app.add_option("--trace-speedup", o->trace_speedup, "trace times divided by this");
  app.add_option("--trace-window", o->trace_window, "START:END seconds of the trace to replay");
  app.add_option("--clip-context", o->clip_context,
                 "trace prompts cut to this many tokens (0: no)");
  app.add_option("--clip-output", o->clip_output, "trace outputs cut to this many tokens (0: no)");
  app.add_option("--duration", o->duration,
                 "seconds: no request is sent at or after this, whatever the rate (inf too)");
  app.add_option("--drain-timeout", o->drain_timeout,
                 "with --duration: seconds requests in flight at its end may still run; then "
                 "they are cancelled (default 30; inf: wait for all)");
  app.add_option("--sweep", o->sweep, "comma-separated request rates: one run and one row each");
  app.add_option("--goodput", o->goodput, "SLOs KEY:MS (ttft, tpot, e2el), e.g. ttft:500 tpot:50");
  app.add_option("--percentile-metrics", o->percentile_metrics, "of ttft,tpot,itl,e2el");
  app.add_option("--metric-percentiles", o->metric_percentiles, "e.g. 50,90,99");
  app.add_flag("--save-result", o->save_result, "write the result JSON");
  app.add_flag("--save-detailed", o->save_detailed, "also keep the generated texts in the JSON");
  app.add_option("--result-dir", o->result_dir, "directory of the result JSON");
  app.add_option("--result-filename", o->result_filename, "file name of the result JSON");
  app.add_flag("--quiet", o->quiet, "no progress line");
  app.add_option("--io-threads", o->io_threads, "client I/O threads")->check(CLI::Range(1, 64));
  app.add_option("--token-count", o->token_count,
                 "how output tokens are counted and timed: usage (continuous usage stats), "
                 "logprobs (one token per log-probability), chunks (one per event with text), "
                 "or auto (ask the server with one request first; default)")
      ->check(CLI::IsMember({"auto", "usage", "logprobs", "chunks"}));
  app.add_option("--request-timeout", o->request_timeout_s, "seconds per request")
      ->check(CLI::PositiveNumber);
}

namespace {

bool ParseRate(const std::string& s, double* out) {
  if (s == "inf" || s == "Inf" || s == "INF") {
    *out = std::numeric_limits<double>::infinity();
    return true;
  }
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return !s.empty() && *end == '\0' && *out > 0;
}

std::string Now(const char* fmt) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[64];
  std::strftime(b, sizeof(b), fmt, &tm);
  return b;
}

nlohmann::json RateJson(double r) {
  return std::isfinite(r) ? nlohmann::json(r) : nlohmann::json("inf");
}

void AddTimeline(const BenchmarkRun& run, nlohmann::json* out) {
  nlohmann::json t = nlohmann::json::array(), sent = t, done = t, failed = t, in_flight = t,
                 tokens = t;
  for (const auto& s : run.timeline) {
    t.push_back(s.t_s);
    sent.push_back(s.sent);
    done.push_back(s.completed);
    failed.push_back(s.failed);
    in_flight.push_back(s.in_flight);
    tokens.push_back(s.tokens);
  }
  (*out)["timeline"] = {{"t", t},           {"sent", sent},           {"completed", done},
                        {"failed", failed}, {"in_flight", in_flight}, {"output_tokens", tokens}};
}

int Fail(const std::string& m) {
  std::fprintf(stderr, "pw-loadgen: %s\n", m.c_str());
  return 2;
}

}  // namespace

int RunCli(const CliOptions& o, const std::atomic<bool>* stop) {
  BenchmarkOptions bo;
  {
    const std::string base =
        o.base_url.empty() ? "http://" + o.host + ":" + std::to_string(o.port) : o.base_url;
    auto target = ParseBaseUrl(base, o.endpoint);
    if (!target.ok()) return Fail(target.status().message());
    bo.target = *target;
  }
  bo.model = o.model;
  bo.chat = o.backend == "openai-chat" || o.endpoint.find("chat") != std::string::npos;
  bo.ignore_eos = o.ignore_eos;
  bo.temperature = o.temperature;
  bo.max_concurrency = o.max_concurrency;
  bo.num_warmups = o.num_warmups;
  bo.io_threads = o.io_threads;
  bo.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.request_timeout_s * 1000));
  bo.keep_text = o.save_detailed;
  bool token_count_pending = o.token_count == "auto";
  if (o.token_count == "usage") bo.token_count = TokenCount::kUsage;
  if (o.token_count == "logprobs") bo.token_count = TokenCount::kLogprobs;
  if (o.token_count == "chunks") bo.token_count = TokenCount::kChunks;
  bo.quiet = o.quiet;
  if (!(o.duration >= 0) || !std::isfinite(o.duration)) {
    return Fail("--duration must be a finite number of seconds >= 0");
  }
  if (!(o.drain_timeout >= 0)) return Fail("--drain-timeout must be >= 0 seconds (or inf)");
  if (o.drain_timeout_given && o.duration <= 0) {
    return Fail("--drain-timeout bounds the end of a --duration: give --duration");
  }
  bo.duration_s = o.duration;
  bo.drain_s = o.drain_timeout;
  if (o.max_concurrency < 0 || o.num_warmups < 0) {
    return Fail("--max-concurrency and --num-warmups must be >= 0");
  }
  SummaryOptions so;
  if (Status st = ParsePercentileOptions(o.percentile_metrics, o.metric_percentiles, &so);
      !st.ok()) {
    return Fail(st.message());
  }
  {
    auto slo = ParseGoodput(o.goodput);
    if (!slo.ok()) return Fail(slo.status().message());
    so.goodput = *slo;
  }

  // Prompts.
  std::shared_ptr<const Tokenizer> tok;
  if (!o.tokenizer.empty()) {
    auto t = Tokenizer::FromModelDir(o.tokenizer);
    if (!t.ok()) return Fail(t.status().ToString());
    tok = std::shared_ptr<const Tokenizer>(std::move(*t));
  }
  Result<PromptSource> prompts =
      o.dataset_name == "text"
          ? (o.dataset_path.empty()
                 ? Result<PromptSource>(InvalidArgument("--dataset-name text needs --dataset-path"))
                 : PromptSource::FromTextFile(o.dataset_path, tok, static_cast<uint64_t>(o.seed)))
          : PromptSource::RandomIds(o.random_token_min, o.random_token_max,
                                    static_cast<uint64_t>(o.seed), tok);
  if (!prompts.ok()) return Fail(prompts.status().ToString());
  if (bo.chat && !prompts->has_tokenizer()) {
    return Fail("chat requests carry text: give the model's tokenizer (--tokenizer DIR)");
  }

  // Arrival plans: one per rate (one rate unless --sweep).
  std::vector<double> rates;
  if (!o.sweep.empty()) {
    if (!o.trace.empty())
      return Fail("--sweep varies --request-rate; it does not apply to --trace");
    std::string cur;
    for (char c : o.sweep + ",") {
      if (c != ',') {
        cur += c;
        continue;
      }
      double r = 0;
      if (!ParseRate(cur, &r)) return Fail("--sweep: '" + cur + "' is not a rate > 0 or inf");
      rates.push_back(r);
      cur.clear();
    }
  } else {
    double r = 0;
    if (!ParseRate(o.request_rate, &r)) {
      return Fail("--request-rate '" + o.request_rate + "' is not a number > 0 or inf");
    }
    rates.push_back(r);
  }
  std::vector<TraceRow> trace_rows;
  TraceOptions to;
  if (!o.trace.empty()) {
    auto rows = LoadAzureTrace(o.trace);
    if (!rows.ok()) return Fail(rows.status().message());
    trace_rows = std::move(*rows);
    to.speedup = o.trace_speedup;
    to.clip_context = o.clip_context;
    to.clip_output = o.clip_output;
    to.duration_s = o.duration;
    to.max_requests = o.num_prompts_given ? o.num_prompts : 0;
    if (!o.trace_window.empty()) {
      const size_t colon = o.trace_window.find(':');
      char* e1 = nullptr;
      char* e2 = nullptr;
      const std::string a = o.trace_window.substr(0, colon);
      const std::string b = colon == std::string::npos ? "" : o.trace_window.substr(colon + 1);
      to.window_start_s = std::strtod(a.c_str(), &e1);
      to.window_end_s =
          b.empty() ? std::numeric_limits<double>::infinity() : std::strtod(b.c_str(), &e2);
      if (colon == std::string::npos || a.empty() || *e1 != '\0' || (e2 && *e2 != '\0')) {
        return Fail("--trace-window '" + o.trace_window +
                    "': want START:END in seconds (END may be empty)");
      }
    }
    if (Status st = ValidateTraceOptions(to); !st.ok()) return Fail(st.message());
  }

  nlohmann::json result_all;
  std::vector<nlohmann::json> sweep_rows;
  bool any_failed = false;
  if (rates.size() > 1) {
    std::printf(
        "| rate req/s | completed | failed | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms "
        "| TPOT p50 ms | TPOT p99 ms | ITL p50 ms | ITL p99 ms | goodput req/s |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    std::fflush(stdout);
  }
  for (double rate : rates) {
    if (stop && stop->load()) break;
    std::vector<PlannedRequest> plan;
    if (!o.trace.empty()) {
      plan = PlanTrace(trace_rows, to);
      if (plan.empty()) return Fail("--trace: no rows in the requested window");
    } else {
      RandomArrivalOptions ro;
      ro.num_prompts = o.duration > 0 && !o.num_prompts_given ? 0 : o.num_prompts;
      ro.request_rate = rate;
      ro.burstiness = o.burstiness;
      if (o.ramp_up_strategy == "linear") {
        ro.ramp_start_rps = o.ramp_up_start_rps;
        ro.ramp_end_rps = o.ramp_up_end_rps;
        if (ro.ramp_end_rps <= 0 || ro.ramp_start_rps <= 0) {
          return Fail(
              "--ramp-up-strategy linear needs --ramp-up-start-rps and --ramp-up-end-rps > 0");
        }
      } else if (o.ramp_up_start_rps > 0 || o.ramp_up_end_rps > 0) {
        return Fail("--ramp-up-start-rps/--ramp-up-end-rps need --ramp-up-strategy linear");
      }
      ro.duration_s = o.duration;
      ro.input_len = o.random_input_len;
      ro.output_len = o.random_output_len;
      ro.range_ratio = o.random_range_ratio;
      ro.seed = static_cast<uint64_t>(o.seed);
      if (Status st = ValidateRandomArrivals(ro); !st.ok()) return Fail(st.message());
      plan = PlanRandomArrivals(ro);
    }
    if (rates.size() > 1) {
      char label[64];
      std::snprintf(label, sizeof(label), "rate %g: ", rate);
      bo.label = label;
    }
    if (token_count_pending) {
      token_count_pending = false;
      std::string why;
      auto c = DetectTokenCount(bo, *prompts, plan.front(), &why);
      if (!c.ok()) {
        std::fprintf(stderr, "pw-loadgen: %s\n", c.status().ToString().c_str());
        return 1;
      }
      bo.token_count = *c;
      if (!o.quiet) std::fprintf(stderr, "pw-loadgen: %s\n", why.c_str());
    }
    auto run = RunBenchmark(plan, *prompts, bo, stop);
    if (!run.ok()) {
      std::fprintf(stderr, "pw-loadgen: %s\n", run.status().ToString().c_str());
      return 1;
    }
    nlohmann::json s = Summarize(run->records, run->duration_s, run->max_in_flight, so);
    s["date"] = Now("%Y%m%d-%H%M%S");
    s["backend"] = o.backend;
    s["endpoint_type"] = bo.chat ? "openai-chat" : "openai";
    s["token_count"] = TokenCountName(bo.token_count);
    s["model_id"] = o.model;
    s["tokenizer_id"] = o.tokenizer.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.tokenizer);
    s["num_prompts"] = static_cast<int64_t>(plan.size());
    s["request_rate"] = o.trace.empty() ? RateJson(rate) : nlohmann::json("trace");
    s["burstiness"] = o.burstiness;
    s["max_concurrency"] =
        o.max_concurrency > 0 ? nlohmann::json(o.max_concurrency) : nlohmann::json(nullptr);
    s["num_warmups"] = o.num_warmups;
    s["interrupted"] = run->interrupted;
    // Planned but not sent: past --duration (or interrupted).
    s["not_sent"] = static_cast<int64_t>(plan.size() - run->records.size());
    if (o.duration > 0) {
      s["duration_limit"] = o.duration;
      s["drain_timeout"] =
          std::isfinite(o.drain_timeout) ? nlohmann::json(o.drain_timeout) : nlohmann::json("inf");
    }
    if (!o.trace.empty()) {
      s["trace"] = {{"path", o.trace},
                    {"speedup", o.trace_speedup},
                    {"window", o.trace_window},
                    {"clip_context", o.clip_context},
                    {"clip_output", o.clip_output}};
    }
    if (o.ramp_up_strategy == "linear") {
      s["ramp_up_strategy"] = "linear";
      s["ramp_up_start_rps"] = o.ramp_up_start_rps;
      s["ramp_up_end_rps"] = o.ramp_up_end_rps;
    }
    if (so.goodput.any()) {
      s["goodput_slo_ms"] = {
          {"ttft", so.goodput.ttft_ms}, {"tpot", so.goodput.tpot_ms}, {"e2el", so.goodput.e2el_ms}};
    }
    if (!o.save_detailed) s.erase("generated_texts");
    AddTimeline(*run, &s);
    if (s["failed"].get<int64_t>() > 0) any_failed = true;
    if (rates.size() > 1) {
      auto g = [&](const char* k) { return s[k].get<double>(); };
      std::printf(
          "| %g | %lld | %lld | %.2f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %s |\n",
          rate, static_cast<long long>(s["completed"].get<int64_t>()),
          static_cast<long long>(s["failed"].get<int64_t>()), g("request_throughput"),
          g("output_throughput"), g("p50_ttft_ms"), g("p99_ttft_ms"), g("p50_tpot_ms"),
          g("p99_tpot_ms"), g("p50_itl_ms"), g("p99_itl_ms"),
          s["request_goodput"].is_null() ? "-" : std::to_string(g("request_goodput")).c_str());
      std::fflush(stdout);
      sweep_rows.push_back(std::move(s));
    } else {
      std::printf("%s", FormatTable(s, so).c_str());
      result_all = std::move(s);
    }
  }
  if (rates.size() > 1) {
    result_all = {{"date", Now("%Y%m%d-%H%M%S")},
                  {"backend", o.backend},
                  {"model_id", o.model},
                  {"burstiness", o.burstiness},
                  {"sweep", sweep_rows}};
  }
  if (o.save_result || !o.result_filename.empty()) {
    std::string name = o.result_filename;
    if (name.empty()) {
      const std::string r =
          rates.size() > 1 ? "sweep" : (std::isfinite(rates[0]) ? std::to_string(rates[0]) : "inf");
      name = "pw-" + (o.trace.empty() ? r + "qps" : std::string("trace")) + "-" + o.model + "-" +
             Now("%Y%m%d-%H%M%S") + ".json";
    }
    std::filesystem::path path = o.result_dir.empty() ? std::filesystem::path(name)
                                                      : std::filesystem::path(o.result_dir) / name;
    std::error_code ec;
    if (!o.result_dir.empty()) std::filesystem::create_directories(o.result_dir, ec);
    std::ofstream f(path);
    f << result_all.dump(2) << "\n";
    if (!f) return Fail("cannot write " + path.string());
    std::printf("result saved to %s\n", path.string().c_str());
  }
  return any_failed ? 1 : 0;
}

}  // namespace pw::loadgen
