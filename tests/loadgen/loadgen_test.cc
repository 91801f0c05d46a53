// pw-loadgen without a server: gamma arrivals have the requested mean and coefficient of
// variation, the ramp-up moves the rate, trace rows become requests at their scaled times, the
// HTTP/SSE parser survives any split of its input and refuses bad bytes, and the statistics are
// vLLM's.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "loadgen/arrivals.h"
#include "loadgen/bench_result.h"
#include "loadgen/sse_response.h"
#include "loadgen/stream_client.h"

namespace pw::loadgen {
namespace {

std::vector<double> Gaps(const std::vector<PlannedRequest>& p) {
  std::vector<double> g;
  for (size_t i = 1; i < p.size(); ++i) g.push_back(p[i].at_s - p[i - 1].at_s);
  return g;
}
double Mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
double Cv(const std::vector<double>& v) {
  const double m = Mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size())) / m;
}

// Tolerance: 20000 gaps; the sample mean's relative standard error is cv/sqrt(n) (1% at shape
// 0.5) and the sample CV's about 1.3% at shape 0.5, so 4% and 6% are over 4 standard errors.
TEST(GammaArrivals, MeanAndCoefficientOfVariation) {
  for (double shape : {0.25, 0.5, 1.0, 2.0}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      RandomArrivalOptions o;
      o.num_prompts = 20001;
      o.request_rate = 20;
      o.burstiness = shape;
      o.seed = seed;
      ASSERT_TRUE(ValidateRandomArrivals(o).ok());
      const auto g = Gaps(PlanRandomArrivals(o));
      const double tol_cv = shape < 0.5 ? 0.08 : 0.06;
      EXPECT_NEAR(Mean(g), 1.0 / 20, 0.04 / 20) << "shape " << shape << " seed " << seed;
      EXPECT_NEAR(Cv(g), 1.0 / std::sqrt(shape), tol_cv / std::sqrt(shape))
          << "shape " << shape << " seed " << seed;
    }
  }
}

TEST(GammaArrivals, InfiniteRateSendsEverythingAtOnceAndSeedRepeats) {
  RandomArrivalOptions o;
  o.num_prompts = 50;
  const auto p = PlanRandomArrivals(o);
  ASSERT_EQ(p.size(), 50u);
  for (const auto& r : p) EXPECT_EQ(r.at_s, 0.0);
  o.request_rate = 5;
  o.range_ratio = 0.5;
  o.seed = 9;
  const auto a = PlanRandomArrivals(o), b = PlanRandomArrivals(o);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].at_s, b[i].at_s);
    EXPECT_EQ(a[i].input_len, b[i].input_len);
    EXPECT_GE(a[i].input_len, 512);
    EXPECT_LE(a[i].input_len, 1536);
  }
}

TEST(GammaArrivals, DurationStopsArrivals) {
  RandomArrivalOptions o;
  o.num_prompts = 0;
  o.request_rate = 50;
  o.duration_s = 10;
  const auto p = PlanRandomArrivals(o);
  EXPECT_NEAR(static_cast<double>(p.size()), 500, 80);
  EXPECT_LT(p.back().at_s, 10.0);
}

TEST(RampUp, LinearRateGoesFromStartToEnd) {
  RandomArrivalOptions o;
  o.num_prompts = 4000;
  o.ramp_start_rps = 5;
  o.ramp_end_rps = 50;
  o.seed = 4;
  ASSERT_TRUE(ValidateRandomArrivals(o).ok());
  const auto g = Gaps(PlanRandomArrivals(o));
  const std::vector<double> first(g.begin(), g.begin() + 300), last(g.end() - 300, g.end());
  // Over the first 300 requests the rate rises from 5 to 8.4 (1 / mean gap = 6.54), over the
  // last 300 from 46.6 to 50 (48.3); 300 exponential gaps: 5.8% standard error, 20% allowed.
  EXPECT_NEAR(1.0 / Mean(first), 6.54, 0.2 * 6.54);
  EXPECT_NEAR(1.0 / Mean(last), 48.3, 0.2 * 48.3);
}

TEST(RandomArrivals, BadOptionsAreRefused) {
  RandomArrivalOptions o;
  o.burstiness = 0;
  EXPECT_FALSE(ValidateRandomArrivals(o).ok());
  o.burstiness = 1;
  o.request_rate = -1;
  EXPECT_FALSE(ValidateRandomArrivals(o).ok());
  o.request_rate = 1;
  o.range_ratio = 1.0;
  EXPECT_FALSE(ValidateRandomArrivals(o).ok());
  o.range_ratio = 0;
  o.ramp_end_rps = 3;
  EXPECT_FALSE(ValidateRandomArrivals(o).ok());  // start missing
}

const char* kTrace =
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.0000000,2000,900\n"
    "2023-11-16 18:16:00.5000000,10,0\n"
    "2023-11-16 23:59:59.5000000,7,7\n"
    "2023-11-17 00:00:00.2500000,8,8\n";

TEST(AzureTrace, ParsesAndScalesTimes) {
  auto rows = ParseAzureTrace(kTrace, "t.csv");
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 6u);
  TraceOptions o;
  o.speedup = 4;
  o.clip_context = 384;
  o.clip_output = 256;
  const auto p = PlanTrace(*rows, o);
  ASSERT_EQ(p.size(), 6u);
  EXPECT_DOUBLE_EQ(p[0].at_s, 0);
  EXPECT_NEAR(p[1].at_s, (50.9951690 - 46.6805900) / 4, 1e-6);
  EXPECT_NEAR(p[3].at_s, (60.5 - 46.68059) / 4, 1e-6);
  EXPECT_EQ(p[2].input_len, 384);
  EXPECT_EQ(p[2].output_len, 256);
  EXPECT_EQ(p[3].output_len, 1);  // at least one token
  // Across midnight.
  EXPECT_NEAR(p[5].at_s - p[4].at_s, 0.75 / 4, 1e-6);
}

TEST(AzureTrace, WindowAndLimit) {
  auto rows = ParseAzureTrace(kTrace, "t.csv");
  ASSERT_TRUE(rows.ok());
  TraceOptions o;
  o.window_start_s = 4;
  o.window_end_s = 20;
  auto p = PlanTrace(*rows, o);
  ASSERT_EQ(p.size(), 3u);  // rows at 4.31 s, 4.32 s, 13.8 s
  EXPECT_DOUBLE_EQ(p[0].at_s, 0);
  EXPECT_NEAR(p[2].at_s, 60.5 - 50.9951690, 1e-6);
  o.max_requests = 2;
  EXPECT_EQ(PlanTrace(*rows, o).size(), 2u);
}

TEST(AzureTrace, BadInputNamesTheLine) {
  auto r = ParseAzureTrace("a,b,c\n", "x.csv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("x.csv:1"), std::string::npos);
  r = ParseAzureTrace(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,2\n"
      "2023-13-16 18:15:46,1,2\n",
      "x.csv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("x.csv:3"), std::string::npos) << r.status().message();
  r = ParseAzureTrace("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,-1,2\n", "x");
  EXPECT_FALSE(r.ok());
  r = ParseAzureTrace(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,2\n"
      "2023-11-16 18:15:45,1,2\n",
      "x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("backwards"), std::string::npos);
  EXPECT_FALSE(LoadAzureTrace("/nonexistent/trace.csv").ok());
}

std::string Chunked(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) {
    char h[16];
    std::snprintf(h, sizeof(h), "%zx\r\n", p.size());
    out += h + p + "\r\n";
  }
  return out + "0\r\n\r\n";
}

// Events split across chunks, two events in one chunk, a chunk extension.
const std::string kSse =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
    Chunked({"data: {\"choices\":[{\"text\"", ":\"a\"}]}\n\n",
             "data: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n"});

TEST(SseResponse, AnySplitGivesTheSameEvents) {
  for (size_t step : {1u, 2u, 3u, 7u, 1000u}) {
    std::vector<std::string> events;
    SseResponse r([&](std::string_view d) { events.emplace_back(d); });
    for (size_t i = 0; i < kSse.size(); i += step) {
      ASSERT_TRUE(r.Feed(std::string_view(kSse).substr(i, step))) << r.error();
    }
    ASSERT_TRUE(r.complete());
    EXPECT_TRUE(r.keep_alive());
    EXPECT_EQ(r.status(), 200);
    ASSERT_EQ(events.size(), 3u) << "step " << step;
    EXPECT_EQ(events[0], "{\"choices\":[{\"text\":\"a\"}]}");
    EXPECT_EQ(events[2], "[DONE]");
  }
}

TEST(SseResponse, ErrorBodyAndBadBytes) {
  SseResponse r([](std::string_view) { FAIL() << "no events in an error body"; });
  const std::string err =
      "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: 13\r\n"
      "Connection: close\r\n\r\n{\"error\":{}}\n";
  ASSERT_TRUE(r.Feed(err));
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.status(), 429);
  EXPECT_FALSE(r.keep_alive());
  EXPECT_EQ(r.body(), "{\"error\":{}}\n");

  SseResponse bad([](std::string_view) {});
  EXPECT_FALSE(bad.Feed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"));
  EXPECT_NE(bad.error().find("chunk size"), std::string::npos);
  SseResponse junk([](std::string_view) {});
  EXPECT_FALSE(junk.Feed("SMTP ready\r\n\r\n"));
  SseResponse cut([](std::string_view) {});
  ASSERT_TRUE(cut.Feed("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"));
  EXPECT_FALSE(cut.FinishAtEof());
  SseResponse extra([](std::string_view) {});
  EXPECT_FALSE(extra.Feed("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab"));
}

TEST(BaseUrl, Parses) {
  auto t = ParseBaseUrl("http://127.0.0.1:8123", "/v1/completions");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->host, "127.0.0.1");
  EXPECT_EQ(t->port, 8123);
  EXPECT_EQ(t->path, "/v1/completions");
  t = ParseBaseUrl("http://localhost/api/", "v1/chat/completions");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->port, 80);
  EXPECT_EQ(t->path, "/api/v1/chat/completions");
  EXPECT_FALSE(ParseBaseUrl("https://x", "/v1").ok());
  EXPECT_FALSE(ParseBaseUrl("http://x:99999", "/v1").ok());
  EXPECT_FALSE(ParseBaseUrl("http://:80", "/v1").ok());
}

TEST(Statistics, PercentilesLikeNumpy) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 50.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 99.01);
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 100);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
  EXPECT_EQ(PercentileKey(99), "99");
  EXPECT_EQ(PercentileKey(99.9), "99.9");
}

TEST(Statistics, SummaryKeysTpotAndGoodput) {
  RequestRecord a;
  a.success = true;
  a.input_len = 10;
  a.output_len = 5;
  a.ttft_s = 0.100;
  a.latency_s = 0.300;  // TPOT (300 - 100) / 4 = 50 ms
  a.itl_s = {0.05, 0.05, 0.05, 0.05};
  RequestRecord b = a;
  b.ttft_s = 0.600;  // misses the TTFT SLO
  b.latency_s = 0.700;
  RequestRecord c;
  c.error_kind = "http_429";
  SummaryOptions o;
  ASSERT_TRUE(ParsePercentileOptions("ttft,tpot,itl,e2el", "50,99.9", &o).ok());
  auto slo = ParseGoodput({"ttft:500", "tpot:50"});
  ASSERT_TRUE(slo.ok());
  o.goodput = *slo;
  const auto s = Summarize({a, b, c}, 2.0, 3, o);
  EXPECT_EQ(s["completed"], 2);
  EXPECT_EQ(s["failed"], 1);
  EXPECT_EQ(s["total_input_tokens"], 20);
  EXPECT_EQ(s["total_output_tokens"], 10);
  EXPECT_DOUBLE_EQ(s["request_throughput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(s["request_goodput"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["mean_tpot_ms"].get<double>(), 37.5);  // (50 + 25) / 2
  EXPECT_DOUBLE_EQ(s["median_ttft_ms"].get<double>(), 350);
  EXPECT_DOUBLE_EQ(s["std_ttft_ms"].get<double>(), 250);
  EXPECT_TRUE(s.contains("p99.9_e2el_ms"));
  EXPECT_EQ(s["errors_by_kind"]["http_429"], 1);
  EXPECT_EQ(s["ttfts"].size(), 3u);
  const std::string table = FormatTable(s, o);
  EXPECT_NE(table.find("Request goodput (req/s):"), std::string::npos);
  EXPECT_NE(table.find("P99.9 E2EL (ms):"), std::string::npos);
  EXPECT_FALSE(ParseGoodput({"ttft=5"}).ok());
  EXPECT_FALSE(ParseGoodput({"foo:5"}).ok());
  EXPECT_FALSE(ParsePercentileOptions("ttft,bogus", "99", &o).ok());
  EXPECT_FALSE(ParsePercentileOptions("ttft", "101", &o).ok());
}

}  // namespace
}  // namespace pw::loadgen
