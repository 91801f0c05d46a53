// The quality-aware planner through the whole node (pw-cluster: broker with the planner on,
// serving the embedded model's .apw store; router; prefill; decode with a tight page pool and
// reservations held for a lowering). A burst whose KV does not fit beside 8-bit experts drives
// the committed widths down (pagedweight_committed_width_mean falls below 8), its end brings
// them back to 8, and every request completes with its full length: none fails.
// Skips when the embedded model or its store (built with the Release build) is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/integration/paged_node.h"

namespace pw {
namespace {

using nlohmann::json;
using testing::Http;

class PlannerBurst : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = testing::PagedNodeMissing(); !why.empty()) GTEST_SKIP() << why;
    testing::PagedNodeConfig c;
    c.name = std::string("planner-burst-") +
             ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name();
    c.initial_bits = 8;
    c.router_extra = ", max_waiting: 1024";
    c.broker_extra =
        ", planner: {enabled: true, low_watermark: 0.05, high_watermark: 0.20, headroom: 0.05, "
        "interval_ms: 200, min_interval_ms: 300" +
        PlannerExtra() + "}";
    c.prefill_kv_blocks = 512;
    // 32 MiB of 4 KiB pages: 8-bit experts take 6144 of the 8192, leaving 512 KV blocks.
    c.decode_fields = "pool_mb: 32, kv_blocks: 2048, max_batch: 128, reserve_wait_ms: 5000";
    ASSERT_NO_FATAL_FAILURE(node_.Start(c));
  }
  // More keys of broker.planner (", key: value ..."); none by default.
  virtual std::string PlannerExtra() const { return ""; }
  double MeanBits() { return node_.MetricSum("pagedweight_committed_width_mean", "layer=\"all\""); }
  // Waits (up to 5 s) until every block is at 8 bits. Call through ASSERT_NO_FATAL_FAILURE.
  void ExpectAllAt8() {
    double bits = -1;
    for (int i = 0; i < 50 && bits != 8.0; ++i) {
      bits = MeanBits();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_EQ(bits, 8.0) << node_.Logs();
  }
  // One greedy completion of `tokens` tokens (ignore_eos) of a short prompt chosen by `i`; ""
  // when it completed with all of them, else what came back.
  std::string Complete(int i, int tokens) {
    const json req = {{"model", "tiny-moe"}, {"prompt", std::vector<int>{1 + i % 7, 2, 3, 4, 5, 6, 7, 8}},
                      {"max_tokens", tokens}, {"temperature", 0}, {"ignore_eos", true}};
    auto [status, body] = Http(node_.http_port(), "POST", "/v1/completions", req.dump(), 120);
    auto j = json::parse(body, nullptr, false);
    if (status == 200 && !j.is_discarded() && j["usage"]["completion_tokens"] == tokens) return "";
    return "HTTP " + std::to_string(status) + ": " + body.substr(0, 300);
  }
  // `requests` completions of `tokens` tokens at once while the committed mean width is sampled
  // every 100 ms; returns how many completed, the lowest mean width seen in `lowest`.
  int Burst(int requests, int tokens, double* lowest) {
    std::atomic<bool> done{false};
    *lowest = 8.0;
    auto sampler = std::async(std::launch::async, [&] {
      while (!done.load()) {
        const double b = MeanBits();
        if (b >= 0) *lowest = std::min(*lowest, b);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
    std::vector<std::future<std::string>> replies;
    for (int i = 0; i < requests; ++i) {
      replies.push_back(std::async(std::launch::async, [this, i, tokens] { return Complete(i, tokens); }));
    }
    int ok = 0;
    for (auto& f : replies) {
      const std::string error = f.get();
      if (error.empty()) {
        ++ok;
      } else {
        ADD_FAILURE() << error;
      }
    }
    done = true;
    sampler.get();
    return ok;
  }

  testing::PagedNode node_;
};

TEST_F(PlannerBurst, BurstLowersWidthsAndItsEndRaisesThemBackNoRequestFails) {
  // Before the burst: every block at 8 bits, nothing to plan.
  ASSERT_NO_FATAL_FAILURE(ExpectAllAt8());
  // 96 greedy completions of 192 tokens at once: 13 KV blocks (52 pages) each, 4992 pages in
  // all against the 2048 the 8-bit experts leave free.
  constexpr int kRequests = 96, kTokens = 192;
  double lowest = 8.0;
  const int ok = Burst(kRequests, kTokens, &lowest);
  EXPECT_EQ(ok, kRequests) << node_.Logs();
  EXPECT_LT(lowest, 8.0) << "the burst did not lower any width\n" << node_.Logs();
  EXPECT_GE(lowest, 3.0);
  EXPECT_GT(node_.MetricSum("pagedweight_kv_reservations_held_total", "outcome=\"held\""), 0)
      << "no reservation waited for the lowering";

  // The end of the burst brings every block back to 8 bits.
  double after = -1;
  for (int i = 0; i < 300 && after != 8.0; ++i) {
    after = MeanBits();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(after, 8.0) << node_.Logs();
  EXPECT_EQ(node_.MetricSum("pagedweight_worker_requests_total", "status=\"error\""), 0);
  // The broker's planner metrics saw both directions, with their pages, damage and latency.
  for (const char* action : {"lower", "raise"}) {
    const std::string l = std::string("action=\"") + action + "\"";
    EXPECT_GE(node_.MetricSum("pagedweight_broker_planner_plans_total", l, node_.broker_metrics_port()), 1) << action;
    EXPECT_GT(node_.MetricSum("pagedweight_broker_planner_pages_total", l, node_.broker_metrics_port()), 0) << action;
    EXPECT_GT(node_.MetricSum("pagedweight_broker_planner_damage_total", l, node_.broker_metrics_port()), 0) << action;
  }
  EXPECT_GE(node_.MetricSum("pagedweight_broker_planner_decision_seconds_count", "", node_.broker_metrics_port()), 2);
  EXPECT_EQ(node_.MetricSum("pagedweight_broker_planner_errors_total", "", node_.broker_metrics_port()), 0);
  std::printf("lowest mean bits %.3f; reservations held %.0f (fit %.0f, waited out %.0f); preemptions %.0f\n",
              lowest, node_.MetricSum("pagedweight_kv_reservations_held_total", "outcome=\"held\""),
              node_.MetricSum("pagedweight_kv_reservations_held_total", "outcome=\"fit\""),
              node_.MetricSum("pagedweight_kv_reservations_held_total", "outcome=\"waited_out\""),
              node_.MetricSum("pagedweight_worker_num_preemptions_total"));
}

// The "no async movement" ablation with the backlog floor: widths change only where a request
// joins or leaves the decode batch, and never below min_bits.
class PlannerBurstAtRequestBoundaries : public PlannerBurst {
 protected:
  std::string PlannerExtra() const override { return ", min_bits: 5, async_movement: false"; }
};

TEST_F(PlannerBurstAtRequestBoundaries, BurstLowersWidthsToTheFloorAndRequestsBringThemBack) {
  ASSERT_NO_FATAL_FAILURE(ExpectAllAt8());
  constexpr int kRequests = 96, kTokens = 192;
  double lowest = 8.0;
  const int ok = Burst(kRequests, kTokens, &lowest);
  EXPECT_EQ(ok, kRequests) << node_.Logs();
  EXPECT_LT(lowest, 8.0) << "the burst did not lower any width\n" << node_.Logs();
  EXPECT_GE(lowest, 5.0) << "below min_bits";
  // Raising back needs request boundaries: short requests one after another until every
  // block is at 8 bits again.
  double after = MeanBits();
  int extra = 0;
  for (; extra < 200 && after != 8.0; ++extra) {
    EXPECT_EQ(Complete(extra, 2), "");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    after = MeanBits();
  }
  EXPECT_EQ(after, 8.0) << node_.Logs();
  EXPECT_EQ(node_.MetricSum("pagedweight_worker_requests_total", "status=\"error\""), 0);
  std::printf("lowest mean bits %.3f; %d short requests to get back to 8 bits\n", lowest, extra);
}

}  // namespace
}  // namespace pw
