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
//     every request completes and the pool balances.
// Skips when the embedded model or its store (built with the Release build) is absent.
#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <thread>

#include "common/tokenizer.h"
#include "policies/misses/miss_policy.h"
#include "policies/misses/miss_settings.h"
#include "policies/misses/trace_replay.h"
#include "quant/apw_provider.h"
#include "services/engine/engine.h"
#include "services/engine/miss_routing_hook.h"
#include "tests/cluster/batch_invariance.h"
#include "tests/cluster/paged_node.h"
#include "tests/cluster/split_reference.h"

namespace pw {
namespace {

using testing::ReadFile;
constexpr int kBits = 4;

class ResidencyServing : public ::testing::Test {
 protected:
  // Starts the node with `misses` as the decode worker's misses block (YAML flow mapping).
  void Start(const std::string& misses) {
    if (const std::string why = testing::PagedNodeMissing(); !why.empty()) GTEST_SKIP() << why;
    testing::UseBatchInvariantKernels();
    testing::PagedNodeConfig c;
    c.name = std::string("residency-") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    c.initial_bits = kBits;
    c.decode_fields = "kv_blocks: 512, misses: " + misses;
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

}  // namespace
}  // namespace pw
