// Engine correctness on the tiny random checkpoints of every supported model type
// (tests/fixtures/models/<type>, references computed by HF transformers in fp32 from the bf16
// weights): logits vs the reference, chunked prefill, decode vs teacher forcing, batched and
// continuous batching vs each sequence alone, disaggregated prefill/decode, preemption and
// recompute, the MoE seams, and bad input.
//
// Tolerances: 2e-3 max abs against HF (different summation order and exp implementation);
// 1e-4 between two runs of this engine that differ only in batching or chunking.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <tuple>

#include "common/formats/safetensors.h"
#include "engine/models/model.h"
#include "engine/layers/moe_layer.h"
#include "engine/eval/perplexity.h"
#include "tests/engine/test_util.h"
#include "engine/experts/bf16_expert_provider.h"

namespace pw::engine {
namespace {

// Batched runs are compared with each sequence alone (test_util.h).
[[maybe_unused]] const bool kBatchInvariantKernels = testing::UseBatchInvariantKernels();

using testing::FixtureModelDir;
using testing::ReadRefLogits;

// glm4_moe_grouped: a second glm4_moe checkpoint (n_group 4, topk_group 2, qk norm, two shared
// experts, no attention bias); tests/fixtures/README.md.
// qwen3_next: the linear-attention hybrid (Gated DeltaNet layers with a recurrent state per
// sequence, output-gated full attention), prompts up to 150 ids; qwen3_5_moe: Qwen3.5-MoE's
// multimodal checkpoint served text-only (the same hybrid, split linear projections).
// gpt_oss: sliding-window layers (window 8, shorter than the 40-id prompt), sinks, YaRN, expert
// biases, clamped SwiGLU; gpt_oss_mxfp4: its experts in MXFP4. gemma4: the MoE text stack
// (sliding window 8 with its own RoPE, attention_k_eq_v, a dense MLP beside the experts in
// every layer, sandwich norms, logit soft-capping); gemma4_mm: the same language model in
// Gemma-4's multimodal checkpoint, served text-only (its vision tower skipped); gemma4_global:
// full layers of their own KV shape (global_head_dim 32 against 16, 1 kv head against 4, as
// Gemma-4-26B-A4B's 512 against 256 and 2 against 8), their RoPE over their own head size.
// deepseek_v3: MLA (q_lora, interleaved RoPE, YaRN with mscale_all_dim) over latent KV pages,
// grouped sigmoid routing; deepseek_v3_direct: q_proj without q_lora, rotate-half RoPE;
// kimi_k2: model_type kimi_k2 over the DeepseekV3 architecture; deepseek_v3_fp8: FP8 weights
// with weight_scale_inv per 128x128 block.
const std::vector<std::string> kTypes = {
    "qwen2_moe",        "qwen3_moe",      "olmoe",         "mixtral",     "glm4_moe",
    "glm4_moe_grouped", "qwen3_next",     "qwen3_5_moe",   "gpt_oss",     "gpt_oss_mxfp4",
    "gemma4",           "gemma4_mm",      "gemma4_global", "deepseek_v3", "deepseek_v3_direct",
    "kimi_k2",          "deepseek_v3_fp8"};

std::unique_ptr<Engine> MakeEngine(const std::string& type, EngineOptions opt = {}) {
  auto e = Engine::Create(FixtureModelDir(type), opt);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

int Argmax(const float* v, size_t n) { return static_cast<int>(std::max_element(v, v + n) - v); }

double MaxAbsDiff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

class PerType : public ::testing::TestWithParam<std::string> {};

TEST_P(PerType, LogitsMatchReferenceAtEveryPosition) {
  auto engine = MakeEngine(GetParam());
  ASSERT_TRUE(engine);
  const size_t V = static_cast<size_t>(engine->vocab_size());
  auto refs = ReadRefLogits(FixtureModelDir(GetParam()) + "/logits.safetensors", V);
  ASSERT_FALSE(refs.empty());
  for (size_t p = 0; p < refs.size(); ++p) {
    auto got = engine->ForwardLogits(refs[p].ids);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->size(), refs[p].logits.size());
    for (size_t t = 0; t < refs[p].ids.size(); ++t) {
      const float* g = got->data() + t * V;
      const float* r = refs[p].logits.data() + t * V;
      EXPECT_LE(MaxAbsDiff(g, r, V), 2e-3) << "prompt " << p << " position " << t;
      EXPECT_EQ(Argmax(g, V), Argmax(r, V)) << "prompt " << p << " position " << t;
    }
  }
  EXPECT_EQ(engine->kv_pool().num_free(), engine->kv_pool().num_blocks());
}

// The checkpoint copied into the process (llama.cpp's --no-mmap) gives the mapped one's logits
// bit for bit: same bytes, same kernels.
TEST_P(PerType, CopiedWeightsGiveTheMappedLogits) {
  auto mapped = MakeEngine(GetParam());
  EngineOptions copy_opt;
  copy_opt.copy_weights = true;
  auto copied = MakeEngine(GetParam(), copy_opt);
  ASSERT_TRUE(mapped && copied);
  const size_t V = static_cast<size_t>(mapped->vocab_size());
  auto refs = ReadRefLogits(FixtureModelDir(GetParam()) + "/logits.safetensors", V);
  ASSERT_FALSE(refs.empty());
  auto a = mapped->ForwardLogits(refs[0].ids);
  auto b = copied->ForwardLogits(refs[0].ids);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0);
}

TEST_P(PerType, ChunkedPrefillEqualsUnchunked) {
  auto whole = MakeEngine(GetParam(), {.block_size = 16, .max_batch_tokens = 256});
  auto chunked = MakeEngine(GetParam(), {.block_size = 4, .max_batch_tokens = 7});
  ASSERT_TRUE(whole && chunked);
  const size_t V = static_cast<size_t>(whole->vocab_size());
  std::mt19937 rng(7);
  std::vector<int32_t> ids(45);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % V);
  auto a = whole->ForwardLogits(ids);
  auto b = chunked->ForwardLogits(ids);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_LE(MaxAbsDiff(a->data(), b->data(), a->size()), 1e-4);

  // Through Step(): the prompt runs in chunks of 7, the first token's logits equal the last row.
  EngineOptions opt{.block_size = 4, .max_batch_tokens = 7, .return_logits = true};
  auto stepped = MakeEngine(GetParam(), opt);
  ASSERT_TRUE(stepped);
  SamplingParams sp;
  sp.max_tokens = 1;
  ASSERT_TRUE(stepped->AddSequence(1, ids, sp).ok());
  int steps = 0;
  std::vector<float> first;
  while (stepped->HasWork()) {
    auto r = stepped->Step();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ++steps;
    for (auto& u : r->updates) {
      if (!u.new_tokens.empty()) first = u.logits;
    }
  }
  EXPECT_EQ(steps, (45 + 6) / 7);
  ASSERT_EQ(first.size(), V);
  EXPECT_LE(MaxAbsDiff(first.data(), a->data() + 44 * V, V), 1e-4);
}

// Greedy decode through Step(): each decode step's logits equal teacher-forced logits of the
// sequence generated so far.
TEST_P(PerType, DecodeMatchesTeacherForcing) {
  auto engine = MakeEngine(GetParam(), {.block_size = 4, .return_logits = true});
  ASSERT_TRUE(engine);
  const size_t V = static_cast<size_t>(engine->vocab_size());
  std::vector<int32_t> prompt = {3, 17, 42, 5, 99, 7};
  SamplingParams sp;
  sp.max_tokens = 12;
  sp.ignore_eos = true;
  ASSERT_TRUE(engine->AddSequence(1, prompt, sp).ok());
  std::vector<int32_t> all = prompt;
  std::vector<std::vector<float>> step_logits;
  while (engine->HasWork()) {
    auto r = engine->Step();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->updates.size(), 1u);
    ASSERT_EQ(r->updates[0].new_tokens.size(), 1u);
    all.push_back(r->updates[0].new_tokens[0]);
    step_logits.push_back(r->updates[0].logits);
    if (r->updates[0].finished) {
      EXPECT_EQ(r->updates[0].reason, FinishReason::kLength);
    }
  }
  ASSERT_EQ(all.size(), prompt.size() + 12);
  auto tf = engine->ForwardLogits(std::span<const int32_t>(all.data(), all.size() - 1));
  ASSERT_TRUE(tf.ok());
  for (size_t i = 0; i < step_logits.size(); ++i) {
    const size_t row = prompt.size() - 1 + i;
    EXPECT_LE(MaxAbsDiff(step_logits[i].data(), tf->data() + row * V, V), 1e-4) << "token " << i;
    EXPECT_EQ(all[prompt.size() + i], Argmax(tf->data() + row * V, V));
  }
  EXPECT_EQ(engine->kv_pool().num_free(), engine->kv_pool().num_blocks());
}

INSTANTIATE_TEST_SUITE_P(Types, PerType, ::testing::ValuesIn(kTypes));

// The fixtures of tools/make_family_fixtures.py also hold HF's greedy continuation of each
// prompt (g{i}.ids, g{i}.out): decoding through Step() gives the same ids.
TEST(FamilyGreedy, ContinuationsEqualTheReference) {
  // The hybrids' prompts: 1, 5, 70 and 150 ids (past the delta rule's chunk of 64).
  for (const auto& [type, prompts] : std::vector<std::pair<std::string, int>>{
           {"glm4_moe", 3}, {"glm4_moe_grouped", 3}, {"qwen3_next", 4}, {"qwen3_5_moe", 4},
           {"gpt_oss", 3}, {"gpt_oss_mxfp4", 3}, {"gemma4", 3}, {"gemma4_mm", 3},
           {"gemma4_global", 3}, {"deepseek_v3", 3}, {"deepseek_v3_direct", 3}, {"kimi_k2", 3},
           {"deepseek_v3_fp8", 3}}) {
    auto ref_file = SafetensorsFile::Open(FixtureModelDir(type) + "/logits.safetensors");
    ASSERT_TRUE(ref_file.ok()) << ref_file.status().ToString();
    int cases = 0;
    for (int i = 0; (*ref_file)->Has("g" + std::to_string(i) + ".ids"); ++i, ++cases) {
      auto ids = (*ref_file)->Get("g" + std::to_string(i) + ".ids");
      auto out = (*ref_file)->Get("g" + std::to_string(i) + ".out");
      ASSERT_TRUE(ids.ok() && out.ok());
      std::vector<int32_t> prompt(static_cast<size_t>(ids->shape[0]));
      std::memcpy(prompt.data(), ids->data, ids->nbytes);
      std::vector<int32_t> want(static_cast<size_t>(out->shape[0]));
      std::memcpy(want.data(), out->data, out->nbytes);
      auto engine = MakeEngine(type, {.block_size = 4});
      ASSERT_TRUE(engine);
      SamplingParams sp;
      sp.max_tokens = static_cast<int>(want.size());
      sp.ignore_eos = true;
      ASSERT_TRUE(engine->AddSequence(1, prompt, sp).ok());
      std::vector<int32_t> got;
      while (engine->HasWork()) {
        auto r = engine->Step();
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        for (auto& u : r->updates) got.insert(got.end(), u.new_tokens.begin(), u.new_tokens.end());
      }
      EXPECT_EQ(got, want) << type << " prompt " << i;
    }
    EXPECT_EQ(cases, prompts) << type;
  }
}

// Runs every sequence to completion alone and returns per-sequence tokens and step logits.
struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

std::map<SeqId, Trace> RunAlone(const std::string& type,
                                const std::vector<std::vector<int32_t>>& prompts,
                                const SamplingParams& sp) {
  std::map<SeqId, Trace> out;
  auto engine = MakeEngine(type, {.block_size = 4, .return_logits = true});
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(engine->AddSequence(i, prompts[i], sp).ok());
    while (engine->HasWork()) {
      auto r = engine->Step();
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok()) return out;
      for (auto& u : r->updates) {
        for (int32_t t : u.new_tokens) out[u.id].tokens.push_back(t);
        if (!u.new_tokens.empty()) out[u.id].logits.push_back(u.logits);
      }
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> RaggedPrompts(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    prompts[i].resize(static_cast<size_t>(1 + (i * 7) % 23));
    for (auto& id : prompts[i]) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  }
  return prompts;
}

// gpt_oss, gemma4: prompts of up to 23 ids decode past their sliding window of 8 (gemma4_global's
// full layers in pages of their own width); deepseek_v3 and kimi_k2 read and write latent KV
// pages (one row per token) in batches of ragged positions.
TEST(EngineBatching, BatchedDecodeOf32RaggedSequencesEqualsEachAlone) {
  for (const char* type : {"qwen2_moe", "olmoe", "qwen3_next", "qwen3_5_moe", "gpt_oss", "gemma4",
                           "gemma4_global", "deepseek_v3", "kimi_k2"}) {
    SCOPED_TRACE(type);
    auto engine =
        MakeEngine(type, {.block_size = 4, .max_batch_tokens = 512, .return_logits = true});
    ASSERT_TRUE(engine);
    auto prompts = RaggedPrompts(32, engine->vocab_size(), 11);
    SamplingParams sp;
    sp.max_tokens = 6;
    sp.ignore_eos = true;
    auto alone = RunAlone(type, prompts, sp);
    for (size_t i = 0; i < prompts.size(); ++i)
      ASSERT_TRUE(engine->AddSequence(i, prompts[i], sp).ok());
    std::map<SeqId, Trace> batched;
    int max_decode_batch = 0;
    while (engine->HasWork()) {
      auto r = engine->Step();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      max_decode_batch = std::max(max_decode_batch, r->num_decode_tokens);
      for (auto& u : r->updates) {
        for (int32_t t : u.new_tokens) batched[u.id].tokens.push_back(t);
        if (!u.new_tokens.empty()) batched[u.id].logits.push_back(u.logits);
      }
    }
    EXPECT_EQ(max_decode_batch, 32);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(batched[i].tokens, alone[i].tokens) << "sequence " << i;
      for (size_t j = 0; j < batched[i].logits.size(); ++j) {
        EXPECT_LE(MaxAbsDiff(batched[i].logits[j].data(), alone[i].logits[j].data(),
                             batched[i].logits[j].size()),
                  1e-4)
            << "sequence " << i << " token " << j;
      }
    }
    EXPECT_EQ(engine->kv_pool().num_free(), engine->kv_pool().num_blocks());
  }
}

TEST(EngineBatching, ContinuousBatchingAddAndRemoveBetweenSteps) {
  const std::string type = "qwen3_moe";
  auto probe = MakeEngine(type);
  ASSERT_TRUE(probe);
  auto prompts = RaggedPrompts(6, probe->vocab_size(), 5);
  SamplingParams sp;
  sp.max_tokens = 8;
  sp.ignore_eos = true;
  sp.temperature = 0.8f;
  sp.top_p = 0.9f;
  sp.seed = 42;
  auto alone = RunAlone(type, prompts, sp);

  auto engine = MakeEngine(type, {.block_size = 4, .max_batch_tokens = 9});
  std::map<SeqId, std::vector<int32_t>> got;
  std::map<SeqId, bool> finished;
  ASSERT_TRUE(engine->AddSequence(0, prompts[0], sp).ok());
  ASSERT_TRUE(engine->AddSequence(1, prompts[1], sp).ok());
  for (int step = 0; engine->HasWork() || step < 8; ++step) {
    if (step == 2) {
      ASSERT_TRUE(engine->AddSequence(2, prompts[2], sp).ok());
    }
    if (step == 3) {
      ASSERT_TRUE(engine->AddSequence(3, prompts[3], sp).ok());
    }
    if (step == 4) {
      ASSERT_TRUE(engine->RemoveSequence(1).ok());  // cancelled mid-stream
    }
    if (step == 5) {
      ASSERT_TRUE(engine->AddSequence(4, prompts[4], sp).ok());
      ASSERT_TRUE(engine->AddSequence(5, prompts[5], sp).ok());
    }
    if (!engine->HasWork()) continue;
    auto r = engine->Step();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (auto& u : r->updates) {
      EXPECT_FALSE(finished[u.id]) << "update after finish for " << u.id;
      for (int32_t t : u.new_tokens) got[u.id].push_back(t);
      if (u.finished) finished[u.id] = true;
    }
  }
  for (SeqId id : {0, 2, 3, 4, 5}) {
    EXPECT_TRUE(finished[id]) << id;
    EXPECT_EQ(got[id], alone[id].tokens) << "sequence " << id;
  }
  EXPECT_FALSE(finished[1]);
  EXPECT_LT(got[1].size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(alone[1].tokens.begin(), alone[1].tokens.begin() + got[1].size()),
            got[1]);
  EXPECT_EQ(engine->RemoveSequence(1).code(), StatusCode::kNotFound);
  EXPECT_EQ(engine->kv_pool().num_free(), engine->kv_pool().num_blocks());
}

// Copies every page of every layer of blocks src -> dst, as the transport does: a hybrid's
// recurrent state (in its first block's state pages) moves with its attention KV.
// deepseek_v3: its latent KV pages (one row per token and layer) move the same way.
void CopyBlocks(const Engine& from, std::span<const int32_t> src, Engine* to,
                std::span<const int32_t> dst) {
  const KvBlockPool& pool = from.kv_pool();
  ASSERT_EQ(pool.specs(), to->kv_pool().specs());
  ASSERT_EQ(pool.pages().page_bytes(), to->kv_pool().pages().page_bytes());
  for (size_t b = 0; b < src.size(); ++b) {
    for (int l = 0; l < pool.layout().num_layers; ++l) {
      for (int k = 0; k < pool.LayerPages(l); ++k) {
        std::memcpy(to->LeasedKvPage(dst[b], l, k), pool.LayerPage(src[b], l, k),
                    pool.pages().page_bytes());
      }
    }
  }
}

TEST(EngineDisaggregated, PrefillIntoBlocksThenDecodeFromThemEqualsAggregated) {
  for (const std::string type : {"mixtral", "qwen3_next", "deepseek_v3"}) {
    SCOPED_TRACE(type);
    auto prompts = RaggedPrompts(3, 300, 9);
    prompts[0].resize(1);
    SamplingParams sp;
    sp.max_tokens = 7;
    sp.ignore_eos = true;
    sp.temperature = 1.0f;
    sp.top_k = 20;
    sp.seed = 3;
    auto alone = RunAlone(type, prompts, sp);
    auto prefill = MakeEngine(type, {.block_size = 4, .max_batch_tokens = 5});
    auto decode = MakeEngine(type, {.block_size = 4});
    ASSERT_TRUE(prefill && decode);
    ASSERT_EQ(prefill->kv_pool().layout(), decode->kv_pool().layout());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int nb = BlocksForTokens(static_cast<int>(prompts[i].size()), 4);
      auto src = prefill->LeaseKvBlocks(nb);
      auto dst = decode->LeaseKvBlocks(nb);
      ASSERT_TRUE(src.ok() && dst.ok());
      auto pr = prefill->Prefill(prompts[i], *src, sp);
      ASSERT_TRUE(pr.ok()) << pr.status().ToString();
      ASSERT_EQ(pr->first_token, alone[i].tokens[0]);
      CopyBlocks(*prefill, *src, decode.get(), *dst);
      ASSERT_TRUE(prefill->ReturnKvBlocks(*src).ok());
      ASSERT_TRUE(decode->AddPrefilledSequence(i, prompts[i], *dst, pr->first_token, sp).ok());
    }
    std::map<SeqId, std::vector<int32_t>> got;
    while (decode->HasWork()) {
      auto r = decode->Step();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->num_prefill_tokens, 0);
      for (auto& u : r->updates)
        got[u.id].insert(got[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int32_t> want(alone[i].tokens.begin() + 1, alone[i].tokens.end());
      EXPECT_EQ(got[i], want) << "sequence " << i;
    }
    EXPECT_EQ(decode->kv_pool().num_free(), decode->kv_pool().num_blocks());
    EXPECT_EQ(prefill->kv_pool().num_free(), prefill->kv_pool().num_blocks());

    // Failover: re-prefill prompt + the 3 tokens already sent on another worker, continue there.
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int32_t> replay = prompts[i];
      replay.insert(replay.end(), alone[i].tokens.begin(), alone[i].tokens.begin() + 3);
      const int nb = BlocksForTokens(static_cast<int>(replay.size()), 4);
      auto blocks = decode->LeaseKvBlocks(nb);
      ASSERT_TRUE(blocks.ok());
      auto pr = decode->Prefill(replay, *blocks, sp, 3);
      ASSERT_TRUE(pr.ok()) << pr.status().ToString();
      EXPECT_EQ(pr->first_token, alone[i].tokens[3]);
      ASSERT_TRUE(decode->AddPrefilledSequence(i, replay, *blocks, pr->first_token, sp, 3).ok());
    }
    got.clear();
    while (decode->HasWork()) {
      auto r = decode->Step();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      for (auto& u : r->updates)
        got[u.id].insert(got[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i], std::vector<int32_t>(alone[i].tokens.begin() + 4, alone[i].tokens.end()))
          << i;
    }
    EXPECT_EQ(decode->kv_pool().num_free(), decode->kv_pool().num_blocks());

    // Failover as served: the prompt's KV from the prefill engine, the 3 tokens already sent
    // computed by the decode engine itself (num_uncached) before it decodes the 4th.
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int nb = BlocksForTokens(static_cast<int>(prompts[i].size()), 4);
      auto src = prefill->LeaseKvBlocks(nb);
      auto dst = decode->LeaseKvBlocks(nb);
      ASSERT_TRUE(src.ok() && dst.ok());
      ASSERT_TRUE(prefill->Prefill(prompts[i], *src, sp).ok());
      CopyBlocks(*prefill, *src, decode.get(), *dst);
      ASSERT_TRUE(prefill->ReturnKvBlocks(*src).ok());
      std::vector<int32_t> streamed = prompts[i];
      streamed.insert(streamed.end(), alone[i].tokens.begin(), alone[i].tokens.begin() + 3);
      ASSERT_TRUE(
          decode->AddPrefilledSequence(i, streamed, *dst, alone[i].tokens[3], sp, 3, 3).ok());
    }
    got.clear();
    int computed = 0;
    while (decode->HasWork()) {
      auto r = decode->Step();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      computed += r->num_prefill_tokens;
      for (auto& u : r->updates)
        got[u.id].insert(got[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    EXPECT_EQ(computed, 4 * static_cast<int>(prompts.size()));  // 3 streamed + the 4th each
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i], std::vector<int32_t>(alone[i].tokens.begin() + 4, alone[i].tokens.end()))
          << i;
    }
    EXPECT_EQ(decode->kv_pool().num_free(), decode->kv_pool().num_blocks());
  }
}
TEST(EngineDisaggregated, GeneratedTokensInThePromptCountOnce) {
  auto engine = MakeEngine("qwen3_moe", {.num_kv_blocks = 16, .block_size = 4, .max_context = 48});
  ASSERT_TRUE(engine);
  SamplingParams sp;
  sp.max_tokens = 40;
  const std::vector<int32_t> streamed(40, 1);  // 10 prompt tokens + 30 generated
  auto blocks = engine->LeaseKvBlocks(3);  // the prompt's
  ASSERT_TRUE(blocks.ok());
  EXPECT_EQ(engine->AddPrefilledSequence(1, streamed, *blocks, 1, sp, 30, 41).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->AddPrefilledSequence(1, streamed, *blocks, 1, sp, 30, 27).code(),
            StatusCode::kInvalidArgument);  // 13 cached tokens need 4 blocks
  sp.max_tokens = 30;
  EXPECT_EQ(engine->AddPrefilledSequence(1, streamed, *blocks, 1, sp, 30, 30).code(),
            StatusCode::kInvalidArgument);  // nothing left to generate
  sp.max_tokens = 40;
  ASSERT_TRUE(engine->AddPrefilledSequence(1, streamed, *blocks, 1, sp, 30, 30).ok());
  int steps = 0;
  while (engine->HasWork()) {
    auto r = engine->Step();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ++steps;
  }
  EXPECT_GT(steps, 1);
  EXPECT_EQ(engine->kv_pool().num_free(), engine->kv_pool().num_blocks());
}

// Several prompts prefilled together (PrefillBatch: ragged chunks of several prompts in one
// forward pass) give the same KV, logits and first tokens as each prompt alone (Prefill).
TEST(EngineDisaggregated, BatchedPrefillEqualsOneByOne) {
  for (const std::string& type : {std::string("qwen2_moe"), std::string("mixtral")}) {
    SCOPED_TRACE(type);
    auto prompts = RaggedPrompts(6, 120, 17);
    prompts[2].resize(1);
    for (int i = 0; i < 80; ++i) prompts[4].push_back((i * 37) % 120);  // spans three passes
    SamplingParams sp;
    sp.temperature = 0.9f;
    sp.seed = 11;
    auto engine = MakeEngine(type, {.block_size = 4, .max_batch_tokens = 37});
    ASSERT_TRUE(engine);
    const KvBlockPool& pool = engine->kv_pool();
    const size_t block_floats = pool.bytes_per_block() / sizeof(float);
    // One by one.
    std::vector<PrefillResult> alone;
    std::vector<std::vector<float>> alone_kv;
    for (const auto& p : prompts) {
      auto blocks = engine->LeaseKvBlocks(BlocksForTokens(static_cast<int>(p.size()), 4));
      ASSERT_TRUE(blocks.ok());
      auto r = engine->Prefill(p, *blocks, sp, /*num_generated_before=*/0);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      alone.push_back(*r);
      std::vector<float> kv;
      for (int32_t b : *blocks) {
        for (int layer = 0; layer < pool.layout().num_layers; ++layer) {
          const float* f = reinterpret_cast<const float*>(pool.LayerPage(b, layer));
          kv.insert(kv.end(), f, f + block_floats / pool.layout().num_layers);
        }
      }
      alone_kv.push_back(std::move(kv));
      ASSERT_TRUE(engine->ReturnKvBlocks(*blocks).ok());
    }
    // Together, one pass at a time: with a 37-token budget, passes mix the end of one prompt
    // with the start of the next.
    std::vector<std::vector<int32_t>> blocks(prompts.size());
    std::vector<PrefillJob> jobs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto got = engine->LeaseKvBlocks(BlocksForTokens(static_cast<int>(prompts[i].size()), 4));
      ASSERT_TRUE(got.ok());
      blocks[i] = *got;
      jobs[i].prompt = prompts[i];
      jobs[i].block_ids = blocks[i];
      jobs[i].params = sp;
      ASSERT_TRUE(engine->CheckPrefill(jobs[i]).ok());
    }
    int passes = 0, total = 0;
    while (true) {
      int before = 0;
      for (const auto& j : jobs) before += j.num_computed;
      auto ran = engine->PrefillPass(jobs);
      ASSERT_TRUE(ran.ok()) << ran.status().ToString();
      if (*ran == 0) break;
      EXPECT_LE(*ran, 37);
      int touched = 0;
      for (const auto& j : jobs) touched += j.num_computed;
      EXPECT_EQ(touched - before, *ran);
      total += *ran;
      ++passes;
    }
    size_t prompt_tokens = 0;
    for (const auto& p : prompts) prompt_tokens += p.size();
    EXPECT_EQ(static_cast<size_t>(total), prompt_tokens);
    EXPECT_EQ(passes,
              static_cast<int>((prompt_tokens + 36) / 37));  // every pass but the last is full
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(jobs[i].done());
      EXPECT_EQ(jobs[i].result.first_token, alone[i].first_token) << "prompt " << i;
      ASSERT_EQ(jobs[i].result.last_logits.size(), alone[i].last_logits.size());
      EXPECT_LE(MaxAbsDiff(jobs[i].result.last_logits.data(), alone[i].last_logits.data(),
                           alone[i].last_logits.size()),
                1e-5)
          << "prompt " << i;
      // KV of the prompt's positions (the tail of the last block is not written by either).
      const KvLayout& l = pool.layout();
      for (size_t b = 0; b < blocks[i].size(); ++b) {
        const int valid =
            std::min(4, static_cast<int>(prompts[i].size()) - static_cast<int>(b) * 4);
        for (int layer = 0; layer < l.num_layers; ++layer) {
          for (int kv = 0; kv < 2; ++kv) {
            for (int h = 0; h < l.num_kv_heads; ++h) {
              const float* got = pool.Slab(blocks[i][b], layer, kv, h);
              const size_t slab = (static_cast<size_t>(layer * 2 + kv) * l.num_kv_heads + h) *
                                  l.block_size * l.head_dim;
              const float* want = alone_kv[i].data() + b * block_floats + slab;
              for (int e = 0; e < valid * l.head_dim; ++e) {
                ASSERT_NEAR(got[e], want[e], 1e-5)
                    << "prompt " << i << " block " << b << " layer " << layer << " kv " << kv;
              }
            }
          }
        }
      }
      ASSERT_TRUE(engine->ReturnKvBlocks(blocks[i]).ok());
    }
    EXPECT_EQ(pool.num_free(), pool.num_blocks());
    // A bad job fails the pass before anything runs.
    PrefillJob bad;
    std::vector<int32_t> ids = {1, 2, 3};
    std::vector<int32_t> none;
    bad.prompt = ids;
    bad.block_ids = none;
    bad.params = sp;
    EXPECT_EQ(engine->CheckPrefill(bad).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(engine->PrefillPass({&bad, 1}).status().code(), StatusCode::kInvalidArgument);
  }
}

// Log-probabilities of the prompt (batched, chunked prefill) and of generated tokens (Step)
// equal the log-softmax of the teacher-forced logits of the same tokens.
TEST(EngineLogprobs, PromptAndGeneratedLogprobsMatchTheTeacherForcedLogits) {
  const std::string type = "qwen2_moe";
  auto prompts = RaggedPrompts(3, 120, 5);
  for (int i = 0; i < 60; ++i) prompts[1].push_back((i * 13) % 120);  // spans several passes
  auto engine = MakeEngine(type, {.block_size = 4, .max_batch_tokens = 29});
  ASSERT_TRUE(engine);
  const int V = engine->vocab_size();
  auto log_softmax = [V](const float* row, int32_t tok) {
    double mx = row[0], sum = 0;
    for (int i = 1; i < V; ++i) mx = std::max(mx, double(row[i]));
    for (int i = 0; i < V; ++i) sum += std::exp(double(row[i]) - mx);
    return double(row[tok]) - mx - std::log(sum);
  };
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.seed = 3;
  sp.logprobs = 2;
  std::vector<std::vector<int32_t>> blocks(prompts.size());
  std::vector<PrefillJob> jobs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto got = engine->LeaseKvBlocks(BlocksForTokens(static_cast<int>(prompts[i].size()), 4));
    ASSERT_TRUE(got.ok());
    blocks[i] = *got;
    jobs[i].prompt = prompts[i];
    jobs[i].block_ids = blocks[i];
    jobs[i].params = sp;
    jobs[i].prompt_logprobs = i == 2 ? -1 : 3;  // one job without: it shares the passes
  }
  ASSERT_TRUE(engine->PrefillBatch(jobs).ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto logits = engine->ForwardLogits(prompts[i]);
    ASSERT_TRUE(logits.ok());
    const auto& r = jobs[i].result;
    if (i == 2) {
      EXPECT_TRUE(r.prompt_logprobs.empty());
    } else {
      ASSERT_EQ(r.prompt_logprobs.size(), prompts[i].size() - 1) << i;
      for (size_t p = 0; p + 1 < prompts[i].size(); ++p) {
        const float* row = logits->data() + p * V;
        EXPECT_EQ(r.prompt_logprobs[p].token, prompts[i][p + 1]);
        EXPECT_NEAR(r.prompt_logprobs[p].logprob, log_softmax(row, prompts[i][p + 1]), 1e-4)
            << "prompt " << i << " position " << p + 1;
        ASSERT_EQ(r.prompt_logprobs[p].top.size(), 3u);
        EXPECT_GE(r.prompt_logprobs[p].top[0].second, r.prompt_logprobs[p].top[1].second);
      }
    }
    const float* last = logits->data() + (prompts[i].size() - 1) * V;
    EXPECT_EQ(r.first_logprobs.token, r.first_token);
    EXPECT_NEAR(r.first_logprobs.logprob, log_softmax(last, r.first_token), 1e-4);
    EXPECT_EQ(r.first_logprobs.top.size(), 2u);
    ASSERT_TRUE(engine->ReturnKvBlocks(blocks[i]).ok());
  }
  // Generated tokens: Step() reports the log-softmax of the logits each token was drawn from.
  auto gen = MakeEngine(type, {.block_size = 4, .max_batch_tokens = 29, .return_logits = true});
  ASSERT_TRUE(gen);
  sp.max_tokens = 6;
  ASSERT_TRUE(gen->AddSequence(1, prompts[0], sp).ok());
  SamplingParams none = sp;
  none.logprobs = -1;
  ASSERT_TRUE(gen->AddSequence(2, prompts[1], none).ok());
  int checked = 0;
  while (gen->HasWork()) {
    auto step = gen->Step();
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    for (const auto& u : step->updates) {
      if (u.id == 2) {
        EXPECT_TRUE(u.logprobs.empty());
        continue;
      }
      ASSERT_EQ(u.logprobs.size(), u.new_tokens.size());
      for (size_t k = 0; k < u.new_tokens.size(); ++k) {
        EXPECT_EQ(u.logprobs[k].token, u.new_tokens[k]);
        EXPECT_NEAR(u.logprobs[k].logprob, log_softmax(u.logits.data(), u.new_tokens[k]), 1e-6);
        EXPECT_EQ(u.logprobs[k].top.size(), 2u);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 6);
}

TEST(EngineBatching, OutOfBlocksIsResourceExhaustedAndPreemptionRecomputesIdentically) {
  for (const std::string type : {"olmoe", "qwen3_next", "deepseek_v3"}) {
    SCOPED_TRACE(type);
    auto prompts = RaggedPrompts(2, 300, 21);
    prompts[0].assign(prompts[0].begin(), prompts[0].begin() + 1);
    prompts[1] = {5, 6, 7, 8, 9, 10, 11};
    SamplingParams sp;
    sp.max_tokens = 10;
    sp.ignore_eos = true;
    sp.temperature = 0.7f;
    sp.seed = 99;
    auto alone = RunAlone(type, prompts, sp);
    // 2 tokens per block, 8 blocks: both sequences cannot finish together.
    auto engine = MakeEngine(type, {.num_kv_blocks = 8, .block_size = 2});
    ASSERT_TRUE(engine);
    ASSERT_TRUE(engine->AddSequence(0, prompts[0], sp).ok());
    ASSERT_TRUE(engine->AddSequence(1, prompts[1], sp).ok());
    std::map<SeqId, std::vector<int32_t>> got;
    bool exhausted = false;
    while (engine->HasWork()) {
      auto r = engine->Step();
      if (!r.ok()) {
        ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
        ASSERT_FALSE(exhausted);
        exhausted = true;
        // Preempt sequence 1, finish 0, then recompute 1 from prompt + what it generated.
        ASSERT_TRUE(engine->RemoveSequence(1).ok());
        while (engine->HasWork()) {
          auto r2 = engine->Step();
          ASSERT_TRUE(r2.ok()) << r2.status().ToString();
          for (auto& u : r2->updates)
            got[u.id].insert(got[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
        }
        ASSERT_TRUE(engine->AddSequence(1, prompts[1], sp, got[1]).ok());
        continue;
      }
      for (auto& u : r->updates)
        got[u.id].insert(got[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    EXPECT_TRUE(exhausted);
    EXPECT_EQ(got[0], alone[0].tokens);
    EXPECT_EQ(got[1], alone[1].tokens);
    EXPECT_EQ(engine->kv_pool().num_free(), 8);
  }
}

// Seams: a provider that wraps bf16 and counts, an identity hook, a recorder, a bad hook.
class CountingProvider : public ExpertWeightProvider {
 public:
  explicit CountingProvider(ExpertWeightProvider* inner) : inner_(inner) {}
  Status RunExperts(const ExpertLayerCall& call) override {
    ++calls;
    for (const ExpertGroup& g : call.groups) rows += static_cast<size_t>(g.size());
    return inner_->RunExperts(call);
  }
  int Bits(int l, int e, ExpertProj p) const override { return inner_->Bits(l, e, p); }
  ExpertWeightProvider* inner_;
  int calls = 0;
  size_t rows = 0;
};

class FirstChoiceOnly : public RoutingHook {
 public:
  Status Rewrite(const RoutingContext& ctx, std::vector<ExpertAssignment>* a) override {
    ++calls;
    pure_decode_seen |= ctx.pure_decode;
    std::vector<ExpertAssignment> kept;
    for (auto& x : *a) {
      if (x.rank == 0) kept.push_back({x.token, x.expert, 1.0f, 0});
    }
    *a = kept;
    return Status::Ok();
  }
  int calls = 0;
  bool pure_decode_seen = false;
};

class BadHook : public RoutingHook {
 public:
  Status Rewrite(const RoutingContext& ctx, std::vector<ExpertAssignment>* a) override {
    (*a)[0].expert = ctx.num_experts;  // out of range
    return Status::Ok();
  }
};

class Recorder : public RouterLogitsRecorder {
 public:
  void Record(const RoutingContext& ctx, const std::vector<ExpertAssignment>& sel) override {
    ++calls;
    tokens += ctx.num_tokens;
    EXPECT_EQ(sel.size(), static_cast<size_t>(ctx.num_tokens * ctx.top_k));
    for (int t = 0; t < ctx.num_tokens; ++t) {
      // The router's first choice is the argmax of the logits.
      const float* l = ctx.router_logits + t * ctx.num_experts;
      EXPECT_EQ(sel[t * ctx.top_k].expert, std::max_element(l, l + ctx.num_experts) - l);
    }
  }
  int calls = 0;
  int tokens = 0;
};

TEST(EngineSeams, ProviderHookAndRecorderAreCalledAndTakeEffect) {
  const std::string type = "qwen2_moe";
  auto engine = MakeEngine(type);
  ASSERT_TRUE(engine);
  std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  auto base = engine->ForwardLogits(ids);
  ASSERT_TRUE(base.ok());

  // A counting wrapper around the default provider changes nothing.
  auto model = Model::Load(FixtureModelDir(type));
  ASSERT_TRUE(model.ok());
  Bf16ExpertProvider bf16(**model);
  CountingProvider counting(&bf16);
  Recorder rec;
  MoeHooks hooks;
  hooks.recorder = &rec;
  hooks.provider = &counting;
  engine->SetMoeHooks(hooks);
  auto same = engine->ForwardLogits(ids);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, *base);
  int moe_layers = 0;
  for (int64_t l = 0; l < (*model)->config().num_layers; ++l)
    moe_layers += (*model)->config().IsMoeLayer(l);
  EXPECT_EQ(rec.calls, moe_layers);
  EXPECT_EQ(rec.tokens, moe_layers * 8);
  // One provider call per MoE layer, carrying every (token, expert) pair of the layer once.
  EXPECT_EQ(counting.calls, moe_layers);
  EXPECT_EQ(counting.rows,
            static_cast<size_t>(moe_layers * 8 * (*model)->config().num_experts_per_tok));

  FirstChoiceOnly hook;
  hooks = {};
  hooks.routing_hook = &hook;
  engine->SetMoeHooks(hooks);
  auto changed = engine->ForwardLogits(ids);
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ(hook.calls, moe_layers);
  EXPECT_GT(MaxAbsDiff(changed->data(), base->data(), base->size()), 1e-3);

  BadHook bad;
  hooks.routing_hook = &bad;
  engine->SetMoeHooks(hooks);
  auto err = engine->ForwardLogits(ids);
  EXPECT_EQ(err.status().code(), StatusCode::kInternal);
  EXPECT_EQ(engine->kv_pool().num_free(), engine->kv_pool().num_blocks());
  engine->SetMoeHooks({});
}

// What the engine hands the provider (one ExpertLayerCall per MoE layer) and what the router
// chose, both as sorted (layer, expert, token, weight) lists per call.
class LayerCallLog : public ExpertWeightProvider, public RouterLogitsRecorder {
 public:
  using Pair = std::tuple<int, int, int, float>;  // layer, expert, token, weight
  explicit LayerCallLog(ExpertWeightProvider* inner) : inner_(inner) {}
  Status RunExperts(const ExpertLayerCall& call) override {
    std::vector<Pair> got;
    int prev = -1;
    for (const ExpertGroup& g : call.groups) {
      EXPECT_GT(g.expert, prev) << "groups not in ascending expert order";
      EXPECT_GT(g.size(), 0) << "an empty group";
      prev = g.expert;
      for (int32_t r = g.begin; r < g.end; ++r) {
        got.emplace_back(call.layer, g.expert, call.rows[r].token, call.rows[r].weight);
      }
    }
    EXPECT_EQ(got.size(), call.rows.size()) << "groups do not cover the rows";
    calls.push_back(std::move(got));
    tokens.push_back(call.num_tokens);
    return inner_->RunExperts(call);
  }
  int Bits(int l, int e, ExpertProj p) const override { return inner_->Bits(l, e, p); }
  void Record(const RoutingContext& ctx, const std::vector<ExpertAssignment>& sel) override {
    std::vector<Pair> want;
    for (const ExpertAssignment& a : sel) want.emplace_back(ctx.layer, a.expert, a.token, a.weight);
    std::sort(want.begin(), want.end());
    chosen.push_back(std::move(want));
  }
  std::vector<std::vector<Pair>> calls, chosen;
  std::vector<size_t> tokens;

 private:
  ExpertWeightProvider* inner_;
};

TEST(EngineSeams, OneProviderCallPerMoeLayerWithTheRoutersGroups) {
  const std::string type = "qwen2_moe";
  auto engine = MakeEngine(type);
  ASSERT_TRUE(engine);
  auto model = Model::Load(FixtureModelDir(type));
  ASSERT_TRUE(model.ok());
  const ModelConfig& c = (*model)->config();
  int moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.IsMoeLayer(l);
  ASSERT_GT(moe_layers, 0);
  Bf16ExpertProvider bf16(**model);
  for (int T : {1, 3, 37}) {
    std::vector<int32_t> ids;
    for (int t = 0; t < T; ++t) ids.push_back(1 + (t * 7) % 50);
    engine->SetMoeHooks({});
    auto base = engine->ForwardLogits(ids);
    ASSERT_TRUE(base.ok());
    LayerCallLog log(&bf16);
    MoeHooks hooks;
    hooks.provider = &log;
    hooks.recorder = &log;
    engine->SetMoeHooks(hooks);
    auto same = engine->ForwardLogits(ids);
    ASSERT_TRUE(same.ok());
    EXPECT_EQ(*same, *base) << T << " tokens";
    ASSERT_EQ(log.calls.size(), static_cast<size_t>(moe_layers)) << T << " tokens";
    ASSERT_EQ(log.chosen.size(), log.calls.size());
    for (size_t i = 0; i < log.calls.size(); ++i) {
      EXPECT_EQ(log.tokens[i], static_cast<size_t>(T));
      EXPECT_EQ(log.calls[i].size(), static_cast<size_t>(T * c.num_experts_per_tok));
      // Exactly the router's (expert, token, weight) choices of that layer, grouped per expert.
      EXPECT_EQ(log.calls[i], log.chosen[i]) << "layer call " << i << ", " << T << " tokens";
    }
  }
  // After a hook, the call carries the hook's assignments: one expert per token, weight 1.
  FirstChoiceOnly hook;
  LayerCallLog log(&bf16);
  MoeHooks hooks;
  hooks.provider = &log;
  hooks.routing_hook = &hook;
  engine->SetMoeHooks(hooks);
  ASSERT_TRUE(engine->ForwardLogits(std::vector<int32_t>{5, 6, 7}).ok());
  ASSERT_EQ(log.calls.size(), static_cast<size_t>(moe_layers));
  for (const auto& call : log.calls) {
    ASSERT_EQ(call.size(), 3u);
    for (const auto& p : call) EXPECT_EQ(std::get<3>(p), 1.0f);
  }
  engine->SetMoeHooks({});
}

TEST(EngineSeams, PureDecodeFlagOnlyForDecodeOnlyBatches) {
  auto engine = MakeEngine("olmoe");
  ASSERT_TRUE(engine);
  FirstChoiceOnly hook;
  MoeHooks hooks;
  hooks.routing_hook = &hook;
  engine->SetMoeHooks(hooks);
  SamplingParams sp;
  sp.max_tokens = 1;
  ASSERT_TRUE(engine->AddSequence(1, {1, 2, 3}, sp).ok());
  ASSERT_TRUE(engine->Step().ok());
  EXPECT_FALSE(hook.pure_decode_seen);
  sp.max_tokens = 3;
  ASSERT_TRUE(engine->AddSequence(2, {1, 2, 3}, sp).ok());
  ASSERT_TRUE(engine->Step().ok());
  ASSERT_TRUE(engine->Step().ok());
  EXPECT_TRUE(hook.pure_decode_seen);
}

TEST(EngineBadInput, ErrorsNameTheProblem) {
  auto missing = Engine::Create("/nonexistent/model", {});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/model"), std::string::npos);

  auto engine = MakeEngine("qwen3_moe", {.num_kv_blocks = 4, .block_size = 4, .max_context = 64});
  ASSERT_TRUE(engine);
  SamplingParams sp;
  EXPECT_EQ(engine->AddSequence(1, {}, sp).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->AddSequence(1, {1, 100000}, sp).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->AddSequence(1, {1, -1}, sp).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->AddSequence(1, std::vector<int32_t>(64, 1), sp).code(),
            StatusCode::kOutOfRange);
  // Fits the context but not the 4-block pool.
  EXPECT_EQ(engine->AddSequence(1, std::vector<int32_t>(20, 1), sp).code(),
            StatusCode::kOutOfRange);
  SamplingParams bad = sp;
  bad.top_p = 0;
  EXPECT_EQ(engine->AddSequence(1, {1}, bad).code(), StatusCode::kInvalidArgument);
  bad = sp;
  bad.max_tokens = 0;
  EXPECT_EQ(engine->AddSequence(1, {1}, bad).code(), StatusCode::kInvalidArgument);
  bad = sp;
  bad.temperature = NAN;
  EXPECT_EQ(engine->AddSequence(1, {1}, bad).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine->AddSequence(1, {1}, sp).ok());
  EXPECT_EQ(engine->AddSequence(1, {1}, sp).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->AddPrefilledSequence(2, {1, 2, 3, 4, 5}, {0}, 1, sp).code(),
            StatusCode::kInvalidArgument);  // block 0 not allocated, too few blocks
  std::vector<int32_t> none;
  EXPECT_EQ(engine->Prefill(std::vector<int32_t>{1, 2}, none, sp).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->RemoveSequence(77).code(), StatusCode::kNotFound);
}

// A KV block has one owner at a time: the engine's scheduler for a sequence's blocks, the
// caller for a lease. A caller cannot return (free) a sequence's block nor a lease it handed to
// a sequence, nor return a block twice; a refused return frees nothing; every block comes back
// when the sequences end and the leases are returned.
TEST(EngineKvLease, ABlockHasOneOwnerAtATime) {
  auto engine = MakeEngine("qwen3_moe", {.num_kv_blocks = 8, .block_size = 4});
  ASSERT_TRUE(engine);
  SamplingParams sp;
  sp.max_tokens = 4;
  sp.ignore_eos = true;
  ASSERT_TRUE(engine->AddSequence(1, {1, 2, 3, 4, 5}, sp).ok());
  ASSERT_TRUE(engine->Step().ok());
  ASSERT_EQ(engine->Sequences()[0].num_blocks, 2);  // blocks 0 and 1: lowest ids first
  const int free_before = engine->kv_pool().num_free();
  EXPECT_EQ(engine->ReturnKvBlocks(std::vector<int32_t>{0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->ReturnKvBlocks(std::vector<int32_t>{1, 5}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine->kv_pool().IsAllocated(0));
  EXPECT_EQ(engine->kv_pool().num_free(), free_before);
  EXPECT_EQ(engine->AddPrefilledSequence(2, {1, 2, 3}, {0}, 1, sp).code(),
            StatusCode::kInvalidArgument);

  auto lease = engine->LeaseKvBlocks(1);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(engine->ReturnKvBlocks(std::vector<int32_t>{(*lease)[0], (*lease)[0]}).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine->AddPrefilledSequence(2, {1, 2, 3}, *lease, 1, sp).ok());
  EXPECT_EQ(engine->ReturnKvBlocks(*lease).code(), StatusCode::kInvalidArgument);
  auto other = engine->LeaseKvBlocks(2);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(engine->ReturnKvBlocks(*other).ok());
  EXPECT_EQ(engine->ReturnKvBlocks(*other).code(), StatusCode::kInvalidArgument);

  ASSERT_TRUE(engine->Step().ok());  // both sequences run from their own blocks
  ASSERT_TRUE(engine->RemoveSequence(1).ok());
  ASSERT_TRUE(engine->RemoveSequence(2).ok());
  EXPECT_EQ(engine->kv_pool().num_free(), engine->kv_pool().num_blocks());
}

// A checkpoint with a missing tensor and one with a mis-shaped tensor are refused with the
// tensor's name and the directory.
TEST(EngineBadInput, MissingOrMisShapedTensorIsNamed) {
  const std::string src = FixtureModelDir("olmoe");
  auto ckpt = Checkpoint::Open(src);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  const std::string victim = "model.layers.0.mlp.experts.1.down_proj.weight";
  for (int mode = 0; mode < 2; ++mode) {
    const std::string dir = ::testing::TempDir() + "/pw_bad_model_" + std::to_string(mode);
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(src + "/config.json", dir + "/config.json",
                               std::filesystem::copy_options::overwrite_existing);
    SafetensorsWriter w;
    for (const std::string& name : (*ckpt)->TensorNames()) {
      auto t = (*ckpt)->Get(name);
      ASSERT_TRUE(t.ok());
      if (name == victim) {
        if (mode == 0) continue;
        std::vector<int64_t> shape = {t->shape[1], t->shape[0]};  // transposed
        ASSERT_TRUE(w.Add(name, t->dtype, shape, t->data, t->nbytes).ok());
        continue;
      }
      ASSERT_TRUE(w.Add(name, t->dtype, t->shape, t->data, t->nbytes).ok());
    }
    ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
    auto e = Engine::Create(dir, {});
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find(victim), std::string::npos) << e.status().ToString();
    EXPECT_NE(e.status().message().find(dir), std::string::npos) << e.status().ToString();
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace pw::engine

namespace pw::engine {
namespace {

TEST(Perplexity, WindowRuleAndValueMatchManualComputation) {
  auto engine = MakeEngine("qwen2_moe");
  ASSERT_TRUE(engine);
  const size_t V = static_cast<size_t>(engine->vocab_size());
  std::mt19937 rng(3);
  std::vector<int32_t> ids(31);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % V);
  auto r = Perplexity(*engine, ids, 8);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Windows [0,8) [8,16) [16,24) [24,31): 7 + 7 + 7 + 6 predictions.
  EXPECT_EQ(r->n_windows, 4);
  EXPECT_EQ(r->n_tokens, 27);
  ASSERT_EQ(r->token_nll.size(), 27u);
  ASSERT_EQ(r->token_window.size(), 27u);
  double nll = 0;
  size_t k = 0;
  for (size_t start = 0; start < ids.size(); start += 8) {
    const size_t len = std::min<size_t>(8, ids.size() - start);
    std::vector<int32_t> w(ids.begin() + start, ids.begin() + start + len);
    auto lg = engine->ForwardLogits(w);
    ASSERT_TRUE(lg.ok());
    for (size_t i = 0; i + 1 < len; ++i, ++k) {
      double z = 0;
      for (size_t v = 0; v < V; ++v) z += std::exp(double((*lg)[i * V + v]));
      const double token = std::log(z) - (*lg)[i * V + w[i + 1]];
      nll += token;
      // Per-prediction values, in text order, tagged with their window.
      EXPECT_NEAR(r->token_nll[k], token, 1e-5 * std::abs(token) + 1e-6) << k;
      EXPECT_EQ(r->token_window[k], static_cast<int32_t>(start / 8)) << k;
    }
  }
  EXPECT_NEAR(r->nll_sum, nll, 1e-6 * nll);
  EXPECT_NEAR(r->ppl(), std::exp(nll / 27), 1e-6 * r->ppl());
  EXPECT_EQ(Perplexity(*engine, ids, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Perplexity(*engine, std::vector<int32_t>{1}, 8).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pw::engine

namespace pw::engine {
namespace {

// Checkpoints mixing dense-MLP and MoE layers (tests/engine/data, made by
// tests/engine/make_layer_mix_fixtures.py): mlp_only_layers and decoder_sparse_step.
TEST(LayerMix, DenseAndMoeLayersMatchReference) {
  const std::string root = std::string(PW_SOURCE_DIR) + "/tests/engine/data/";
  const std::vector<std::pair<std::string, std::vector<bool>>> cases = {
      {"qwen2_moe_mlp_only", {true, false, true}},
      {"qwen3_moe_sparse_step", {false, true, false}},
  };
  for (const auto& [name, moe_layers] : cases) {
    SCOPED_TRACE(name);
    auto engine = Engine::Create(root + name, {.block_size = 4, .max_batch_tokens = 8});
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    const auto& layers = (*engine)->model().layers();
    ASSERT_EQ(layers.size(), moe_layers.size());
    for (size_t l = 0; l < layers.size(); ++l) EXPECT_EQ(layers[l].is_moe, moe_layers[l]) << l;
    const size_t V = static_cast<size_t>((*engine)->vocab_size());
    auto refs = ReadRefLogits(root + name + "/logits.safetensors", V);
    ASSERT_FALSE(refs.empty());
    for (size_t p = 0; p < refs.size(); ++p) {
      auto got = (*engine)->ForwardLogits(refs[p].ids);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      for (size_t t = 0; t < refs[p].ids.size(); ++t) {
        const float* g = got->data() + t * V;
        const float* r = refs[p].logits.data() + t * V;
        EXPECT_LE(MaxAbsDiff(g, r, V), 2e-3) << "prompt " << p << " position " << t;
        EXPECT_EQ(Argmax(g, V), Argmax(r, V)) << "prompt " << p << " position " << t;
      }
    }
  }
}

}  // namespace
}  // namespace pw::engine
