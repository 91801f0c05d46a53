// pw-loadgen counts and times tokens, not events: a scripted streaming server on loopback sends
// events of several tokens, an event for a token without text, and a token that got no event of
// its own, at times it sets on the client's clock (StreamClient::Options::clock) before each
// event, waiting for the client to read it before the next. So every time the client records
// is known exactly and TTFT, ITL, TPOT and E2EL must equal the values derived from the script
// (no wall time is measured). Checked for each way of counting (usage, logprobs, chunks), for
// the request bodies each asks the server for, for the probe that picks one (auto), and for
// the protocol errors when a server does not send what the counting needs.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "loadgen/bench_result.h"
#include "loadgen/benchmark.h"
#include "loadgen/prompt_source.h"

namespace pw::loadgen {
namespace {

using std::chrono::milliseconds;

// The client's clock: what the server last set; counts the client's reads.
class ScriptClock {
 public:
  SteadyClock::time_point Now() {
    reads_.fetch_add(1);
    return SteadyClock::time_point(std::chrono::nanoseconds(ns_.load()));
  }
  void Set(double ms) { ns_.store(static_cast<int64_t>(ms * 1e6)); }
  int64_t reads() const { return reads_.load(); }

 private:
  std::atomic<int64_t> ns_{0};
  std::atomic<int64_t> reads_{0};
};

struct ScriptEvent {
  double t_ms;       // the client's clock while it reads this event
  std::string data;  // the SSE payload after "data: "
};

// Serves every request on a connection with the same script: the 200 header, then each event
// (clock set first; the next one waits until the client read this one), then [DONE]. Records
// each request's JSON body.
class ScriptedServer {
 public:
  ScriptedServer(ScriptClock* clock, std::vector<ScriptEvent> script, double done_ms)
      : clock_(clock), script_(std::move(script)), done_ms_(done_ms) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd_, 16);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~ScriptedServer() {
    stop_.store(true);
    thread_.join();
    close(fd_);
  }
  uint16_t port() const { return port_; }
  std::vector<nlohmann::json> bodies() {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }
  std::string failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

 private:
  void Run() {
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      const int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      Serve(c);
      close(c);
    }
  }
  bool SendAll(int c, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = send(c, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  static std::string Chunk(const std::string& d) {
    char h[32];
    std::snprintf(h, sizeof(h), "%zx\r\n", d.size());
    return h + d + "\r\n";
  }
  // Sets the clock, sends `bytes`, and waits (generous deadline) until the client read its
  // clock again: it has the bytes, timed at `t_ms`.
  bool Step(int c, double t_ms, const std::string& bytes) {
    clock_->Set(t_ms);
    const int64_t before = clock_->reads();
    if (!SendAll(c, bytes)) return false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (clock_->reads() == before) {
      if (std::chrono::steady_clock::now() > until) {
        std::lock_guard<std::mutex> lock(mu_);
        failure_ = "the client did not read the event at " + std::to_string(t_ms) + " ms";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return true;
  }
  void Serve(int c) {
    std::string buf;
    char tmp[65536];
    while (!stop_.load()) {
      size_t head_end;
      while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
        pollfd p{c, POLLIN, 0};
        if (poll(&p, 1, 20) <= 0) {
          if (stop_.load()) return;
          continue;
        }
        const ssize_t n = recv(c, tmp, sizeof(tmp), 0);
        if (n <= 0) return;
        buf.append(tmp, static_cast<size_t>(n));
      }
      const std::string head = buf.substr(0, head_end);
      size_t cl = 0;
      if (size_t p = head.find("Content-Length: "); p != std::string::npos) {
        cl = std::stoul(head.substr(p + 16));
      }
      while (buf.size() < head_end + 4 + cl) {
        const ssize_t n = recv(c, tmp, sizeof(tmp), 0);
        if (n <= 0) return;
        buf.append(tmp, static_cast<size_t>(n));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        bodies_.push_back(nlohmann::json::parse(buf.substr(head_end + 4, cl), nullptr, false));
      }
      buf.erase(0, head_end + 4 + cl);
      std::string header =
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
          "chunked\r\n\r\n";
      for (const ScriptEvent& e : script_) {
        if (!Step(c, e.t_ms, header + Chunk("data: " + e.data + "\n\n"))) return;
        header.clear();
      }
      if (!Step(c, done_ms_, header + Chunk("data: [DONE]\n\n") + "0\r\n\r\n")) return;
    }
  }

  ScriptClock* clock_;
  std::vector<ScriptEvent> script_;
  double done_ms_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<nlohmann::json> bodies_;
  std::string failure_;
};

// The script (completions): 6 tokens in 4 events with choices, then the usage event.
//   100 ms: 3 tokens, text "ab"
//   130 ms: 1 token that decodes to no text (an empty event, as vLLM sends it)
//   150 ms: 2 tokens, text "c": one of them had no event of its own (a server that skips
//           tokens without text)
//   200 ms: the finish event, no token
//   210 ms: the usage event; [DONE] at 220 ms (the response's last byte: E2EL).
// With usage: every event with a choice carries the running completion_tokens. With logprobs:
// each carries one log-probability entry per token (`shape`: "tokens" for OpenAI completions,
// "content" for chat and llama-server).
enum class Carry { kUsage, kLogprobs, kNothing };
std::vector<ScriptEvent> Script(Carry carry, const std::string& shape = "tokens") {
  struct Step {
    double t;
    int tokens;
    std::string text;
    const char* finish;
  };
  const Step steps[] = {{100, 3, "ab", nullptr},
                        {130, 1, "", nullptr},
                        {150, 2, "c", nullptr},
                        {200, 0, "", "length"}};
  std::vector<ScriptEvent> out;
  int total = 0;
  for (const Step& s : steps) {
    total += s.tokens;
    nlohmann::json choice = {{"index", 0}, {"text", s.text}};
    choice["finish_reason"] = s.finish ? nlohmann::json(s.finish) : nlohmann::json(nullptr);
    choice["logprobs"] = nullptr;
    if (carry == Carry::kLogprobs && s.tokens > 0) {
      nlohmann::json entries = nlohmann::json::array();
      for (int k = 0; k < s.tokens; ++k) {
        entries.push_back(shape == "tokens" ? nlohmann::json("t")
                                            : nlohmann::json{{"token", "t"}, {"logprob", -0.5}});
      }
      choice["logprobs"] = {{shape, entries}};
    }
    nlohmann::json e = {{"choices", nlohmann::json::array({choice})}};
    if (carry == Carry::kUsage) {
      e["usage"] = {
          {"prompt_tokens", 8}, {"completion_tokens", total}, {"total_tokens", 8 + total}};
    } else {
      e["usage"] = nullptr;
    }
    out.push_back({s.t, e.dump()});
  }
  out.push_back(
      {210, nlohmann::json{{"choices", nlohmann::json::array()},
                           {"usage", {{"prompt_tokens", 8}, {"completion_tokens", total}}}}
                .dump()});
  return out;
}

struct Outcome {
  Result<BenchmarkRun> run = Internal("not run");
  std::vector<nlohmann::json> bodies;
  std::string server_failure;
};

Outcome RunOne(Carry carry, TokenCount count, const std::string& shape = "tokens") {
  ScriptClock clock;
  ScriptedServer server(&clock, Script(carry, shape), 220);
  BenchmarkOptions o;
  o.target.host = "127.0.0.1";
  o.target.port = server.port();
  o.quiet = true;
  o.ignore_eos = true;
  o.io_threads = 1;
  o.token_count = count;
  o.request_timeout = milliseconds(60000);
  o.clock = [&clock] { return clock.Now(); };
  auto prompts = PromptSource::RandomIds(16, 4000, 1, nullptr);
  EXPECT_TRUE(prompts.ok());
  std::vector<PlannedRequest> plan(1);
  plan[0].input_len = 8;
  plan[0].output_len = 6;
  Outcome out;
  out.run = RunBenchmark(plan, *prompts, o);
  out.bodies = server.bodies();
  out.server_failure = server.failure();
  return out;
}

constexpr double kMs = 1e-3;

// The values the script defines when every token is timed by its event.
void ExpectExactTokenTiming(const RequestRecord& r) {
  EXPECT_TRUE(r.success) << r.error_kind << ": " << r.error;
  EXPECT_EQ(r.output_len, 6);
  EXPECT_NEAR(r.ttft_s, 100 * kMs, 1e-12);
  EXPECT_NEAR(r.latency_s, 220 * kMs, 1e-12);
  const std::vector<double> itl = {0, 0, 30 * kMs, 20 * kMs, 0};
  ASSERT_EQ(r.itl_s.size(), itl.size());
  for (size_t i = 0; i < itl.size(); ++i) EXPECT_NEAR(r.itl_s[i], itl[i], 1e-12) << "gap " << i;
}

void ExpectSummary(const std::vector<RequestRecord>& records, double itl_mean_ms) {
  const auto s = Summarize(records, 1.0, 1, SummaryOptions{});
  EXPECT_NEAR(s["mean_ttft_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(s["mean_tpot_ms"].get<double>(), (220.0 - 100.0) / (6 - 1), 1e-9);  // 24 ms
  EXPECT_NEAR(s["mean_itl_ms"].get<double>(), itl_mean_ms, 1e-9);
  EXPECT_NEAR(s["mean_e2el_ms"].get<double>(), 220, 1e-9);
  EXPECT_EQ(s["total_output_tokens"], 6);
}

TEST(TokenCount, ContinuousUsageTimesEveryToken) {
  Outcome o = RunOne(Carry::kUsage, TokenCount::kUsage);
  ASSERT_EQ(o.server_failure, "");
  ASSERT_TRUE(o.run.ok()) << o.run.status().ToString();
  ASSERT_EQ(o.run->records.size(), 1u);
  ExpectExactTokenTiming(o.run->records[0]);
  ExpectSummary(o.run->records, 50.0 / 5);  // gaps 0 0 30 20 0
  ASSERT_EQ(o.bodies.size(), 1u);
  EXPECT_EQ(o.bodies[0]["stream_options"]["include_usage"], true);
  EXPECT_EQ(o.bodies[0]["stream_options"]["continuous_usage_stats"], true);
  EXPECT_FALSE(o.bodies[0].contains("logprobs"));
}

TEST(TokenCount, LogprobEntriesTimeEveryTokenInBothShapes) {
  for (const std::string shape : {"tokens", "content"}) {
    SCOPED_TRACE(shape);
    Outcome o = RunOne(Carry::kLogprobs, TokenCount::kLogprobs, shape);
    ASSERT_EQ(o.server_failure, "");
    ASSERT_TRUE(o.run.ok()) << o.run.status().ToString();
    ExpectExactTokenTiming(o.run->records[0]);
    ExpectSummary(o.run->records, 50.0 / 5);
    ASSERT_EQ(o.bodies.size(), 1u);
    EXPECT_EQ(o.bodies[0]["logprobs"], 1);
    EXPECT_FALSE(o.bodies[0]["stream_options"].contains("continuous_usage_stats"));
  }
}

TEST(TokenCount, ChunksCountOnlyEventsWithText) {
  // What a client that counts text events sees in the same stream: 2 "tokens" (100 and 150
  // ms); the output length still comes from the final usage, so TPOT is right, ITL is not.
  Outcome o = RunOne(Carry::kUsage, TokenCount::kChunks);
  ASSERT_TRUE(o.run.ok()) << o.run.status().ToString();
  const RequestRecord& r = o.run->records[0];
  EXPECT_TRUE(r.success);
  EXPECT_EQ(r.output_len, 6);
  EXPECT_NEAR(r.ttft_s, 100 * kMs, 1e-12);
  ASSERT_EQ(r.itl_s.size(), 1u);
  EXPECT_NEAR(r.itl_s[0], 50 * kMs, 1e-12);
  EXPECT_FALSE(o.bodies[0]["stream_options"].contains("continuous_usage_stats"));
  EXPECT_FALSE(o.bodies[0].contains("logprobs"));
}

TEST(TokenCount, AServerWithoutWhatTheCountingNeedsFailsTheRequestSayingSo) {
  Outcome usage = RunOne(Carry::kLogprobs, TokenCount::kUsage);
  ASSERT_TRUE(usage.run.ok());
  EXPECT_FALSE(usage.run->records[0].success);
  EXPECT_EQ(usage.run->records[0].error_kind, "protocol");
  EXPECT_NE(usage.run->records[0].error.find("continuous usage"), std::string::npos)
      << usage.run->records[0].error;
  Outcome lps = RunOne(Carry::kUsage, TokenCount::kLogprobs);
  ASSERT_TRUE(lps.run.ok());
  EXPECT_FALSE(lps.run->records[0].success);
  EXPECT_NE(lps.run->records[0].error.find("no log-probabilities"), std::string::npos)
      << lps.run->records[0].error;
}

TEST(TokenCount, TheProbePicksUsageThenLogprobsThenChunks) {
  const struct {
    Carry carry;
    TokenCount want;
  } cases[] = {{Carry::kUsage, TokenCount::kUsage},
               {Carry::kLogprobs, TokenCount::kLogprobs},
               {Carry::kNothing, TokenCount::kChunks}};
  for (const auto& c : cases) {
    SCOPED_TRACE(TokenCountName(c.want));
    ScriptClock clock;
    ScriptedServer server(&clock, Script(c.carry), 220);
    BenchmarkOptions o;
    o.target.port = server.port();
    o.io_threads = 1;
    o.clock = [&clock] { return clock.Now(); };
    auto prompts = PromptSource::RandomIds(16, 4000, 1, nullptr);
    PlannedRequest p;
    p.input_len = 8;
    p.output_len = 64;
    std::string why;
    auto got = DetectTokenCount(o, *prompts, p, &why);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, c.want) << why;
    const auto bodies = server.bodies();
    ASSERT_EQ(bodies.size(), 1u);
    EXPECT_EQ(bodies[0]["max_tokens"], 16);
    EXPECT_EQ(bodies[0]["stream_options"]["continuous_usage_stats"], true);
    EXPECT_EQ(bodies[0]["logprobs"], 1);
  }
}

}  // namespace
}  // namespace pw::loadgen
