// A hybrid (qwen3_next's fixture: linear-attention layers whose recurrent state lives in the KV
// pool) and an MLA model (deepseek_v3's fixture: every KV layer a latent row a token) served by
// the whole node through pw-cluster: pw-broker, pw-router, one pw-prefill and two pw-decode
// processes on loopback, the OpenAI API over HTTP (the fixtures ship no tokenizer: the router
// reads the embedded model's, whose vocabulary holds the fixtures' ids); decode-1's pages are
// 4096 bytes, larger than the prefill worker's (one bf16 layer of a block). A decode worker frozen
// (SIGSTOP) while it streams and then SIGKILLed loses no request: the router places its requests
// again (the prompt's KV, state or latent rows from the prefill worker, the streamed tokens
// computed by the decode worker that takes them), and every completion equals the in-process
// engine's.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "common/text/tokenizer.h"
#include "engine/engine.h"
#include "tests/support/batch_invariance.h"
#include "tests/support/http_util.h"
#include "tests/support/process_util.h"

namespace pw {
namespace {

using nlohmann::json;
using testing::FreePort;
using testing::Http;
using testing::PidsWithCmdline;
using testing::ReadFile;

std::string TokenizerDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }

// A gauge or counter's value in a Prometheus text body (the first series of `name`); -1 if none.
double MetricValue(const std::string& body, const std::string& name) {
  for (size_t at = body.find(name); at != std::string::npos; at = body.find(name, at + 1)) {
    if (at > 0 && body[at - 1] != '\n') continue;
    const size_t sp = body.find(' ', at);
    const char next = body[at + name.size()];
    if (sp == std::string::npos || (next != ' ' && next != '{')) continue;
    return std::atof(body.c_str() + sp + 1);
  }
  return -1;
}

class HybridCluster : public ::testing::Test {
 protected:
  // The fixture served and the name the router serves it under.
  virtual std::string Fixture() const { return "qwen3_next"; }
  virtual std::string Name() const { return "qwen3-next"; }
  std::string ModelDir() const {
    return std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/" + Fixture();
  }

  void SetUp() override {
    testing::UseBatchInvariantKernels();
    std::set<int> used;
    for (int* p : {&http_port_, &ctl_port_, &broker_port_, &decode_metrics_[0], &decode_metrics_[1]}) {
      do *p = FreePort(); while (!used.insert(*p).second);
    }
    run_dir_ = std::string(PW_BINARY_DIR) + "/test-tmp/" + Fixture() + "-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(run_dir_);
    std::filesystem::create_directories(run_dir_);
    std::ofstream(Yaml()) << "model_dir: " << ModelDir() << "\n"
                          << "model_name: " << Name() << "\nrun_dir: " << run_dir_ << "\n"
                          << "bin_dir: " << PW_BINARY_DIR << "/bin\n"
                          << "heartbeat_ms: 300\ndrain_timeout_ms: 20000\n"
                          << "router: {port: " << http_port_ << ", control_port: " << ctl_port_
                          << ", lease_ms: 20000, tokenizer: " << TokenizerDir() << "}\n"
                          << "broker: {control_port: " << broker_port_ << "}\n"
                          << "prefill: [{id: prefill-0, kv_blocks: 128}]\n"
                          << "decode: [{id: decode-0, kv_blocks: 256, metrics_port: "
                          << decode_metrics_[0]
                          << "}, {id: decode-1, kv_blocks: 256, page_bytes: 4096, metrics_port: "
                          << decode_metrics_[1] << "}]\n"
                          << "restart: {initial_backoff_ms: 200, max_backoff_ms: 2000}\n";
    ASSERT_TRUE(cluster_.Start({std::string(PW_BINARY_DIR) + "/bin/pw-cluster", "up", "--config", Yaml()},
                               run_dir_ + "/pw-cluster.out"));
    ASSERT_TRUE(testing::WaitServing(http_port_, 120, Name())) << Logs();
  }
  void TearDown() override {
    for (pid_t p : stopped_) kill(p, SIGKILL);
    cluster_.Kill(SIGKILL);
    testing::KillNodeProcesses({ctl_port_, broker_port_});
    testing::KillConfigProcesses(Yaml());
  }
  std::string Yaml() const { return run_dir_ + "/cluster.yaml"; }
  std::string Logs() {
    return testing::RunLogs(run_dir_, {"pw-cluster.out", "router.log", "broker.log", "prefill-0.log",
                                       "decode-0.log", "decode-1.log"});
  }
  // Greedy completion of a token-id prompt, eos ignored; the text, or "HTTP <status>: body".
  std::string Complete(const std::vector<int32_t>& prompt, int max_tokens) {
    json req = {{"model", Name()},
                {"prompt", prompt},
                {"max_tokens", max_tokens},
                {"temperature", 0},
                {"ignore_eos", true}};
    auto [status, body] = Http(http_port_, "POST", "/v1/completions", req.dump(), 300);
    if (status != 200) return "HTTP " + std::to_string(status) + ": " + body;
    auto j = json::parse(body, nullptr, false);
    if (j.is_discarded()) return "bad JSON: " + body;
    return j["choices"][0]["text"].get<std::string>();
  }
  // The in-process engine's greedy text for each prompt, decoded by the router's tokenizer.
  std::vector<std::string> Reference(const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
    auto tok = Tokenizer::FromModelDir(TokenizerDir());
    EXPECT_TRUE(tok.ok()) << tok.status().ToString();
    engine::EngineOptions eo;
    eo.kv_dtype = engine::KvDtype::kBf16;  // the workers' default
    eo.num_kv_blocks = 512;
    auto e = engine::Engine::Create(ModelDir(), eo);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    engine::SamplingParams p;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    std::vector<std::vector<int32_t>> toks(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_TRUE((*e)->AddSequence(i, prompts[i], p).ok());
    while ((*e)->HasWork()) {
      auto step = (*e)->Step();
      if (!step.ok()) {
        ADD_FAILURE() << step.status().ToString();
        break;
      }
      for (auto& u : step->updates) {
        for (int32_t t : u.new_tokens) toks[u.id].push_back(t);
      }
    }
    std::vector<std::string> out;
    for (auto& t : toks) out.push_back((*tok)->Decode(t, /*skip_special_tokens=*/true).value());
    return out;
  }
  double DecodeMetric(int i, const std::string& name) {
    auto [status, body] = Http(decode_metrics_[i], "GET", "/metrics", "", 5);
    return status == 200 ? MetricValue(body, name) : -1;
  }

  // 8 greedy streams of 360 tokens after prompts of min_len..min_len + 79 random ids (seeded);
  // a decode worker frozen while it streams, then SIGKILLed: every completion is the in-process
  // engine's, and the router placed the victim's requests again.
  void DecodeWorkerKilledMidStreamLosesNoRequest(uint32_t seed, int min_len) {
    // Prompt + generation within the fixtures' context of 512.
    const int kMax = 360;
    std::mt19937 rng(seed);
    std::vector<std::vector<int32_t>> prompts(8);
    for (auto& p : prompts) {
      const int len = min_len + static_cast<int>(rng() % 80);
      for (int i = 0; i < len; ++i) p.push_back(3 + static_cast<int32_t>(rng() % 1000));
    }
    auto ref = Reference(prompts, kMax);
    std::vector<std::future<std::string>> got;
    for (auto& p : prompts)
      got.push_back(std::async(std::launch::async, [&, p] { return Complete(p, kMax); }));
    // The victim: a decode worker streaming (tokens generated, requests running); frozen at once
    // so that its requests are mid-stream when it dies.
    int victim = -1;
    for (int tries = 0; tries < 6000 && victim < 0; ++tries) {
      for (int i = 0; i < 2 && victim < 0; ++i) {
        if (DecodeMetric(i, "pagedweight_worker_num_requests_running") >= 2 &&
            DecodeMetric(i, "pagedweight_worker_generation_tokens_total") >= 64) {
          victim = i;
        }
      }
    }
    ASSERT_GE(victim, 0) << "no decode worker was seen streaming\n" << Logs();
    const std::string id = "decode-" + std::to_string(victim);
    auto pids = PidsWithCmdline("pw-decode --config " + Yaml() + " --section " + id);
    ASSERT_EQ(pids.size(), 1u) << Logs();
    kill(pids[0], SIGSTOP);
    stopped_.push_back(pids[0]);
    int pending = 0;
    for (auto& f : got) pending += f.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
    ASSERT_GT(pending, 0) << "every request finished before the kill; the test proves nothing";
    kill(pids[0], SIGKILL);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i].get(), ref[i]) << "prompt " << i << " (" << prompts[i].size() << " tokens)\n"
                                      << Logs();
    }
    bool restarted = false;
    for (int i = 0; i < 100 && !restarted; ++i) {
      restarted = ReadFile(run_dir_ + "/pw-cluster.out").find(id + " exited") != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(restarted) << Logs();
    // The router placed the victim's requests again, a stream among them with tokens already
    // streamed (the worker that took it computed their KV and state from the prompt's).
    const std::string log = ReadFile(run_dir_ + "/router.log");
    const std::regex again("placed again \\(worker '" + id +
                           "' died\\), ([1-9][0-9]*) tokens already streamed");
    EXPECT_TRUE(std::regex_search(log, again)) << Logs();
  }

  testing::ChildProcess cluster_;
  int http_port_ = 0, ctl_port_ = 0, broker_port_ = 0;
  int decode_metrics_[2] = {0, 0};
  std::string run_dir_;
  std::vector<pid_t> stopped_;
};

// Prompts past the delta rule's chunk of 64 tokens.
TEST_F(HybridCluster, DecodeWorkerKilledMidStreamLosesNoRequest) {
  DecodeWorkerKilledMidStreamLosesNoRequest(3030, 65);
}

// deepseek_v3: the latent rows move prefill -> decode; prompts over several 16-token blocks.
class LatentCluster : public HybridCluster {
 protected:
  std::string Fixture() const override { return "deepseek_v3"; }
  std::string Name() const override { return "deepseek-v3"; }
};

TEST_F(LatentCluster, DecodeWorkerKilledMidStreamLosesNoRequest) {
  DecodeWorkerKilledMidStreamLosesNoRequest(3131, 17);
}

}  // namespace
}  // namespace pw
