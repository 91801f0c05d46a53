// The quality-aware planner through the whole node (pw-cluster: broker with the planner on,
// serving the embedded model's .apw store; router; prefill; decode with a tight page pool and
// reservations held for a lowering). A burst whose KV does not fit beside 8-bit experts drives
// the committed widths down (pagedweight_committed_width_mean falls below 8), its end brings
// them back to 8, and every request completes with its full length: none fails.
// Skips when the embedded model or its store (built with the Release build) is absent.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/cluster/http_util.h"
#include "tests/cluster/process_util.h"

namespace pw {
namespace {

using nlohmann::json;
using testing::FreePort;
using testing::Http;

std::string ModelDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }
std::string StorePath() { return std::string(PW_BINARY_DIR) + "/tiny-moe.apw"; }
std::string Bin(const std::string& name) { return std::string(PW_BINARY_DIR) + "/bin/" + name; }

class PlannerBurst : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(ModelDir() + "/model.safetensors")) GTEST_SKIP() << "no weights in " << ModelDir();
    if (!std::filesystem::exists(StorePath())) GTEST_SKIP() << "no store " << StorePath() << " (built by the Release build)";
    http_port_ = FreePort();
    ctl_port_ = FreePort();
    broker_port_ = FreePort();
    decode_metrics_ = FreePort();
    broker_metrics_ = FreePort();
    run_dir_ = std::string(PW_BINARY_DIR) + "/test-tmp/planner-burst-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name();
    std::filesystem::remove_all(run_dir_);
    std::filesystem::create_directories(run_dir_);
    const std::string yaml = run_dir_ + "/cluster.yaml";
    // 32 MiB of 4 KiB pages: 8-bit experts take 6144 of the 8192, leaving 512 KV blocks.
    std::ofstream(yaml) << "model_dir: " << ModelDir() << "\nmodel_name: tiny-moe\nrun_dir: " << run_dir_
                        << "\nbin_dir: " << PW_BINARY_DIR << "/bin\nheartbeat_ms: 300\ndrain_timeout_ms: 20000\n"
                        << "router: {port: " << http_port_ << ", control_port: " << ctl_port_
                        << ", lease_ms: 20000, max_waiting: 1024}\n"
                        << "broker: {control_port: " << broker_port_ << ", metrics_port: " << broker_metrics_
                        << ", store: " << StorePath()
                        << ", initial_bits: 8, planner: {enabled: true, low_watermark: 0.05, "
                        << "high_watermark: 0.20, headroom: 0.05, interval_ms: 200, min_interval_ms: 300"
                        << PlannerExtra() << "}}\n"
                        << "prefill: [{id: prefill-0, kv_blocks: 512}]\n"
                        << "decode: [{id: decode-0, pool_mb: 32, kv_blocks: 2048, max_batch: 128, "
                        << "reserve_wait_ms: 5000, metrics_port: " << decode_metrics_ << "}]\n"
                        << "restart: {initial_backoff_ms: 200, max_backoff_ms: 2000}\n";
    ASSERT_TRUE(cluster_.Start({Bin("pw-cluster"), "up", "--config", yaml}, run_dir_ + "/pw-cluster.out"));
    ASSERT_TRUE(testing::WaitServing(http_port_, 120)) << Logs();
  }
  // More keys of broker.planner (", key: value ..."); none by default.
  virtual std::string PlannerExtra() const { return ""; }
  void TearDown() override {
    cluster_.Kill(SIGKILL);
    testing::KillNodeProcesses({ctl_port_, broker_port_});
  }
  std::string Logs() { return testing::RunLogs(run_dir_); }
  // The decode worker's (or `port`'s) samples of `name` whose labels contain `label`, summed; -1
  // when there is none.
  double Metric(const std::string& name, const std::string& label = "", int port = 0) {
    auto [status, body] = Http(port != 0 ? port : decode_metrics_, "GET", "/metrics", "", 10);
    if (status != 200) return -1;
    double sum = 0;
    bool found = false;
    size_t at = 0;
    while ((at = body.find("\n" + name, at)) != std::string::npos) {
      const size_t end = body.find('\n', at + 1);
      const std::string line = body.substr(at + 1, end - at - 1);
      at = end;
      const char next = line.size() > name.size() ? line[name.size()] : ' ';
      if ((next != '{' && next != ' ') || line.find(label) == std::string::npos) continue;
      sum += std::atof(line.c_str() + line.rfind(' ') + 1);
      found = true;
    }
    return found ? sum : -1;
  }
  double MeanBits() { return Metric("pagedweight_committed_width_mean", "layer=\"all\""); }

  testing::ChildProcess cluster_;
  int http_port_ = 0, ctl_port_ = 0, broker_port_ = 0, decode_metrics_ = 0, broker_metrics_ = 0;
  std::string run_dir_;
};

TEST_F(PlannerBurst, BurstLowersWidthsAndItsEndRaisesThemBackNoRequestFails) {
  // Before the burst: every block at 8 bits, nothing to plan.
  double before = -1;
  for (int i = 0; i < 50 && before != 8.0; ++i) {
    before = MeanBits();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(before, 8.0) << Logs();

  // 96 greedy completions of 192 tokens at once: 13 KV blocks (52 pages) each, 4992 pages in
  // all against the 2048 the 8-bit experts leave free.
  constexpr int kRequests = 96, kTokens = 192;
  std::atomic<bool> done{false};
  double lowest = 8.0;
  auto sampler = std::async(std::launch::async, [&] {
    while (!done.load()) {
      const double b = MeanBits();
      if (b >= 0) lowest = std::min(lowest, b);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::vector<std::future<std::pair<int, std::string>>> replies;
  for (int i = 0; i < kRequests; ++i) {
    json req = {{"model", "tiny-moe"}, {"prompt", std::vector<int>{1 + i % 7, 2, 3, 4, 5, 6, 7, 8}},
                {"max_tokens", kTokens}, {"temperature", 0}, {"ignore_eos", true}};
    replies.push_back(std::async(std::launch::async, [this, body = req.dump()] {
      return Http(http_port_, "POST", "/v1/completions", body, 120);
    }));
  }
  int ok = 0;
  for (auto& f : replies) {
    auto [status, body] = f.get();
    auto j = json::parse(body, nullptr, false);
    if (status == 200 && !j.is_discarded() && j["usage"]["completion_tokens"] == kTokens) {
      ++ok;
    } else {
      ADD_FAILURE() << "HTTP " << status << ": " << body.substr(0, 300);
    }
  }
  done = true;
  sampler.get();
  EXPECT_EQ(ok, kRequests) << Logs();
  EXPECT_LT(lowest, 8.0) << "the burst did not lower any width\n" << Logs();
  EXPECT_GE(lowest, 3.0);
  EXPECT_GT(Metric("pagedweight_kv_reservations_held_total", "outcome=\"held\""), 0)
      << "no reservation waited for the lowering";

  // The end of the burst brings every block back to 8 bits.
  double after = -1;
  for (int i = 0; i < 300 && after != 8.0; ++i) {
    after = MeanBits();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(after, 8.0) << Logs();
  EXPECT_EQ(Metric("pagedweight_worker_requests_total", "status=\"error\""), 0);
  // The broker's planner metrics saw both directions, with their pages, damage and latency.
  for (const char* action : {"lower", "raise"}) {
    const std::string l = std::string("action=\"") + action + "\"";
    EXPECT_GE(Metric("pagedweight_broker_planner_plans_total", l, broker_metrics_), 1) << action;
    EXPECT_GT(Metric("pagedweight_broker_planner_pages_total", l, broker_metrics_), 0) << action;
    EXPECT_GT(Metric("pagedweight_broker_planner_damage_total", l, broker_metrics_), 0) << action;
  }
  EXPECT_GE(Metric("pagedweight_broker_planner_decision_seconds_count", "", broker_metrics_), 2);
  EXPECT_EQ(Metric("pagedweight_broker_planner_errors_total", "", broker_metrics_), 0);
  std::printf("lowest mean bits %.3f; reservations held %.0f (fit %.0f, waited out %.0f); preemptions %.0f\n",
              lowest, Metric("pagedweight_kv_reservations_held_total", "outcome=\"held\""),
              Metric("pagedweight_kv_reservations_held_total", "outcome=\"fit\""),
              Metric("pagedweight_kv_reservations_held_total", "outcome=\"waited_out\""),
              Metric("pagedweight_worker_num_preemptions_total"));
}

// The "no async movement" ablation with the backlog floor: widths change only where a request
// joins or leaves the decode batch, and never below min_bits.
class PlannerBurstAtRequestBoundaries : public PlannerBurst {
 protected:
  std::string PlannerExtra() const override { return ", min_bits: 5, async_movement: false"; }
};

TEST_F(PlannerBurstAtRequestBoundaries, BurstLowersWidthsToTheFloorAndRequestsBringThemBack) {
  double before = -1;
  for (int i = 0; i < 50 && before != 8.0; ++i) {
    before = MeanBits();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(before, 8.0) << Logs();
  constexpr int kRequests = 96, kTokens = 192;
  std::atomic<bool> done{false};
  double lowest = 8.0;
  auto sampler = std::async(std::launch::async, [&] {
    while (!done.load()) {
      const double b = MeanBits();
      if (b >= 0) lowest = std::min(lowest, b);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto complete = [this](int i, int tokens) {
    json req = {{"model", "tiny-moe"}, {"prompt", std::vector<int>{1 + i % 7, 2, 3, 4, 5, 6, 7, 8}},
                {"max_tokens", tokens}, {"temperature", 0}, {"ignore_eos", true}};
    auto [status, body] = Http(http_port_, "POST", "/v1/completions", req.dump(), 120);
    auto j = json::parse(body, nullptr, false);
    return status == 200 && !j.is_discarded() && j["usage"]["completion_tokens"] == tokens;
  };
  std::vector<std::future<bool>> replies;
  for (int i = 0; i < kRequests; ++i) replies.push_back(std::async(std::launch::async, complete, i, kTokens));
  int ok = 0;
  for (auto& f : replies) ok += f.get() ? 1 : 0;
  done = true;
  sampler.get();
  EXPECT_EQ(ok, kRequests) << Logs();
  EXPECT_LT(lowest, 8.0) << "the burst did not lower any width\n" << Logs();
  EXPECT_GE(lowest, 5.0) << "below min_bits";
  // Raising back needs request boundaries: short requests one after another until every
  // block is at 8 bits again.
  double after = MeanBits();
  int extra = 0;
  for (; extra < 200 && after != 8.0; ++extra) {
    EXPECT_TRUE(complete(extra, 2));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    after = MeanBits();
  }
  EXPECT_EQ(after, 8.0) << Logs();
  EXPECT_EQ(Metric("pagedweight_worker_requests_total", "status=\"error\""), 0);
  std::printf("lowest mean bits %.3f; %d short requests to get back to 8 bits\n", lowest, extra);
}

}  // namespace
}  // namespace pw
