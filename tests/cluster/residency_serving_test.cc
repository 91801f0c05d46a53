// A decode worker with an expert residency budget, served through the whole node (pw-cluster:
// broker serving the embedded model's .apw store at 4 bits, router, prefill, decode with the
// cluster YAML's `misses:` block). Checks that
//   - greedy completions, one request at a time from a cold start, equal the in-process
//     emulation of the same policy and budget: the prompt on a bf16 prefill engine, decode on
//     an engine reading the same store at 4 bits with the miss policy as its routing hook and
//     no weight moves (as `pw-eval --residency --miss-policy` runs it) — and differ from
//     all-resident decoding, so the budget is really applied;
//   - the worker fetched into pool pages, substituted, evicted, and never held more experts
//     than the budget; its pool balances and /metrics passes `promtool check metrics`;
//   - with background admission (quality-first) under concurrent requests, admissions commit,
//     every request completes and the pool balances;
//   - the broker knows the worker's budget: it stops sending plans once the worker has them
//     (counted over a window of several resend periods), and a pw-ctl change still reaches the
//     worker once and its resident experts take the new width;
//   - the worker records the router logits of what it serves (the decode entry's `trace:`),
//     sampled and within its byte bound, into a trace that reads back and that pw-sim replays.
// Skips when the embedded model or its store (built with the Release build) is absent.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/tokenizer.h"
#include "policies/misses/miss_policy.h"
#include "policies/misses/miss_settings.h"
#include "policies/misses/router_trace.h"
#include "policies/misses/trace_replay.h"
#include "quant/apw_provider.h"
#include "services/engine/engine.h"
#include "services/engine/miss_routing_hook.h"
#include "tests/cluster/http_util.h"
#include "tests/cluster/process_util.h"

namespace pw {
namespace {

using nlohmann::json;
using testing::FreePort;
using testing::Http;
using testing::ReadFile;

std::string ModelDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }
std::string StorePath() { return std::string(PW_BINARY_DIR) + "/tiny-moe.apw"; }
std::string Bin(const std::string& name) { return std::string(PW_BINARY_DIR) + "/bin/" + name; }
constexpr int kBits = 4;

class ResidencyServing : public ::testing::Test {
 protected:
  // Starts the node with `misses` as the decode worker's misses block (YAML flow mapping).
  // `decode_extra`: more keys of the decode entry (", key: value").
  void Start(const std::string& misses, const std::string& decode_extra = "") {
    if (!std::filesystem::exists(ModelDir() + "/model.safetensors")) GTEST_SKIP() << "no weights in " << ModelDir();
    if (!std::filesystem::exists(StorePath())) GTEST_SKIP() << "no store " << StorePath() << " (built by the Release build)";
    http_port_ = FreePort();
    ctl_port_ = FreePort();
    broker_port_ = FreePort();
    decode_metrics_ = FreePort();
    broker_metrics_ = FreePort();
    run_dir_ = std::string(PW_BINARY_DIR) + "/test-tmp/residency-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(run_dir_);
    std::filesystem::create_directories(run_dir_);
    const std::string yaml = run_dir_ + "/cluster.yaml";
    std::ofstream(yaml) << "model_dir: " << ModelDir() << "\nmodel_name: tiny-moe\nrun_dir: " << run_dir_
                        << "\nbin_dir: " << PW_BINARY_DIR << "/bin\nheartbeat_ms: 300\ndrain_timeout_ms: 20000\n"
                        << "router: {port: " << http_port_ << ", control_port: " << ctl_port_ << ", lease_ms: 20000}\n"
                        << "broker: {control_port: " << broker_port_ << ", metrics_port: " << broker_metrics_
                        << ", store: " << StorePath() << ", initial_bits: " << kBits << "}\n"
                        << "prefill: [{id: prefill-0, kv_blocks: 256}]\n"
                        << "decode: [{id: decode-0, kv_blocks: 512, metrics_port: " << decode_metrics_
                        << ", misses: " << misses << decode_extra << "}]\n"
                        << "restart: {initial_backoff_ms: 200, max_backoff_ms: 2000}\n";
    ASSERT_TRUE(cluster_.Start({Bin("pw-cluster"), "up", "--config", yaml}, run_dir_ + "/pw-cluster.out"));
    ASSERT_TRUE(WaitServing(120)) << Logs();
    store_ = std::shared_ptr<const apw::ApwStore>(apw::ApwStore::Open(StorePath()).value().release());
  }
  void TearDown() override {
    cluster_.Kill(SIGKILL);
    if (ctl_port_ == 0) return;
    testing::KillNodeProcesses({ctl_port_, broker_port_});
  }
  // max_tokens 1: the first token comes from prefill, so the decode worker's policy sees
  // nothing of this probe.
  bool WaitServing(int timeout_s) { return testing::WaitServing(http_port_, timeout_s); }
  std::string Logs() { return testing::RunLogs(run_dir_); }
  std::string MetricsText() {
    auto [status, body] = Http(decode_metrics_, "GET", "/metrics", "", 10);
    return status == 200 ? body : "";
  }
  // A metric of the decode worker ("name{labels}" prefix; `port`: another process's), or -1.
  double Metric(const std::string& prefix, int port = 0) {
    std::string body = MetricsText();
    if (port != 0) {
      auto [status, text] = Http(port, "GET", "/metrics", "", 10);
      body = status == 200 ? text : "";
    }
    size_t at = body.find("\n" + prefix);
    if (at == std::string::npos) return -1;
    size_t sp = body.find(' ', at + 1 + prefix.size());
    return std::atof(body.c_str() + sp + 1);
  }
  // The worker exports its metrics at most every 200 ms: wait for a fresh export.
  void WaitMetricsFresh() { std::this_thread::sleep_for(std::chrono::milliseconds(700)); }
  std::string Complete(const std::vector<int32_t>& prompt, int max_tokens) {
    json req = {{"model", "tiny-moe"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
    auto [status, body] = Http(http_port_, "POST", "/v1/completions", req.dump());
    if (status != 200) return "HTTP " + std::to_string(status) + ": " + body;
    auto j = json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.contains("choices")) return "bad reply: " + body;
    return j["choices"][0]["text"].get<std::string>();
  }
  // The cluster's split in process, one request after another: prefill on a bf16 engine, its
  // KV pages copied to a decode engine reading the store at kBits; with `policy`, the miss
  // policy (cold, capacity from the same budget) as that engine's routing hook and residency.
  std::vector<std::string> Reference(const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                                     const misses::MissSettings* policy) {
    auto tok = Tokenizer::FromModelDir(ModelDir()).value();
    engine::EngineOptions eo;
    eo.kv_dtype = engine::KvDtype::kBf16;
    auto pre = engine::Engine::Create(ModelDir(), eo).value();
    auto dec = engine::Engine::Create(ModelDir(), eo).value();
    const auto& cfg = dec->model().config();
    const int L = static_cast<int>(cfg.num_layers), E = static_cast<int>(cfg.num_experts);
    auto provider = anyprec::ApwExpertProvider::Create(store_, dec->model(),
                                                       anyprec::WidthMap::Uniform(kBits, L, E).value()).value();
    engine::MoeHooks hooks;
    hooks.provider = provider.get();
    std::unique_ptr<misses::MissPolicy> mp;
    std::unique_ptr<engine::MissRoutingHook> hook;
    if (policy != nullptr) {
      const int k = static_cast<int>(cfg.num_experts_per_tok);
      misses::Budget b;
      b.fraction = policy->residency.value_or(0);
      const int cap = misses::CapacityFor(b, L, E, k, 0).value();
      mp = misses::MissPolicy::Create(misses::ToMissConfig(*policy).value(), L, E, k, cap).value();
      mp->set_record_events(false);
      hook = std::make_unique<engine::MissRoutingHook>(mp.get());
      hooks.routing_hook = hook.get();
      hooks.residency = hook.get();
    }
    dec->SetMoeHooks(hooks);
    engine::SamplingParams p;
    p.max_tokens = max_tokens;
    std::vector<std::string> out;
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
      std::vector<int32_t> toks = {first->first_token};
      EXPECT_TRUE(dec->AddPrefilledSequence(i, prompts[i], dst, first->first_token, p).ok());
      while (dec->HasWork()) {
        auto step = dec->Step();
        if (!step.ok()) {
          ADD_FAILURE() << step.status().ToString();
          break;
        }
        for (auto& u : step->updates) for (int32_t t : u.new_tokens) toks.push_back(t);
      }
      out.push_back(tok->Decode(toks, /*skip_special_tokens=*/true).value());
    }
    if (mp) substitutions_ = mp->stats().substitutions;
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
  void ExpectPromtoolClean() {
    if (std::system("command -v promtool >/dev/null 2>&1") != 0) return;  // checked where installed
    const std::string path = run_dir_ + "/metrics.txt";
    std::ofstream(path) << MetricsText();
    const std::string cmd = "promtool check metrics < " + path + " > " + path + ".out 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << ReadFile(path + ".out");
  }

  testing::ChildProcess cluster_;
  // Runs pw-ctl against the node's broker; returns {exit code, output}.
  std::pair<int, std::string> Ctl(const std::string& args) {
    const std::string cmd = Bin("pw-ctl") + " --broker tcp://127.0.0.1:" + std::to_string(broker_port_) +
                            " --control-keys " + run_dir_ + "/control.keys " + args + " 2>&1";
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return {-1, ""};
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int st = pclose(p);
    return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
  }
  double PlansSent() { return Metric("pagedweight_broker_plans_sent_total", broker_metrics_); }

  int http_port_ = 0, ctl_port_ = 0, broker_port_ = 0, decode_metrics_ = 0, broker_metrics_ = 0;
  std::string run_dir_;
  std::shared_ptr<const apw::ApwStore> store_;
  int64_t substitutions_ = 0;
};

TEST_F(ResidencyServing, GreedyOutputsEqualTheEmulationOfTheSamePolicyAndBudget) {
  Start("{policy: rule-0.15, eviction: lfu, residency: 0.25}");
  if (IsSkipped() || HasFatalFailure()) return;
  misses::MissSettings s;
  s.policy = "rule-0.15";
  s.eviction = "lfu";
  s.residency = 0.25;
  const int kMax = 24;
  auto prompts = Prompts(6, 41);
  auto want = Reference(prompts, kMax, &s);
  ASSERT_GT(substitutions_, 0);
  auto all_resident = Reference(prompts, kMax, nullptr);
  int differ = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(Complete(prompts[i], kMax), want[i]) << "prompt " << i << "\n" << Logs();
    differ += want[i] != all_resident[i] ? 1 : 0;
  }
  EXPECT_GT(differ, 0) << "the budget changes no output: the test could not tell";
  WaitMetricsFresh();
  EXPECT_EQ(Metric("pagedweight_expert_misses_total{action=\"substituted\""), static_cast<double>(substitutions_));
  EXPECT_GT(Metric("pagedweight_expert_fetches_total{path=\"pages\""), 0);
  EXPECT_GT(Metric("pagedweight_expert_evictions_total{"), 0);
  EXPECT_GT(Metric("pagedweight_substituted_gate_mass_total{"), 0);
  const double capacity = Metric("pagedweight_experts_resident_capacity{");
  EXPECT_EQ(capacity, 8 * 4);  // 25 % of 32 experts in each of 4 layers
  EXPECT_LE(Metric("pagedweight_experts_resident{"), capacity);
  EXPECT_GT(Metric("pagedweight_experts_resident{"), 0);
  EXPECT_EQ(Metric("pagedweight_pool_balanced{"), 1);
  EXPECT_GT(Metric("pagedweight_pool_pages{tenant=\"weights\""), 0);
  EXPECT_EQ(Metric("pagedweight_weight_changes_pending{"), 0);
  ExpectPromtoolClean();
}

TEST_F(ResidencyServing, AdmissionsCommitUnderConcurrentRequests) {
  Start("{policy: quality-first, residency: 0.25, admission_beta: 0.3}");
  if (IsSkipped() || HasFatalFailure()) return;
  auto prompts = Prompts(12, 7);
  std::vector<std::future<std::string>> got;
  for (const auto& p : prompts) got.push_back(std::async(std::launch::async, [&, p] { return Complete(p, 24); }));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string text = got[i].get();
    EXPECT_TRUE(text.rfind("HTTP ", 0) != 0 && text.rfind("bad reply", 0) != 0) << text << "\n" << Logs();
  }
  WaitMetricsFresh();
  EXPECT_GT(Metric("pagedweight_expert_admissions_total{state=\"started\""), 0) << Logs();
  EXPECT_GT(Metric("pagedweight_expert_admissions_total{state=\"committed\""), 0) << Logs();
  EXPECT_GT(Metric("pagedweight_expert_misses_total{action=\"fetched\""), 0);
  EXPECT_LE(Metric("pagedweight_experts_resident{"), Metric("pagedweight_experts_resident_capacity{"));
  EXPECT_EQ(Metric("pagedweight_pool_balanced{"), 1);
  EXPECT_EQ(Metric("pagedweight_pool_pages{tenant=\"kv\""), 0) << Logs();
  ExpectPromtoolClean();
}

TEST_F(ResidencyServing, TheBrokerStopsResendingPlansToABudgetedWorker) {
  Start("{policy: rule-0.15, eviction: lfu, residency: 0.25}");
  if (IsSkipped() || HasFatalFailure()) return;
  auto prompts = Prompts(3, 5);
  for (const auto& p : prompts) ASSERT_EQ(Complete(p, 16).rfind("HTTP ", 0), std::string::npos) << Logs();
  // Non-resident blocks sit at 0 while the broker's desired width is 4: without knowing the
  // budget the broker would resend every plan_resend_ms (1 s), i.e. about 4 plans in 4 s.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const double before = PlansSent();
  ASSERT_GE(before, 1) << "the worker never got its first plan\n" << Logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(4000));
  EXPECT_EQ(PlansSent(), before) << "plans resent to a budgeted worker\n" << Logs();
  auto [src, shown] = Ctl("show");
  EXPECT_EQ(src, 0) << shown;
  EXPECT_NE(shown.find("0 change(s) pending; residency budget 8 experts per layer"), std::string::npos) << shown;

  // A change still reaches it, once; the experts it makes resident afterwards take the width.
  const double applied = Metric("pagedweight_plans_applied_total{");
  auto [rc, out] = Ctl("set-bits 5 --all");
  ASSERT_EQ(rc, 0) << out;
  for (const auto& p : Prompts(3, 6)) ASSERT_EQ(Complete(p, 16).rfind("HTTP ", 0), std::string::npos) << Logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const double after_change = PlansSent();
  EXPECT_GT(after_change, before);
  EXPECT_GT(Metric("pagedweight_plans_applied_total{"), applied);
  EXPECT_GT(Metric("pagedweight_weight_bytes{bits=\"5\""), 0) << MetricsText();
  EXPECT_LE(Metric("pagedweight_experts_resident{"), Metric("pagedweight_experts_resident_capacity{"));
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  EXPECT_EQ(PlansSent(), after_change) << Logs();
}

TEST_F(ResidencyServing, TheWorkerRecordsASampledBoundedTraceThatPwSimReplays) {
  const std::string dir = std::string(PW_BINARY_DIR) + "/test-tmp/residency-trace";
  std::filesystem::create_directories(dir);
  const std::string trace = dir + "/decode.trace";
  std::filesystem::remove(trace);
  constexpr uint64_t kCap = 10000;  // bytes: a few dozen of the decode steps below
  Start("{policy: speed-first, residency: 0.5}",
        ", trace: {path: " + trace + ", max_mb: " + std::to_string(kCap / 1e6) + ", sample: 2}");
  if (IsSkipped() || HasFatalFailure()) return;
  for (const auto& p : Prompts(6, 9)) ASSERT_EQ(Complete(p, 24).rfind("HTTP ", 0), std::string::npos) << Logs();
  // The end record is written when the worker stops.
  cluster_.Kill(SIGTERM);
  ASSERT_EQ(cluster_.Wait(60000), 0) << Logs();
  ASSERT_TRUE(std::filesystem::exists(trace)) << Logs();
  EXPECT_LE(std::filesystem::file_size(trace), kCap);
  auto t = misses::RouterTrace::Read(trace);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->header.num_layers, 4u);
  EXPECT_EQ(t->header.num_experts, 32u);
  ASSERT_GT(t->layers.size(), 8u);
  EXPECT_EQ(t->counts.layer_records, t->layers.size());
  // About 6 x 23 decode passes of 4 layers: sampling alone would drop about as many records as
  // it keeps; the byte bound drops far more.
  EXPECT_GT(t->counts.dropped_records, 2 * t->counts.layer_records);
  for (size_t i = 0; i < t->layers.size(); ++i) {
    const auto& l = t->layers[i];
    EXPECT_EQ(l.step % 2, 0u) << "record " << i << " of an unsampled pass";
    EXPECT_EQ(l.layer, i % 4) << "record " << i;
    ASSERT_EQ(l.num_tokens(), 1u);  // one request at a time: one decode token a pass
    EXPECT_GT(l.positions[0], 0);   // decode tokens follow their prompt
    EXPECT_EQ(l.experts.size(), t->header.top_k);
  }
  ASSERT_EQ(std::system((Bin("pw-sim") + " --trace " + trace + " --residency 0.25 --miss-policy speed-first > " +
                         dir + "/sim.out 2>&1").c_str()),
            0)
      << ReadFile(dir + "/sim.out");
  const std::string sim = ReadFile(dir + "/sim.out");
  // speed-first = first-choice + LFU + admission; its replay of what the worker served.
  EXPECT_NE(sim.find("\npolicy first-choice lfu"), std::string::npos) << sim;
  EXPECT_NE(sim.find("\ntokens " + std::to_string(t->layers.size() / 4) + "\n"), std::string::npos) << sim;
}

}  // namespace
}  // namespace pw
