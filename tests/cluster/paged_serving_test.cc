// Paged serving through the whole node (pw-cluster: broker serving the embedded model's .apw
// store, router, prefill, decode with one page pool), driven as an operator would: the OpenAI
// API over HTTP and pw-ctl. Checks that
//   - greedy completions served after a commit equal the in-process engine running the same
//     store at the same per-block widths (uniform 4, then 8 after `set-bits 8 --all`, then a
//     mixed plan from `pw-ctl apply`);
//   - pw-ctl refuses bad input (bits 2 or 9, a block outside the model, a malformed plan) with
//     a clear error and the plan epoch unchanged;
//   - under steady load with random plans every 300 ms and the broker SIGKILLed (and restarted
//     by the launcher) midway, every request completes and the decode worker's pool balances
//     to the page (pagedweight_pool_balanced), KV back to zero pages at the end.
// Skips when the embedded model or its store (built with the Release build) is absent.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <thread>

#include "common/tokenizer.h"
#include "quant/apw_provider.h"
#include "services/engine/engine.h"
#include "tests/cluster/http_util.h"
#include "tests/cluster/process_util.h"

namespace pw {
namespace {

using nlohmann::json;
using testing::FreePort;
using testing::Http;
using testing::PidsWithCmdline;
using testing::ReadFile;

std::string ModelDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }
std::string StorePath() { return std::string(PW_BINARY_DIR) + "/tiny-moe.apw"; }
std::string Bin(const std::string& name) { return std::string(PW_BINARY_DIR) + "/bin/" + name; }

// Runs a command; returns {exit code, stdout + stderr}.
std::pair<int, std::string> Shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

class PagedServing : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(ModelDir() + "/model.safetensors")) GTEST_SKIP() << "no weights in " << ModelDir();
    if (!std::filesystem::exists(StorePath())) GTEST_SKIP() << "no store " << StorePath() << " (built by the Release build)";
    http_port_ = FreePort();
    ctl_port_ = FreePort();
    broker_port_ = FreePort();
    decode_metrics_ = FreePort();
    run_dir_ = std::string(PW_BINARY_DIR) + "/test-tmp/paged-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(run_dir_);
    std::filesystem::create_directories(run_dir_);
    const std::string yaml = run_dir_ + "/cluster.yaml";
    std::ofstream(yaml) << "model_dir: " << ModelDir() << "\nmodel_name: tiny-moe\nrun_dir: " << run_dir_
                        << "\nbin_dir: " << PW_BINARY_DIR << "/bin\nheartbeat_ms: 300\ndrain_timeout_ms: 20000\n"
                        << "router: {port: " << http_port_ << ", control_port: " << ctl_port_ << ", lease_ms: 20000}\n"
                        << "broker: {control_port: " << broker_port_ << ", store: " << StorePath()
                        << ", initial_bits: 4}\n"
                        << "prefill: [{id: prefill-0, kv_blocks: 256}]\n"
                        << "decode: [{id: decode-0, kv_blocks: 512, metrics_port: " << decode_metrics_ << "}]\n"
                        << "restart: {initial_backoff_ms: 200, max_backoff_ms: 2000}\n";
    ASSERT_TRUE(cluster_.Start({Bin("pw-cluster"), "up", "--config", yaml}, run_dir_ + "/pw-cluster.out"));
    ASSERT_TRUE(WaitServing(120)) << Logs();
    store_ = std::shared_ptr<const apw::ApwStore>(apw::ApwStore::Open(StorePath()).value().release());
  }
  void TearDown() override {
    cluster_.Kill(SIGKILL);
    testing::KillNodeProcesses({ctl_port_, broker_port_});
  }
  bool WaitServing(int timeout_s) { return testing::WaitServing(http_port_, timeout_s); }
  std::string Logs() { return testing::RunLogs(run_dir_); }
  std::pair<int, std::string> Ctl(const std::string& args) {
    return Shell(Bin("pw-ctl") + " --broker tcp://127.0.0.1:" + std::to_string(broker_port_) +
                 " --control-keys " + run_dir_ + "/control.keys " + args);
  }
  // A metric of the decode worker ("name{labels}" prefix), or -1.
  double Metric(const std::string& prefix) {
    auto [status, body] = Http(decode_metrics_, "GET", "/metrics", "", 10);
    if (status != 200) return -1;
    size_t at = body.find("\n" + prefix);
    if (at == std::string::npos) return -1;
    size_t sp = body.find(' ', at + 1 + prefix.size());
    return std::atof(body.c_str() + sp + 1);
  }
  // Runs a pw-ctl change and waits until the decode worker has committed its plan epoch.
  void ChangeAndWait(const std::string& args) {
    auto [rc, out] = Ctl(args);
    ASSERT_EQ(rc, 0) << args << ": " << out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, std::regex("plan epoch (\\d+)"))) << out;
    const int epoch = std::stoi(m[1]);
    for (int i = 0; i < 600; ++i) {
      auto [src, shown] = Ctl("show");
      std::smatch c;
      if (std::regex_search(shown, c, std::regex("committed epoch (\\d+), 0 change")) && std::stoi(c[1]) >= epoch) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << args << ": epoch " << epoch << " not committed\n" << Ctl("show").second << Logs();
  }
  std::string Complete(const std::vector<int32_t>& prompt, int max_tokens) {
    json req = {{"model", "tiny-moe"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
    auto [status, body] = Http(http_port_, "POST", "/v1/completions", req.dump());
    if (status != 200) return "HTTP " + std::to_string(status) + ": " + body;
    auto j = json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.contains("choices")) return "bad reply: " + body;
    return j["choices"][0]["text"].get<std::string>();
  }
  // The in-process engines as the cluster splits the work: the prompt on a prefill engine with
  // the checkpoint's bf16 experts (prefill keeps full precision), its KV pages copied to a
  // decode engine whose experts come from the same store at `widths`; bf16 KV on both.
  std::vector<std::string> Reference(const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                                     const anyprec::WidthMap& widths) {
    auto tok = Tokenizer::FromModelDir(ModelDir()).value();
    engine::EngineOptions eo;
    eo.kv_dtype = engine::KvDtype::kBf16;
    auto pre = engine::Engine::Create(ModelDir(), eo).value();
    auto dec = engine::Engine::Create(ModelDir(), eo).value();
    auto provider = anyprec::ApwExpertProvider::Create(store_, dec->model(), widths).value();
    engine::MoeHooks hooks;
    hooks.provider = provider.get();
    dec->SetMoeHooks(hooks);
    engine::SamplingParams p;
    p.max_tokens = max_tokens;
    std::vector<std::vector<int32_t>> toks(prompts.size());
    const engine::KvLayout& kl = dec->kv_pool().layout();
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int nb = engine::BlocksForTokens(static_cast<int>(prompts[i].size()), kl.block_size);
      auto src = pre->kv_pool().Allocate(nb).value();
      auto dst = dec->kv_pool().Allocate(nb).value();
      auto first = pre->Prefill(prompts[i], src, p);
      EXPECT_TRUE(first.ok()) << first.status().ToString();
      for (int b = 0; b < nb; ++b) {
        for (int l = 0; l < kl.num_layers; ++l) {
          std::memcpy(dec->kv_pool().LayerPage(dst[b], l), pre->kv_pool().LayerPage(src[b], l), kl.bytes_per_layer());
        }
      }
      EXPECT_TRUE(pre->kv_pool().Free(src).ok());
      toks[i].push_back(first->first_token);
      EXPECT_TRUE(dec->AddPrefilledSequence(i, prompts[i], dst, first->first_token, p).ok());
    }
    while (dec->HasWork()) {
      auto step = dec->Step();
      if (!step.ok()) {
        ADD_FAILURE() << step.status().ToString();
        break;
      }
      for (auto& u : step->updates) for (int32_t t : u.new_tokens) toks[u.id].push_back(t);
    }
    std::vector<std::string> out;
    for (auto& t : toks) out.push_back(tok->Decode(t, /*skip_special_tokens=*/true).value());
    dec->SetMoeHooks({});
    return out;
  }
  std::vector<std::vector<int32_t>> Prompts(int n, uint32_t seed) {
    const char* texts[] = {"The sea", "Once upon a time there was", "int main(int argc, char** argv) {",
                           "In the beginning", "def parse(self, text):", "The manual page says"};
    auto tok = Tokenizer::FromModelDir(ModelDir()).value();
    std::mt19937 rng(seed);
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < n; ++i) {
      std::string text = texts[i % 6];
      for (int r = static_cast<int>(rng() % 5); r > 0; --r) text += std::string(" ") + texts[rng() % 6];
      out.push_back(tok->Encode(text).value());
    }
    return out;
  }
  void ExpectServedEqualsReference(const anyprec::WidthMap& widths, const char* what) {
    const int kMax = 20;
    auto prompts = Prompts(12, 99);
    auto ref = Reference(prompts, kMax, widths);
    std::vector<std::future<std::string>> got;
    for (const auto& p : prompts) got.push_back(std::async(std::launch::async, [&, p] { return Complete(p, kMax); }));
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i].get(), ref[i]) << what << ", prompt " << i;
  }

  testing::ChildProcess cluster_;
  int http_port_ = 0, ctl_port_ = 0, broker_port_ = 0, decode_metrics_ = 0;
  std::string run_dir_;
  std::shared_ptr<const apw::ApwStore> store_;
};

TEST_F(PagedServing, GreedyOutputsEqualTheEngineAtTheCommittedWidths) {
  const int L = static_cast<int>(store_->info().num_layers), E = static_cast<int>(store_->info().num_experts);
  ExpectServedEqualsReference(anyprec::WidthMap::Uniform(4, L, E).value(), "initial 4 bits");
  const double weights4 = Metric("pagedweight_pool_pages{tenant=\"weights\"");

  ChangeAndWait("set-bits 8 --all");
  EXPECT_GT(Metric("pagedweight_pool_pages{tenant=\"weights\""), weights4);
  ExpectServedEqualsReference(anyprec::WidthMap::Uniform(8, L, E).value(), "after set-bits 8 --all");

  // A mixed plan: a whole layer at 3, one expert at 6, one down block at 5.
  const std::string plan = run_dir_ + "/plan.yaml";
  std::ofstream(plan) << "layers:\n  - {layer: 1, bits: 3}\nblocks:\n  - {layer: 2, expert: 5, bits: 6}\n"
                      << "  - {layer: 0, expert: 9, proj: down, bits: 5}\n";
  ChangeAndWait("apply " + plan);
  anyprec::WidthMap mixed = anyprec::WidthMap::Uniform(8, L, E).value();
  for (int e = 0; e < E; ++e) {
    ASSERT_TRUE(mixed.Set(1, e, ExpertProj::kGateUp, 3).ok());
    ASSERT_TRUE(mixed.Set(1, e, ExpertProj::kDown, 3).ok());
  }
  ASSERT_TRUE(mixed.Set(2, 5, ExpertProj::kGateUp, 6).ok());
  ASSERT_TRUE(mixed.Set(2, 5, ExpertProj::kDown, 6).ok());
  ASSERT_TRUE(mixed.Set(0, 9, ExpertProj::kDown, 5).ok());
  ExpectServedEqualsReference(mixed, "after a mixed plan");
  auto [rc, out] = Ctl("show --layer 1");
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("decode-0"), std::string::npos) << out;
  EXPECT_EQ(Metric("pagedweight_sync_fetches_total{"), 0);
}

TEST_F(PagedServing, PwCtlRefusesBadInputAndChangesNothing) {
  auto epoch = [&] {
    auto [rc, out] = Ctl("show");
    std::smatch m;
    return std::regex_search(out, m, std::regex("plan epoch (\\d+)")) ? std::stoi(m[1]) : -1;
  };
  const int before = epoch();
  ASSERT_GE(before, 0);
  for (const char* bad : {"set-bits 2 --all", "set-bits 9 --all", "set-bits 4 --block 99:0",
                          "set-bits 4 --block 0:999", "set-bits 4 --block zero:1", "set-bits 4"}) {
    auto [rc, out] = Ctl(bad);
    EXPECT_NE(rc, 0) << bad;
    EXPECT_NE(out.find("pw-ctl:"), std::string::npos) << bad << ": " << out;
  }
  auto [rc, out] = Ctl("set-bits 4 --block 99:0");
  EXPECT_NE(out.find("layer 99 outside"), std::string::npos) << out;
  const std::string plan = run_dir_ + "/bad.yaml";
  std::ofstream(plan) << "blocks:\n  - {layer: 0, expert: 1, bits: 2}\n";
  std::tie(rc, out) = Ctl("apply " + plan);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("bad.yaml:2:"), std::string::npos) << out;
  std::ofstream(plan) << "blocks: [ {layer: 0\n";
  std::tie(rc, out) = Ctl("apply " + plan);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("bad.yaml"), std::string::npos) << out;
  EXPECT_EQ(epoch(), before);
}

TEST_F(PagedServing, RandomPlansUnderLoadWithABrokerKillLoseNothingAndLeakNoPage) {
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::string first_failure;
  std::mutex mu;
  auto prompts = Prompts(16, 5);
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (int i = c; !stop.load(); i += 4) {
        const std::string text = Complete(prompts[static_cast<size_t>(i) % prompts.size()], 16);
        if (text.rfind("HTTP ", 0) == 0 || text.rfind("bad reply", 0) == 0) {
          failed++;
          std::lock_guard<std::mutex> l(mu);
          if (first_failure.empty()) first_failure = text;
        } else {
          ok++;
        }
      }
    });
  }
  std::mt19937 rng(17);
  const auto t0 = std::chrono::steady_clock::now();
  bool killed = false;
  std::vector<pid_t> broker_pids;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(24)) {
    const int bits = 3 + static_cast<int>(rng() % 6);
    std::string args = "set-bits " + std::to_string(bits);
    switch (rng() % 3) {
      case 0: args += " --all"; break;
      case 1: args += " --layer " + std::to_string(rng() % 4); break;
      default: args += " --block " + std::to_string(rng() % 4) + ":" + std::to_string(rng() % 32); break;
    }
    (void)Ctl("--timeout-ms 1000 " + args);  // refused while the broker is down
    if (!killed && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
      broker_pids = PidsWithCmdline("--bind tcp://127.0.0.1:" + std::to_string(broker_port_));
      for (pid_t p : broker_pids) kill(p, SIGKILL);
      killed = !broker_pids.empty();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  stop = true;
  for (auto& t : clients) t.join();
  ASSERT_TRUE(killed);
  const auto now_pids = PidsWithCmdline("--bind tcp://127.0.0.1:" + std::to_string(broker_port_));
  ASSERT_EQ(now_pids.size(), 1u);
  EXPECT_NE(now_pids[0], broker_pids[0]);  // the launcher started a new broker
  EXPECT_EQ(failed.load(), 0) << first_failure << "\n" << Logs();
  EXPECT_GT(ok.load(), 20);
  // The restarted broker takes plans again and the worker commits them.
  for (int i = 0; i < 50 && Ctl("show").first != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ChangeAndWait("set-bits 5 --all");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(Metric("pagedweight_pool_balanced{"), 1) << Logs();
  EXPECT_EQ(Metric("pagedweight_pool_pages{tenant=\"kv\""), 0) << Logs();
  EXPECT_GT(Metric("pagedweight_plans_applied_total{"), 3);
  const int L = static_cast<int>(store_->info().num_layers), E = static_cast<int>(store_->info().num_experts);
  ExpectServedEqualsReference(anyprec::WidthMap::Uniform(5, L, E).value(), "after the stress");
}

}  // namespace
}  // namespace pw
