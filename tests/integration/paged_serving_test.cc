// Paged serving through the whole node (pw-cluster: broker serving the embedded model's .apw
// store, router, prefill, decode with one page pool), driven as an operator would: the OpenAI
// API over HTTP and pw-ctl. Checks that
//   - greedy completions served after a commit equal the in-process engine running the same
//     store at the same per-block widths (uniform 4, then 8 after `set-bits 8 --all`, then a
//     mixed plan from `pw-ctl apply`), token for token: node and reference run the
//     batch-invariant dense kernels, since the served batches differ from the reference's;
//   - pw-ctl refuses bad input (bits 2 or 9, a block outside the model, a malformed plan) with
//     a clear error and the plan epoch unchanged;
//   - under steady load with random plans every 300 ms and the broker SIGKILLed (and restarted
//     by the launcher) midway, every request completes and the decode worker's pool balances
//     to the page (pagedweight_pool_balanced), KV back to zero pages at the end.
// Skips when the embedded model or its store (built with the Release build) is absent.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <regex>
#include <thread>

#include "common/text/tokenizer.h"
#include "engine/experts/apw_expert_provider.h"
#include "engine/engine.h"
#include "tests/integration/paged_node.h"
#include "tests/integration/split_reference.h"
#include "tests/support/batch_invariance.h"
#include "common/formats/width_map.h"

namespace pw {
namespace {

using testing::PidsWithCmdline;

class PagedServing : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = testing::PagedNodeMissing(); !why.empty()) GTEST_SKIP() << why;
    testing::UseBatchInvariantKernels();
    testing::PagedNodeConfig c;
    c.name = std::string("paged-") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    Configure(&c);
    ASSERT_NO_FATAL_FAILURE(node_.Start(c));
    store_ = std::shared_ptr<const apw::ApwStore>(apw::ApwStore::Open(testing::TinyStorePath()).value().release());
  }
  virtual void Configure(testing::PagedNodeConfig*) {}
  // Runs a pw-ctl change and waits until the decode worker has committed its plan epoch.
  void ChangeAndWait(const std::string& args) {
    auto [rc, out] = node_.Ctl(args);
    ASSERT_EQ(rc, 0) << args << ": " << out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, std::regex("plan epoch (\\d+)"))) << out;
    const int epoch = std::stoi(m[1]);
    for (int i = 0; i < 600; ++i) {
      auto [src, shown] = node_.Ctl("show");
      std::smatch c;
      if (std::regex_search(shown, c, std::regex("committed epoch (\\d+), 0 change")) && std::stoi(c[1]) >= epoch) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << args << ": epoch " << epoch << " not committed\n" << node_.Ctl("show").second << node_.Logs();
  }
  std::vector<std::vector<int32_t>> Prompts(int n, uint32_t seed) {
    auto tok = Tokenizer::FromModelDir(testing::TinyModelDir()).value();
    return testing::SnippetPrompts(*tok, n, seed);
  }
  // The in-process engines as the cluster splits the work: the prompt on a prefill engine with
  // the checkpoint's bf16 experts (the default), or with `prefill_widths` the same store at
  // those widths; its KV pages copied to a decode engine whose experts come from the store at
  // `widths`; bf16 KV on both.
  std::vector<std::string> Reference(const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                                     const anyprec::WidthMap& widths,
                                     const anyprec::WidthMap* prefill_widths = nullptr) {
    auto tok = Tokenizer::FromModelDir(testing::TinyModelDir()).value();
    engine::EngineOptions eo;
    eo.kv_dtype = engine::KvDtype::kBf16;
    auto pre = engine::Engine::Create(testing::TinyModelDir(), eo).value();
    auto dec = engine::Engine::Create(testing::TinyModelDir(), eo).value();
    auto provider = anyprec::ApwExpertProvider::Create(store_, dec->model(), widths).value();
    engine::MoeHooks hooks;
    hooks.provider = provider.get();
    dec->SetMoeHooks(hooks);
    std::unique_ptr<anyprec::ApwExpertProvider> pre_provider;
    if (prefill_widths != nullptr) {
      pre_provider = anyprec::ApwExpertProvider::Create(store_, pre->model(), *prefill_widths).value();
      engine::MoeHooks pre_hooks;
      pre_hooks.provider = pre_provider.get();
      pre->SetMoeHooks(pre_hooks);
    }
    auto out = testing::SplitGreedy(*pre, *dec, *tok, prompts, max_tokens, /*one_at_a_time=*/false);
    dec->SetMoeHooks({});
    pre->SetMoeHooks({});
    return out;
  }
  void ExpectServedEqualsReference(const anyprec::WidthMap& widths, const char* what,
                                   const anyprec::WidthMap* prefill_widths = nullptr) {
    const int kMax = 20;
    auto prompts = Prompts(12, 99);
    auto ref = Reference(prompts, kMax, widths, prefill_widths);
    std::vector<std::future<std::string>> got;
    for (const auto& p : prompts) got.push_back(std::async(std::launch::async, [&, p] { return node_.Complete(p, kMax); }));
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i].get(), ref[i]) << what << ", prompt " << i;
  }

  testing::PagedNode node_;
  std::shared_ptr<const apw::ApwStore> store_;
};

TEST_F(PagedServing, GreedyOutputsEqualTheEngineAtTheCommittedWidths) {
  const int L = static_cast<int>(store_->info().num_layers), E = static_cast<int>(store_->info().num_experts);
  ExpectServedEqualsReference(anyprec::WidthMap::Uniform(4, L, E).value(), "initial 4 bits");
  const double weights4 = node_.Metric("pagedweight_pool_pages{tenant=\"weights\"");

  ChangeAndWait("set-bits 8 --all");
  EXPECT_GT(node_.Metric("pagedweight_pool_pages{tenant=\"weights\""), weights4);
  ExpectServedEqualsReference(anyprec::WidthMap::Uniform(8, L, E).value(), "after set-bits 8 --all");

  // A mixed plan: a whole layer at 3, one expert at 6, one down block at 5.
  const std::string plan = node_.run_dir() + "/plan.yaml";
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
  auto [rc, out] = node_.Ctl("show --layer 1");
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("decode-0"), std::string::npos) << out;
  EXPECT_EQ(node_.Metric("pagedweight_sync_fetches_total{"), 0);
}

// A node whose prefill worker reads the broker's store at 4 bits (what pw serve writes for a
// 4-bit node on a CPU whose fast path runs 4 bits): served greedy outputs equal the engines
// prefilling at 4 bits, and differ from the bf16-prefill reference on some prompt; a plan the
// decode worker commits leaves the prefill width where it is.
class PagedServingPrefillFromStore : public PagedServing {
 protected:
  void Configure(testing::PagedNodeConfig* c) override {
    c->store_for_prefill = true;
    c->prefill_extra = ", expert_bits: 4";
  }
};

TEST_F(PagedServingPrefillFromStore, GreedyOutputsEqualTheEnginePrefillingAtTheStoresWidth) {
  const int L = static_cast<int>(store_->info().num_layers), E = static_cast<int>(store_->info().num_experts);
  const anyprec::WidthMap four = anyprec::WidthMap::Uniform(4, L, E).value();
  ExpectServedEqualsReference(four, "4-bit decode, 4-bit prefill", &four);
  ChangeAndWait("set-bits 8 --all");
  ExpectServedEqualsReference(anyprec::WidthMap::Uniform(8, L, E).value(), "8-bit decode, 4-bit prefill", &four);
  // The option is not a no-op: prefilling at 4 bits changes some continuation here.
  const auto prompts = Prompts(12, 99);
  EXPECT_NE(Reference(prompts, 20, four, &four), Reference(prompts, 20, four));
}

TEST_F(PagedServing, PwCtlRefusesBadInputAndChangesNothing) {
  auto epoch = [&] {
    auto [rc, out] = node_.Ctl("show");
    std::smatch m;
    return std::regex_search(out, m, std::regex("plan epoch (\\d+)")) ? std::stoi(m[1]) : -1;
  };
  const int before = epoch();
  ASSERT_GE(before, 0);
  for (const char* bad : {"set-bits 2 --all", "set-bits 9 --all", "set-bits 4 --block 99:0",
                          "set-bits 4 --block 0:999", "set-bits 4 --block zero:1", "set-bits 4"}) {
    auto [rc, out] = node_.Ctl(bad);
    EXPECT_NE(rc, 0) << bad;
    EXPECT_NE(out.find("pw-ctl:"), std::string::npos) << bad << ": " << out;
  }
  auto [rc, out] = node_.Ctl("set-bits 4 --block 99:0");
  EXPECT_NE(out.find("layer 99 outside"), std::string::npos) << out;
  const std::string plan = node_.run_dir() + "/bad.yaml";
  std::ofstream(plan) << "blocks:\n  - {layer: 0, expert: 1, bits: 2}\n";
  std::tie(rc, out) = node_.Ctl("apply " + plan);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("bad.yaml:2:"), std::string::npos) << out;
  std::ofstream(plan) << "blocks: [ {layer: 0\n";
  std::tie(rc, out) = node_.Ctl("apply " + plan);
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
        const std::string text = node_.Complete(prompts[static_cast<size_t>(i) % prompts.size()], 16);
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
    (void)node_.Ctl("--timeout-ms 1000 " + args);  // refused while the broker is down
    if (!killed && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
      broker_pids = PidsWithCmdline("pw-broker --config " + node_.config_path() + " ");
      for (pid_t p : broker_pids) kill(p, SIGKILL);
      killed = !broker_pids.empty();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  stop = true;
  for (auto& t : clients) t.join();
  ASSERT_TRUE(killed);
  const auto now_pids = PidsWithCmdline("pw-broker --config " + node_.config_path() + " ");
  ASSERT_EQ(now_pids.size(), 1u);
  EXPECT_NE(now_pids[0], broker_pids[0]);  // the launcher started a new broker
  EXPECT_EQ(failed.load(), 0) << first_failure << "\n" << node_.Logs();
  EXPECT_GT(ok.load(), 20);
  // The restarted broker takes plans again and the worker commits them.
  for (int i = 0; i < 50 && node_.Ctl("show").first != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ChangeAndWait("set-bits 5 --all");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(node_.Metric("pagedweight_pool_balanced{"), 1) << node_.Logs();
  EXPECT_EQ(node_.Metric("pagedweight_pool_pages{tenant=\"kv\""), 0) << node_.Logs();
  EXPECT_GT(node_.Metric("pagedweight_plans_applied_total{"), 3);
  const int L = static_cast<int>(store_->info().num_layers), E = static_cast<int>(store_->info().num_experts);
  ExpectServedEqualsReference(anyprec::WidthMap::Uniform(5, L, E).value(), "after the stress");
}

}  // namespace
}  // namespace pw
