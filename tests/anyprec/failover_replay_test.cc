// A stream taken over after its decode worker was lost, as the cluster serves it: the prompt's
// KV from a prefill engine with bf16 experts, and the KV of the tokens already streamed computed
// by the decode engine itself, with its 8-bit experts, in prompt chunks
// (Engine::AddPrefilledSequence's num_uncached). Its continuation (tokens and logits, bit for
// bit) is the one of the engine that decoded those tokens one step at a time, and a sequence
// decoding beside the chunks is not disturbed. A bf16 re-prefill of the streamed tokens gives
// other logits: the test can tell the two apart.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/apw_store.h"
#include "engine/experts/apw_expert_provider.h"
#include "quant/quantize_model.h"
#include "engine/engine.h"
#include "tests/support/batch_invariance.h"

namespace pw::anyprec {
namespace {

// Before any kernel table is chosen: a token's numerics must not depend on its batch (the
// cluster's tests run so; the AVX2 tables are invariant anyway, AVX-512's GEMV is not).
const bool kBatchInvariant = (testing::UseBatchInvariantKernels(), true);

const std::string kModel = std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/qwen2_moe";
constexpr int kBlock = 4;
constexpr int kMaxTokens = 24;
constexpr int kStreamed = 9;  // tokens streamed when the decode worker is lost

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // one row per token
};

class FailoverReplay : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kBatchInvariant);
    store_path_ = ::testing::TempDir() + "/failover_replay_" + std::to_string(::getpid()) + ".apw";
    QuantizeModelOptions o;
    o.model_dir = kModel;
    o.tokenizer_path = "/nonexistent/tokenizer.json";  // random-token calibration reads none
    o.calib_random_tokens = 300;
    o.calib_seed = 1;
    o.out_path = store_path_;
    o.threads = 2;
    o.ctx = 64;
    o.progress = false;
    auto q = QuantizeModel(o);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    auto pre =
        engine::Engine::Create(kModel, {.block_size = kBlock, .kv_dtype = engine::KvDtype::kBf16});
    // Chunks of at most 7 tokens: the streamed tokens take two steps.
    auto dec = engine::Engine::Create(kModel, {.block_size = kBlock,
                                               .max_batch_tokens = 7,
                                               .return_logits = true,
                                               .kv_dtype = engine::KvDtype::kBf16});
    ASSERT_TRUE(pre.ok() && dec.ok());
    pre_ = std::move(*pre);
    dec_ = std::move(*dec);
    auto store = apw::ApwStore::Open(store_path_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto widths = WidthMap::Uniform(8, 2, 8);
    ASSERT_TRUE(widths.ok());
    auto provider = ApwExpertProvider::Create(std::move(store).value(), dec_->model(), *widths);
    ASSERT_TRUE(provider.ok()) << provider.status().ToString();
    provider_ = std::move(*provider);
    engine::MoeHooks hooks;
    hooks.provider = provider_.get();
    dec_->SetMoeHooks(hooks);
    for (int p = 0; p < 2; ++p) {
      std::vector<int32_t> ids;
      for (int i = 0; i < 11 + 6 * p; ++i) ids.push_back((i * 193 + 11 + 977 * p) % 4000);
      prompts_.push_back(ids);
    }
    greedy_.max_tokens = kMaxTokens;
    greedy_.ignore_eos = true;
    sampled_ = greedy_;
    sampled_.temperature = 1.0f;
    sampled_.top_k = 20;
    sampled_.seed = 5;
  }
  void TearDown() override { std::remove(store_path_.c_str()); }

  // Prefills `tokens` on the bf16 engine (the first num_generated_before of them counting as
  // output) and copies the KV into fresh decode blocks, `extra_blocks` more than it needs.
  std::vector<int32_t> PrefillInto(const std::vector<int32_t>& tokens,
                                   const engine::SamplingParams& sp, int num_generated_before,
                                   int extra_blocks, int32_t* first) {
    const int nb = engine::BlocksForTokens(static_cast<int>(tokens.size()), kBlock);
    auto src = pre_->LeaseKvBlocks(nb);
    auto dst = dec_->LeaseKvBlocks(nb + extra_blocks);
    EXPECT_TRUE(src.ok() && dst.ok());
    if (!src.ok() || !dst.ok()) return {};
    auto pr = pre_->Prefill(tokens, *src, sp, num_generated_before);
    EXPECT_TRUE(pr.ok()) << pr.status().ToString();
    if (first != nullptr && pr.ok()) *first = pr->first_token;
    const engine::KvLayout& kl = dec_->kv_pool().layout();
    for (int b = 0; b < nb; ++b) {
      for (int l = 0; l < kl.num_layers; ++l) {
        std::memcpy(dec_->LeasedKvPage((*dst)[b], l),
                    pre_->kv_pool().LayerPage((*src)[b], l), kl.bytes_per_layer());
      }
    }
    EXPECT_TRUE(pre_->ReturnKvBlocks(*src).ok());
    return *dst;
  }

  std::map<engine::SeqId, Trace> RunDecode() {
    std::map<engine::SeqId, Trace> out;
    while (dec_->HasWork()) {
      auto r = dec_->Step();
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok()) break;
      for (auto& u : r->updates) {
        for (int32_t t : u.new_tokens) out[u.id].tokens.push_back(t);
        if (!u.new_tokens.empty()) out[u.id].logits.push_back(u.logits);
      }
    }
    return out;
  }

  std::string store_path_;
  std::unique_ptr<engine::Engine> pre_, dec_;
  std::unique_ptr<ApwExpertProvider> provider_;
  std::vector<std::vector<int32_t>> prompts_;
  engine::SamplingParams greedy_, sampled_;
};

TEST_F(FailoverReplay, StreamedTokensComputedHereContinueBitForBit) {
  const engine::SamplingParams* params[2] = {&sampled_, &greedy_};
  // Undisturbed: both decode together from their first token on.
  Trace ref[2];
  for (int i = 0; i < 2; ++i) {
    int32_t first = -1;
    auto blocks = PrefillInto(prompts_[i], *params[i], 0, 0, &first);
    ASSERT_TRUE(dec_->AddPrefilledSequence(i, prompts_[i], blocks, first, *params[i]).ok());
    ref[i].tokens.push_back(first);
  }
  auto run = RunDecode();
  for (int i = 0; i < 2; ++i) {
    ref[i].tokens.insert(ref[i].tokens.end(), run[i].tokens.begin(), run[i].tokens.end());
    ref[i].logits = run[i].logits;  // of output tokens 1..
    ASSERT_EQ(ref[i].tokens.size(), static_cast<size_t>(kMaxTokens)) << i;
  }

  // Sequence 0 taken over after kStreamed tokens: the prompt's KV from the prefill engine, the
  // streamed tokens before the last computed here, in chunks, while sequence 1 decodes from
  // its first token beside them.
  std::vector<int32_t> streamed = prompts_[0];
  streamed.insert(streamed.end(), ref[0].tokens.begin(), ref[0].tokens.begin() + kStreamed - 1);
  auto blocks0 = PrefillInto(prompts_[0], sampled_, 0, 3, nullptr);
  ASSERT_TRUE(dec_->AddPrefilledSequence(0, streamed, blocks0, ref[0].tokens[kStreamed - 1],
                                         sampled_, kStreamed - 1, kStreamed - 1)
                  .ok());
  int32_t first1 = -1;
  auto blocks1 = PrefillInto(prompts_[1], greedy_, 0, 0, &first1);
  ASSERT_EQ(first1, ref[1].tokens[0]);
  ASSERT_TRUE(dec_->AddPrefilledSequence(1, prompts_[1], blocks1, first1, greedy_).ok());
  auto taken = RunDecode();
  EXPECT_EQ(taken[0].tokens,
            std::vector<int32_t>(ref[0].tokens.begin() + kStreamed, ref[0].tokens.end()));
  ASSERT_EQ(taken[0].logits.size(), static_cast<size_t>(kMaxTokens - kStreamed));
  for (int t = kStreamed; t < kMaxTokens; ++t) {
    EXPECT_EQ(taken[0].logits[t - kStreamed], ref[0].logits[t - 1]) << "output token " << t;
  }
  EXPECT_EQ(taken[1].tokens, std::vector<int32_t>(ref[1].tokens.begin() + 1, ref[1].tokens.end()));
  EXPECT_EQ(taken[1].logits, ref[1].logits);

  // What recovery did before: prompt + streamed tokens re-prefilled with bf16 experts. The KV
  // of the streamed tokens is not what the 8-bit engine made, nor are the next logits.
  int32_t first = -1;
  auto blocks = PrefillInto(streamed, sampled_, kStreamed - 1, 0, &first);
  ASSERT_TRUE(dec_->AddPrefilledSequence(0, streamed, blocks, ref[0].tokens[kStreamed - 1],
                                         sampled_, kStreamed - 1)
                  .ok());
  auto bf16 = RunDecode();
  ASSERT_FALSE(bf16[0].logits.empty());
  EXPECT_NE(bf16[0].logits[0], ref[0].logits[kStreamed - 1]);
  EXPECT_EQ(dec_->kv_pool().num_free(), dec_->kv_pool().num_blocks());
}

}  // namespace
}  // namespace pw::anyprec
