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
//     sampled and within its byte bound, into a trace that reads back (while the worker runs
//     too: every record it wrote, cut short before the end record) and that pw-sim replays,
//     also when cut inside its last record.
// Skips when the embedded model or its store (built with the Release build) is absent.
#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <thread>

#include "common/text/tokenizer.h"
#include "policies/misses/miss_policy.h"
#include "policies/misses/miss_settings.h"
#include "policies/misses/router_trace.h"
#include "policies/misses/trace_replay.h"
#include "engine/experts/apw_expert_provider.h"
#include "engine/engine.h"
#include "engine/hooks/miss_routing_hook.h"
#include "tests/integration/paged_node.h"
#include "tests/integration/split_reference.h"
#include "tests/support/batch_invariance.h"
#include "common/formats/width_map.h"

namespace pw {
namespace {

using testing::ReadFile;
constexpr int kBits = 4;

class ResidencyServing : public ::testing::Test {
 protected:
  // Starts the node with `misses` as the decode worker's misses block (YAML flow mapping).
  // `decode_extra`: more keys of the decode entry (", key: value").
  void Start(const std::string& misses, const std::string& decode_extra = "") {
    if (const std::string why = testing::PagedNodeMissing(); !why.empty()) GTEST_SKIP() << why;
    testing::UseBatchInvariantKernels();
    testing::PagedNodeConfig c;
    c.name = std::string("residency-") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    c.initial_bits = kBits;
    c.decode_fields = "kv_blocks: 512, misses: " + misses + decode_extra;
    ASSERT_NO_FATAL_FAILURE(node_.Start(c));
    store_ = std::shared_ptr<const apw::ApwStore>(apw::ApwStore::Open(testing::TinyStorePath()).value().release());
  }
  // The worker exports its metrics at most every 200 ms: wait for a fresh export.
  void WaitMetricsFresh() { std::this_thread::sleep_for(std::chrono::milliseconds(700)); }
  std::vector<std::vector<int32_t>> Prompts(int n, uint32_t seed) {
    auto tok = Tokenizer::FromModelDir(testing::TinyModelDir()).value();
    return testing::SnippetPrompts(*tok, n, seed);
  }
  // The cluster's split in process, one request after another: prefill on a bf16 engine, its
  // KV pages copied to a decode engine reading the store at kBits; with `policy`, the miss
  // policy (cold, capacity from the same budget) as that engine's routing hook and residency.
  std::vector<std::string> Reference(const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                                     const misses::MissSettings* policy) {
    auto tok = Tokenizer::FromModelDir(testing::TinyModelDir()).value();
    engine::EngineOptions eo;
    eo.kv_dtype = engine::KvDtype::kBf16;
    auto pre = engine::Engine::Create(testing::TinyModelDir(), eo).value();
    auto dec = engine::Engine::Create(testing::TinyModelDir(), eo).value();
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
    auto out = testing::SplitGreedy(*pre, *dec, *tok, prompts, max_tokens, /*one_at_a_time=*/true);
    if (mp) substitutions_ = mp->stats().substitutions;
    dec->SetMoeHooks({});
    return out;
  }
  void ExpectPromtoolClean() {
    if (std::system("command -v promtool >/dev/null 2>&1") != 0) return;  // checked where installed
    const std::string path = node_.run_dir() + "/metrics.txt";
    std::ofstream(path) << node_.MetricsText();
    const std::string cmd = "promtool check metrics < " + path + " > " + path + ".out 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << ReadFile(path + ".out");
  }

  double PlansSent() { return node_.Metric("pagedweight_broker_plans_sent_total", node_.broker_metrics_port()); }

  testing::PagedNode node_;
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
    EXPECT_EQ(node_.Complete(prompts[i], kMax), want[i]) << "prompt " << i << "\n" << node_.Logs();
    differ += want[i] != all_resident[i] ? 1 : 0;
  }
  EXPECT_GT(differ, 0) << "the budget changes no output: the test could not tell";
  WaitMetricsFresh();
  EXPECT_EQ(node_.Metric("pagedweight_expert_misses_total{action=\"substituted\""), static_cast<double>(substitutions_));
  EXPECT_GT(node_.Metric("pagedweight_expert_fetches_total{path=\"pages\""), 0);
  // Every fetch into pages has its phases; every step that fetched, its wait.
  for (const char* phase : {"get", "check", "table"}) {
    EXPECT_EQ(node_.Metric(std::string("pagedweight_expert_fetch_phase_seconds_count{phase=\"") + phase + "\""),
              node_.Metric("pagedweight_expert_fetches_total{path=\"pages\""))
        << phase;
  }
  EXPECT_GT(node_.Metric("pagedweight_expert_fetch_phase_seconds_sum{phase=\"get\""), 0);
  EXPECT_GT(node_.Metric("pagedweight_step_fetch_wait_seconds_count{"), 0);
  EXPECT_LE(node_.Metric("pagedweight_step_fetch_wait_seconds_sum{"),
            node_.Metric("pagedweight_expert_fetch_seconds_sum{") + 1e-9);
  EXPECT_GT(node_.Metric("pagedweight_expert_evictions_total{"), 0);
  EXPECT_GT(node_.Metric("pagedweight_substituted_gate_mass_total{"), 0);
  const double capacity = node_.Metric("pagedweight_experts_resident_capacity{");
  EXPECT_EQ(capacity, 8 * 4);  // 25 % of 32 experts in each of 4 layers
  EXPECT_LE(node_.Metric("pagedweight_experts_resident{"), capacity);
  EXPECT_GT(node_.Metric("pagedweight_experts_resident{"), 0);
  EXPECT_EQ(node_.Metric("pagedweight_pool_balanced{"), 1);
  EXPECT_GT(node_.Metric("pagedweight_pool_pages{tenant=\"weights\""), 0);
  EXPECT_EQ(node_.Metric("pagedweight_weight_changes_pending{"), 0);
  ExpectPromtoolClean();
}

TEST_F(ResidencyServing, AdmissionsCommitUnderConcurrentRequests) {
  Start("{policy: quality-first, residency: 0.25, admission_beta: 0.3}");
  if (IsSkipped() || HasFatalFailure()) return;
  auto prompts = Prompts(12, 7);
  std::vector<std::future<std::string>> got;
  for (const auto& p : prompts) got.push_back(std::async(std::launch::async, [&, p] { return node_.Complete(p, 24); }));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string text = got[i].get();
    EXPECT_TRUE(text.rfind("HTTP ", 0) != 0 && text.rfind("bad reply", 0) != 0) << text << "\n" << node_.Logs();
  }
  WaitMetricsFresh();
  EXPECT_GT(node_.Metric("pagedweight_expert_admissions_total{state=\"started\""), 0) << node_.Logs();
  EXPECT_GT(node_.Metric("pagedweight_expert_admissions_total{state=\"committed\""), 0) << node_.Logs();
  EXPECT_GT(node_.Metric("pagedweight_expert_misses_total{action=\"fetched\""), 0);
  EXPECT_LE(node_.Metric("pagedweight_experts_resident{"), node_.Metric("pagedweight_experts_resident_capacity{"));
  EXPECT_EQ(node_.Metric("pagedweight_pool_balanced{"), 1);
  EXPECT_EQ(node_.Metric("pagedweight_pool_pages{tenant=\"kv\""), 0) << node_.Logs();
  ExpectPromtoolClean();
}

TEST_F(ResidencyServing, TheBrokerStopsResendingPlansToABudgetedWorker) {
  Start("{policy: rule-0.15, eviction: lfu, residency: 0.25}");
  if (IsSkipped() || HasFatalFailure()) return;
  auto prompts = Prompts(3, 5);
  for (const auto& p : prompts) ASSERT_EQ(node_.Complete(p, 16).rfind("HTTP ", 0), std::string::npos) << node_.Logs();
  // Non-resident blocks sit at 0 while the broker's desired width is 4: without knowing the
  // budget the broker would resend every plan_resend_ms (1 s), i.e. about 4 plans in 4 s.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const double before = PlansSent();
  ASSERT_GE(before, 1) << "the worker never got its first plan\n" << node_.Logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(4000));
  EXPECT_EQ(PlansSent(), before) << "plans resent to a budgeted worker\n" << node_.Logs();
  auto [src, shown] = node_.Ctl("show");
  EXPECT_EQ(src, 0) << shown;
  EXPECT_NE(shown.find("0 change(s) pending; residency budget 8 experts per layer"), std::string::npos) << shown;

  // A change still reaches it, once; the experts it makes resident afterwards take the width.
  const double applied = node_.Metric("pagedweight_plans_applied_total{");
  auto [rc, out] = node_.Ctl("set-bits 5 --all");
  ASSERT_EQ(rc, 0) << out;
  for (const auto& p : Prompts(3, 6)) ASSERT_EQ(node_.Complete(p, 16).rfind("HTTP ", 0), std::string::npos) << node_.Logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const double after_change = PlansSent();
  EXPECT_GT(after_change, before);
  EXPECT_GT(node_.Metric("pagedweight_plans_applied_total{"), applied);
  EXPECT_GT(node_.Metric("pagedweight_weight_bytes{bits=\"5\""), 0) << node_.MetricsText();
  EXPECT_LE(node_.Metric("pagedweight_experts_resident{"), node_.Metric("pagedweight_experts_resident_capacity{"));
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  EXPECT_EQ(PlansSent(), after_change) << node_.Logs();
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
  for (const auto& p : Prompts(6, 9)) ASSERT_EQ(node_.Complete(p, 24).rfind("HTTP ", 0), std::string::npos) << node_.Logs();
  WaitMetricsFresh();
  const double written = node_.Metric("pagedweight_decode_trace_records_total{result=\"written\"");
  const double dropped = node_.Metric("pagedweight_decode_trace_records_total{result=\"dropped\"");
  const double bytes = node_.Metric("pagedweight_decode_trace_bytes{");
  ExpectPromtoolClean();
  // While the worker runs, the file holds every record it wrote: at the bound the writer
  // flushes (every record is one token, so none is written after the first drop). No end
  // record yet: a reader sees a trace cut short at a record boundary.
  {
    auto live = misses::RouterTrace::Read(trace);
    ASSERT_TRUE(live.ok()) << live.status().ToString();
    EXPECT_FALSE(live->tail.complete);
    EXPECT_EQ(live->tail.torn_bytes, 0u) << live->tail.message;
    EXPECT_EQ(static_cast<double>(live->layers.size()), written) << live->tail.message;
  }
  // The end record is written when the worker stops.
  ASSERT_EQ(node_.Terminate(60000), 0) << node_.Logs();
  ASSERT_TRUE(std::filesystem::exists(trace)) << node_.Logs();
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
  // The metrics said the same before the worker stopped (no pass ran since).
  EXPECT_EQ(written, static_cast<double>(t->counts.layer_records));
  EXPECT_EQ(dropped, static_cast<double>(t->counts.dropped_records));
  EXPECT_GT(bytes, 0);
  EXPECT_LT(bytes, static_cast<double>(std::filesystem::file_size(trace)));  // the end record came later
  for (size_t i = 0; i < t->layers.size(); ++i) {
    const auto& l = t->layers[i];
    EXPECT_EQ(l.step % 2, 0u) << "record " << i << " of an unsampled pass";
    EXPECT_EQ(l.layer, i % 4) << "record " << i;
    ASSERT_EQ(l.num_tokens(), 1u);  // one request at a time: one decode token a pass
    EXPECT_GT(l.positions[0], 0);   // decode tokens follow their prompt
    EXPECT_EQ(l.experts.size(), t->header.top_k);
  }
  ASSERT_EQ(std::system((testing::BinPath("pw-sim") + " --trace " + trace + " --residency 0.25 --miss-policy speed-first > " +
                         dir + "/sim.out 2>&1").c_str()),
            0)
      << ReadFile(dir + "/sim.out");
  const std::string sim = ReadFile(dir + "/sim.out");
  // speed-first = first-choice + LFU + admission; its replay of what the worker served.
  EXPECT_NE(sim.find("\npolicy first-choice lfu"), std::string::npos) << sim;
  EXPECT_NE(sim.find("\ntokens " + std::to_string(t->layers.size() / 4) + "\n"), std::string::npos) << sim;
  EXPECT_NE(sim.find("\ntrace_complete 1\n"), std::string::npos) << sim;
  // The same trace as a full disk would have left it: cut 40 bytes into its last layer record
  // (one token: 16 + 16 + 12 + 2 * 32 + 6 * 4 = 132 bytes), no end record (48 bytes). pw-sim
  // replays the other records, says what was torn, and exits 0.
  const std::string cut = dir + "/decode-cut.trace";
  std::filesystem::copy_file(trace, cut, std::filesystem::copy_options::overwrite_existing);
  const uint64_t whole = std::filesystem::file_size(trace) - 48 - 132;
  std::filesystem::resize_file(cut, whole + 40);
  ASSERT_EQ(
      std::system((testing::BinPath("pw-sim") + " --trace " + cut +
                   " --residency 0.25 --miss-policy speed-first > " + dir + "/sim-cut.out 2>&1")
                      .c_str()),
      0)
      << ReadFile(dir + "/sim-cut.out");
  const std::string sim_cut = ReadFile(dir + "/sim-cut.out");
  EXPECT_NE(sim_cut.find("\ntrace_complete 0\n"), std::string::npos) << sim_cut;
  EXPECT_NE(sim_cut.find("\ntrace_layer_records " + std::to_string(t->layers.size() - 1) + "\n"),
            std::string::npos)
      << sim_cut;
  EXPECT_NE(sim_cut.find("\ntrace_torn_bytes 40\n"), std::string::npos) << sim_cut;
  EXPECT_NE(sim_cut.find("record " + std::to_string(t->layers.size() - 1) + " at byte " +
                         std::to_string(whole) + " is torn (40 of 132 bytes), ignored"),
            std::string::npos)
      << sim_cut;
}

}  // namespace
}  // namespace pw
