// Prompt features through the whole node into the planner's residual heads: the prefill
// worker counts each prompt's routing, the router passes it to the decode worker, whose
// Telemetry carries the histogram of recent prefills to the broker, where the heads turn it
// into the damage factors the planner used (pw-ctl show).
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/formats/apw_store.h"
#include "common/formats/residual_heads.h"
#include "tests/support/http_util.h"
#include "tests/support/process_util.h"

namespace pw {
namespace {

using nlohmann::json;
using testing::FreePort;
using testing::Http;

std::string ModelDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }
std::string StorePath() { return std::string(PW_BINARY_DIR) + "/tiny-moe.apw"; }
std::string Bin(const std::string& name) { return std::string(PW_BINARY_DIR) + "/bin/" + name; }

class PromptResiduals : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(ModelDir() + "/model.safetensors")) GTEST_SKIP() << "no weights in " << ModelDir();
    if (!std::filesystem::exists(StorePath())) GTEST_SKIP() << "no store " << StorePath() << " (built by the Release build)";
    http_port_ = FreePort();
    ctl_port_ = FreePort();
    broker_port_ = FreePort();
    run_dir_ = std::string(PW_BINARY_DIR) + "/test-tmp/prompt-residuals";
    std::filesystem::remove_all(run_dir_);
    std::filesystem::create_directories(run_dir_);
    // Heads whose every weight is ln 1.5 and bias 0: a layer's residual is ln 1.5 times the sum
    // of its feature's shares, so 1.5 exactly when the features are that layer's histogram.
    auto store = apw::ApwStore::Open(StorePath()).value();
    const auto& info = store->info();
    ResidualHeads heads(static_cast<int>(info.num_layers), static_cast<int>(info.num_experts), info.model_hash);
    for (int l = 0; l < heads.num_layers(); ++l)
      for (auto p : {ExpertProj::kGateUp, ExpertProj::kDown})
        for (size_t k = 1; k < heads.head(l, p).size(); ++k) heads.head(l, p)[k] = std::log(1.5);
    ASSERT_TRUE(heads.Save(run_dir_ + "/heads.pwrh").ok());
    const std::string yaml = run_dir_ + "/cluster.yaml";
    std::ofstream(yaml) << "model_dir: " << ModelDir() << "\nmodel_name: tiny-moe\nrun_dir: " << run_dir_
                        << "\nbin_dir: " << PW_BINARY_DIR << "/bin\nheartbeat_ms: 300\ndrain_timeout_ms: 20000\n"
                        << "router: {port: " << http_port_ << ", control_port: " << ctl_port_ << "}\n"
                        << "broker: {control_port: " << broker_port_ << ", metrics_port: " << FreePort()
                        << ", store: " << StorePath() << ", planner: {enabled: true, residuals: " << run_dir_
                        << "/heads.pwrh, interval_ms: 100}}\n"
                        << "prefill: [{id: prefill-0, kv_blocks: 256, metrics_port: " << FreePort() << "}]\n"
                        << "decode: [{id: decode-0, pool_mb: 32, kv_blocks: 512, metrics_port: " << FreePort() << "}]\n";
    ASSERT_TRUE(cluster_.Start({Bin("pw-cluster"), "up", "--config", yaml}, run_dir_ + "/pw-cluster.out"));
    ASSERT_TRUE(testing::WaitServing(http_port_, 120)) << Logs();
  }
  void TearDown() override {
    cluster_.Kill(SIGKILL);
    testing::KillNodeProcesses({ctl_port_, broker_port_});
    testing::KillConfigProcesses(run_dir_ + "/cluster.yaml");
  }
  std::string Logs() { return testing::RunLogs(run_dir_); }
  // pw-ctl show's lines about the planner.
  std::string Show() {
    const std::string cmd = Bin("pw-ctl") + " --broker tcp://127.0.0.1:" + std::to_string(broker_port_) +
                            " --control-keys " + run_dir_ + "/control.keys show 2>&1";
    std::string out;
    if (FILE* f = popen(cmd.c_str(), "r")) {
      char buf[512];
      while (fgets(buf, sizeof buf, f)) {
        if (std::string(buf).rfind("planner:", 0) == 0) out += buf;
      }
      pclose(f);
    }
    return out;
  }
  std::string WaitShow(const std::string& want) {
    std::string s;
    for (int i = 0; i < 100; ++i) {
      s = Show();
      if (s.find(want) != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return s;
  }

  testing::ChildProcess cluster_;
  int http_port_ = 0, ctl_port_ = 0, broker_port_ = 0;
  std::string run_dir_;
};

TEST_F(PromptResiduals, PrefillRoutingReachesThePlannersHeads) {
  // No prompt has run: the heads are loaded, there is nothing to apply them to.
  std::string s = WaitShow("no features yet");
  EXPECT_NE(s.find("heads loaded, no features yet"), std::string::npos) << s << Logs();

  std::vector<std::future<std::pair<int, std::string>>> replies;
  for (int i = 0; i < 4; ++i) {
    json req = {{"model", "tiny-moe"}, {"prompt", std::vector<int>{1 + i, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
                {"max_tokens", 8}, {"temperature", 0}};
    replies.push_back(std::async(std::launch::async, [this, body = req.dump()] {
      return Http(http_port_, "POST", "/v1/completions", body, 60);
    }));
  }
  for (auto& f : replies) EXPECT_EQ(f.get().first, 200);

  // Every layer's feature is a histogram (shares summing to 1), so every factor is 1.5.
  const std::string want = "0: 1.500/1.500 1: 1.500/1.500 2: 1.500/1.500 3: 1.500/1.500";
  s = WaitShow(want);
  EXPECT_NE(s.find("prompt residuals (damage factor, layer: gate_up/down): " + want), std::string::npos)
      << s << Logs();
}

}  // namespace
}  // namespace pw
