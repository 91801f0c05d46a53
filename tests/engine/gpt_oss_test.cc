// gpt_oss's pieces against hand-computed values (the clamped SwiGLU, attention with a sliding
// window and sinks, MXFP4 decoding), its MXFP4 checkpoint against the same values stored as
// bf16, and its bad input: MXFP4 scales of the wrong shape, a layer_types list of the wrong
// length. HF parity of the whole model: engine_test (fixtures gpt_oss, gpt_oss_mxfp4).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/formats/checkpoint_experts.h"
#include "common/formats/model_config.h"
#include "common/formats/safetensors.h"
#include "common/formats/stacked_experts.h"
#include "common/formats/apw_store.h"
#include "common/formats/width_map.h"
#include "engine/experts/apw_expert_provider.h"
#include "quant/quantize_model.h"
#include "common/formats/synthetic_moe.h"
#include "engine/engine.h"
#include "engine/experts/expert_activation.h"
#include "engine/hooks/lynx_routing_hook.h"
#include "policies/lynx/lynx_remap.h"
#include "engine/models/model.h"
#include "kernels/cpu/window_sink_attention.h"
#include "tests/common/test_util.h"
#include "tests/engine/miss_policy_check.h"
#include "tests/engine/test_util.h"

namespace pw::engine {
namespace {

TEST(GptOss, ClampedSwiGluMatchesHandComputedValues) {
  // g = min(gate, 7), u = clamp(up, -7, 7), (u + 1) * g * sigmoid(1.702 g).
  const float gate[] = {1.f, 9.f, -2.f, 0.f};
  const float up[] = {0.5f, -10.f, 8.f, 3.f};
  float out[4];
  ClampedSwiGlu(gate, up, 4, out);
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  EXPECT_NEAR(out[0], 1.5 * 1.0 * sig(1.702), 1e-6);
  EXPECT_NEAR(out[1], -6.0 * 7.0 * sig(1.702 * 7), 1e-5);  // both clamped
  EXPECT_NEAR(out[2], 8.0 * -2.0 * sig(-3.404), 1e-6);     // up clamped to 7, + 1
  EXPECT_EQ(out[3], 0.f);
}

// One kv head, head_dim 2, blocks of 2 positions, fp32 pages; K/V of position j are
// k = (j + 1, 1), v = (j, -j).
struct TinyKv {
  static constexpr int kPositions = 5, kBlock = 2, kD = 2;
  std::vector<std::vector<float>> pages;
  std::vector<const uint8_t*> page_ptrs;
  std::vector<int32_t> table;
  TinyKv() {
    const int blocks = (kPositions + kBlock - 1) / kBlock;
    pages.assign(blocks, std::vector<float>(2 * kBlock * kD, 0.f));
    for (int j = 0; j < kPositions; ++j) {
      float* p = pages[j / kBlock].data();
      const int s = j % kBlock;
      p[s * kD] = static_cast<float>(j + 1);
      p[s * kD + 1] = 1.f;
      p[kBlock * kD + s * kD] = static_cast<float>(j);
      p[kBlock * kD + s * kD + 1] = static_cast<float>(-j);
    }
    // Blocks in reverse order in the pool, so the table is exercised.
    for (int b = 0; b < blocks; ++b) {
      page_ptrs.push_back(reinterpret_cast<const uint8_t*>(pages[blocks - 1 - b].data()));
      table.push_back(blocks - 1 - b);
    }
  }
  cpu::PagedKvView View() const {
    return {page_ptrs.data(), 1, cpu::KvElement::kF32, 1, kBlock, kD};
  }
};

TEST(GptOss, WindowAndSinkAttentionMatchHandComputedValues) {
  TinyKv kv;
  const float q[] = {0.3f, -0.2f};
  const int32_t pos = 4;
  const int32_t* tables[] = {kv.table.data()};
  cpu::AttentionQueries qs{q, 1, 1, &pos, tables, 0.5f};
  const float sink = 0.7f;
  for (int window : {0, 2, 3}) {
    for (bool with_sink : {false, true}) {
      const cpu::WindowSinks ws{window, with_sink ? &sink : nullptr};
      std::vector<float> scores(cpu::WindowSinkAttentionScoreFloats(pos)), widen(8);
      float out[2];
      cpu::WindowSinkAttention(cpu::Kernels(), kv.View(), qs, ws, 0, 1, scores.data(),
                               widen.data(), out);
      const int first = window > 0 ? pos + 1 - window : 0;
      double denom = with_sink ? std::exp(double(sink)) : 0.0, o0 = 0, o1 = 0;
      for (int j = first; j <= pos; ++j) denom += std::exp(0.5 * (0.3 * (j + 1) - 0.2));
      for (int j = first; j <= pos; ++j) {
        const double p = std::exp(0.5 * (0.3 * (j + 1) - 0.2)) / denom;
        o0 += p * j;
        o1 += p * -j;
      }
      EXPECT_NEAR(out[0], o0, 1e-5) << "window " << window << " sink " << with_sink;
      EXPECT_NEAR(out[1], o1, 1e-5) << "window " << window << " sink " << with_sink;
    }
  }
  // No window, no sink: PagedAttention's result bit for bit.
  std::vector<float> scores(cpu::WindowSinkAttentionScoreFloats(pos)), widen(8);
  float a[2], b[2];
  cpu::WindowSinkAttention(cpu::Kernels(), kv.View(), qs, {}, 0, 1, scores.data(), widen.data(),
                           a);
  cpu::PagedAttention(cpu::Kernels(), kv.View(), qs, 0, 1, scores.data(), widen.data(), b);
  EXPECT_EQ(std::memcmp(a, b, sizeof(a)), 0);
}

TEST(GptOss, Mxfp4DecodesLowNibbleFirstTimesTheBlockExponent) {
  uint8_t blocks[16] = {};
  blocks[0] = 0x2F;  // low nibble 0xF = -6, high 0x2 = 1
  blocks[1] = 0x93;  // low 0x3 = 1.5, high 0x9 = -0.5
  blocks[15] = 0x70;  // low 0 = 0, high 0x7 = 6
  const uint8_t scale = 127 + 3;  // x 8
  uint16_t out[32];
  DequantizeMxfp4(blocks, &scale, 1, out);
  EXPECT_EQ(Bf16ToF32(out[0]), -48.f);
  EXPECT_EQ(Bf16ToF32(out[1]), 8.f);
  EXPECT_EQ(Bf16ToF32(out[2]), 12.f);
  EXPECT_EQ(Bf16ToF32(out[3]), -4.f);
  EXPECT_EQ(Bf16ToF32(out[4]), 0.f);
  EXPECT_EQ(Bf16ToF32(out[30]), 0.f);
  EXPECT_EQ(Bf16ToF32(out[31]), 48.f);
  const uint8_t small = 127 - 2;  // x 1/4
  DequantizeMxfp4(blocks, &small, 1, out);
  EXPECT_EQ(Bf16ToF32(out[0]), -1.5f);
}

// Copies the gpt_oss_mxfp4 fixture into `dir`, each *_blocks / *_scales pair either
// dequantized into the float layout (x @ W, [E, in, out], bf16) or kept with `scales_edit`
// applied to the scales' shape.
void CopyMxfp4Fixture(const std::string& dir, bool dequantize, int64_t scales_cut = 0) {
  const std::string src = testing::FixtureModelDir("gpt_oss_mxfp4");
  std::filesystem::copy_file(src + "/config.json", dir + "/config.json");
  auto ck = Checkpoint::Open(src);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  SafetensorsWriter w;
  std::vector<std::vector<uint16_t>> keep;
  for (const std::string& name : (*ck)->TensorNames()) {
    auto t = (*ck)->Get(name);
    ASSERT_TRUE(t.ok());
    const bool is_blocks = name.size() > 7 && name.compare(name.size() - 7, 7, "_blocks") == 0;
    const bool is_scales = name.size() > 7 && name.compare(name.size() - 7, 7, "_scales") == 0;
    if (dequantize && is_scales) continue;
    if (dequantize && is_blocks) {
      const std::string base = name.substr(0, name.size() - 7);
      auto s = (*ck)->Get(base + "_scales");
      ASSERT_TRUE(s.ok());
      const int64_t E = t->shape[0], rows = t->shape[1], cols = t->shape[2] * 32;
      std::vector<uint16_t> rm(static_cast<size_t>(E * rows * cols));
      DequantizeMxfp4(t->data, s->data, static_cast<size_t>(E * rows * t->shape[2]), rm.data());
      keep.emplace_back(rm.size());
      std::vector<uint16_t>& tr = keep.back();  // [E, cols, rows]
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            tr[(e * cols + c) * rows + r] = rm[(e * rows + r) * cols + c];
          }
        }
      }
      ASSERT_TRUE(w.Add(base, DType::kBF16, {E, cols, rows}, tr.data(), tr.size() * 2).ok());
      continue;
    }
    std::vector<int64_t> shape = t->shape;
    size_t nbytes = t->nbytes;
    if (is_scales && scales_cut > 0 && name.find("layers.1.mlp.experts.down") != std::string::npos) {
      shape.back() -= scales_cut;
      nbytes = static_cast<size_t>(shape[0] * shape[1] * shape[2]);
    }
    ASSERT_TRUE(w.Add(name, t->dtype, shape, t->data, nbytes).ok());
  }
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
}

// The MXFP4 checkpoint runs as the bf16 checkpoint of its dequantized values, bit for bit: the
// two readers of stacked_experts.h give the same expert matrices.
TEST(GptOss, Mxfp4CheckpointEqualsItsDequantizedBf16Checkpoint) {
  pw::testing::TempDir tmp;
  CopyMxfp4Fixture(tmp.path(), /*dequantize=*/true);
  auto mx = Engine::Create(testing::FixtureModelDir("gpt_oss_mxfp4"), {});
  auto bf = Engine::Create(tmp.path(), {});
  ASSERT_TRUE(mx.ok()) << mx.status().ToString();
  ASSERT_TRUE(bf.ok()) << bf.status().ToString();
  std::vector<int32_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back((i * 37 + 5) % 1000 + 3);
  auto a = (*mx)->ForwardLogits(ids);
  auto b = (*bf)->ForwardLogits(ids);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0);
}

TEST(GptOss, Mxfp4ScalesOfTheWrongShapeAreNamed) {
  pw::testing::TempDir tmp;
  CopyMxfp4Fixture(tmp.path(), /*dequantize=*/false, /*scales_cut=*/1);
  auto m = Model::Load(tmp.path());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("model.layers.1.mlp.experts.down_proj_scales"),
            std::string::npos)
      << m.status().ToString();
  EXPECT_NE(m.status().message().find("MXFP4 scales"), std::string::npos);
}

// A long generation keeps a bounded number of KV pages on the sliding layers (0 and 2, window
// 8): blocks behind the window give theirs back, while the full layer holds one page per block.
// The tokens are those the teacher-forced pass (one prefill over leased blocks, nothing
// released) ranks first at every position.
TEST(GptOss, SlidingLayersKeepBoundedPagesDuringALongGeneration) {
  const int bs = 4, window = 8, steps = 120;
  auto e = Engine::Create(testing::FixtureModelDir("gpt_oss"), {.block_size = bs});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  Engine& engine = **e;
  const std::vector<int32_t> prompt = {17, 300, 5, 911, 42};
  SamplingParams sp;
  sp.max_tokens = steps;
  sp.ignore_eos = true;
  ASSERT_TRUE(engine.AddSequence(1, prompt, sp).ok());
  std::vector<int32_t> got;
  int most_sliding = 0, most_full = 0;
  while (engine.HasWork()) {
    auto r = engine.Step();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (auto& u : r->updates) got.insert(got.end(), u.new_tokens.begin(), u.new_tokens.end());
    const memory::KvBlockPool& kv = engine.kv_pool();
    most_sliding = std::max({most_sliding, kv.LayerPagesInUse(0), kv.LayerPagesInUse(2)});
    most_full = std::max(most_full, kv.LayerPagesInUse(1));
  }
  ASSERT_EQ(got.size(), static_cast<size_t>(steps));
  // The window's positions span at most window / bs + 1 blocks, plus the block being filled.
  EXPECT_LE(most_sliding, window / bs + 2);
  EXPECT_GE(most_full, (static_cast<int>(prompt.size()) + steps - 1) / bs);
  EXPECT_EQ(engine.kv_pool().num_free(), engine.kv_pool().num_blocks());

  std::vector<int32_t> all = prompt;
  all.insert(all.end(), got.begin(), got.end());
  auto tf = engine.ForwardLogits(std::span<const int32_t>(all.data(), all.size() - 1));
  ASSERT_TRUE(tf.ok()) << tf.status().ToString();
  const size_t V = static_cast<size_t>(engine.vocab_size());
  for (size_t i = 0; i < got.size(); ++i) {
    const float* row = tf->data() + (prompt.size() - 1 + i) * V;
    EXPECT_EQ(got[i], static_cast<int32_t>(std::max_element(row, row + V) - row)) << "token " << i;
  }
}

// LYNX over gpt_oss's router: k and N come from the config (top-4 of 16), every token keeps
// exactly k distinct experts, each weighted by its softmax probability (over all experts, the
// router bias included) renormalised over its k: the weights gpt-oss's softmax over the k
// chosen logits gives.
class CheckedLynx final : public RoutingHook {
 public:
  explicit CheckedLynx(LynxRoutingHook* inner) : inner_(inner) {}
  Status Rewrite(const RoutingContext& ctx, std::vector<ExpertAssignment>* a) override {
    PW_RETURN_IF_ERROR(inner_->Rewrite(ctx, a));
    EXPECT_EQ(ctx.top_k, 4);
    EXPECT_EQ(ctx.num_experts, 16);
    EXPECT_EQ(ctx.gate, GateKind::kSoftmaxTopK);
    const size_t T = static_cast<size_t>(ctx.num_tokens), k = 4, E = 16;
    if (a->size() != T * k) {
      ADD_FAILURE() << a->size() << " assignments for " << T << " tokens";
      return Status::Ok();
    }
    for (size_t t = 0; t < T; ++t) {
      const ExpertAssignment* row = a->data() + t * k;
      const float* p = ctx.router_probs + t * E;
      float sum = 0.f;
      for (size_t j = 0; j < k; ++j) {
        EXPECT_EQ(row[j].token, static_cast<int32_t>(t));
        for (size_t i = 0; i < j; ++i) EXPECT_NE(row[i].expert, row[j].expert);
        sum += p[row[j].expert];
      }
      for (size_t j = 0; j < k; ++j) EXPECT_NEAR(row[j].weight, p[row[j].expert] / sum, 1e-6f);
    }
    ++calls;
    return Status::Ok();
  }
  int calls = 0;

 private:
  LynxRoutingHook* inner_;
};

TEST(GptOss, LynxKeepsKOfNFromTheConfigWithTheRoutersWeights) {
  auto e = Engine::Create(testing::FixtureModelDir("gpt_oss"), {.return_logits = true});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  lynx::LynxRemapper remapper({});
  LynxRoutingHook hook(&remapper);
  CheckedLynx checked(&hook);
  MoeHooks h;
  h.routing_hook = &checked;
  (*e)->SetMoeHooks(h);
  SamplingParams sp;
  sp.max_tokens = 7;
  sp.ignore_eos = true;
  for (int b = 0; b < 8; ++b) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 12 + b; ++i) prompt.push_back((b * 131 + i * 17) % 1000 + 3);
    ASSERT_TRUE((*e)->AddSequence(static_cast<SeqId>(b + 1), prompt, sp).ok());
  }
  while ((*e)->HasWork()) {
    auto r = (*e)->Step();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const auto& u : r->updates) {
      for (float v : u.logits) ASSERT_TRUE(std::isfinite(v));
    }
  }
  (*e)->SetMoeHooks({});
  EXPECT_GT(checked.calls, 0);
  EXPECT_GT(hook.stats().applied_calls, 0);
  EXPECT_GT(hook.stats().tokens_changed, 0);
}

// make_synthetic_moe --type gpt_oss's writer: a checkpoint the engine loads and runs (stacked
// experts with biases, sinks, alternating layer types), small here.
TEST(GptOss, SyntheticCheckpointLoadsAndRuns) {
  pw::testing::TempDir tmp;
  SyntheticMoeSpec spec = GptOss20bSpec();
  spec.layers = 3;
  spec.hidden = 64;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.experts = 8;
  spec.expert_ffn = 32;
  spec.vocab = 300;
  ASSERT_TRUE(WriteSyntheticMoe(spec, tmp.path()).ok());
  auto e = Engine::Create(tmp.path(), {});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const ModelConfig& c = (*e)->model().config();
  EXPECT_EQ(c.type, ModelType::kGptOss);
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ((*e)->model().layers()[1].expert_down_bias.size(), 8u * 64u);
  auto logits = (*e)->ForwardLogits(std::vector<int32_t>{1, 2, 3, 200, 5});
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
  const double gb = static_cast<double>(SyntheticMoeBytes(GptOss20bSpec())) / 1e9;
  // 2 layers of 32 experts x 3 x 2880^2 bf16 (3.2 GB), embeddings and lm_head (2.3 GB).
  EXPECT_GT(gb, 5.5);
  EXPECT_LT(gb, 5.7);
}

// Expert misses over gpt_oss, the policy sized from its config (3 layers, 16 experts, top-4):
// fetching every miss gives the all-resident logits bit for bit and counts every slot;
// substituting (first-choice) keeps k experts per token and finite logits.
TEST(GptOss, MissPoliciesUseKOfNFromTheConfig) {
  testing::ExpectMissPoliciesUseKOfNFromTheConfig("gpt_oss", 3, 4);
}

// Expert stores (pw-quantize, the broker) read experts through CheckpointExperts: for gpt_oss
// its stacked matrices (bf16 or MXFP4) as the engine loads them, bit for bit.
TEST(GptOss, CheckpointExpertsGiveTheEnginesExpertMatrices) {
  for (const char* fixture : {"gpt_oss", "gpt_oss_mxfp4"}) {
    SCOPED_TRACE(fixture);
    auto ck = CheckpointExperts::Open(testing::FixtureModelDir(fixture));
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    auto model = Model::Load(testing::FixtureModelDir(fixture));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    for (int64_t l : {0, 2}) {
      for (int64_t x : {0, 9, 15}) {
        auto e = (*ck)->Get(l, x);
        ASSERT_TRUE(e.ok()) << e.status().ToString();
        const MlpWeights& w = (*model)->layers()[static_cast<size_t>(l)].experts[static_cast<size_t>(x)];
        const size_t n = static_cast<size_t>(e->ffn * e->hidden) * 2;
        EXPECT_EQ(std::memcmp(e->gate, w.gate.data, n), 0);
        EXPECT_EQ(std::memcmp(e->up, w.up.data, n), 0);
        EXPECT_EQ(std::memcmp(e->down, w.down.data, n), 0);
      }
    }
  }
}

// An any-precision store built from gpt_oss's checkpoint (pw-quantize's QuantizeModel): at bf16
// width the checkpoint's logits bit for bit, at 8 bits close; the expert biases come from the
// model on every runner path (the bf16 runner, the int8 fast path).
TEST(GptOss, AnyPrecisionStoreRunsWithTheExpertBiases) {
  pw::testing::TempDir dir;
  anyprec::QuantizeModelOptions o;
  o.model_dir = testing::FixtureModelDir("gpt_oss");
  o.tokenizer_path = "/nonexistent/tokenizer.json";
  o.calib_random_tokens = 200;
  o.out_path = dir.File("gpt_oss.apw");
  o.threads = 2;
  o.ctx = 64;
  o.progress = false;
  auto r = anyprec::QuantizeModel(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_blocks, 3 * 16 * 2);
  auto opened = apw::ApwStore::Open(o.out_path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::shared_ptr<const apw::ApwStore> store = std::move(opened).value();
  auto eng = Engine::Create(testing::FixtureModelDir("gpt_oss"), {});
  ASSERT_TRUE(eng.ok()) << eng.status().ToString();
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back((i * 37 + 3) % 1000 + 3);
  auto ref = (*eng)->ForwardLogits(ids);
  ASSERT_TRUE(ref.ok());
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
  };
  for (int bits : {8, anyprec::kBf16Bits}) {
    auto provider = anyprec::ApwExpertProvider::Create(store, (*eng)->model(),
                                                       *anyprec::WidthMap::Uniform(bits, 3, 16));
    ASSERT_TRUE(provider.ok()) << provider.status().ToString();
    MoeHooks hooks;
    hooks.provider = provider->get();
    (*eng)->SetMoeHooks(hooks);
    auto got = (*eng)->ForwardLogits(ids);
    (*eng)->SetMoeHooks({});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    if (bits == anyprec::kBf16Bits) {
      EXPECT_EQ(rel(*got, *ref), 0.0);
    } else {
      // 0.029 here (8-bit codes, int8 activations on the fast path); 0.22 when a runner
      // leaves the biases out.
      EXPECT_LT(rel(*got, *ref), 0.06) << "8 bits";
    }
  }
}

// What a 4-bit any-precision store loses against MXFP4 on the same random weights
// (docs/quality.md prints these numbers): relative L2 logit error against HF's float32 logits
// of the bf16 model (gpt_oss) for the MXFP4 checkpoint and for 3..8-bit stores built from the
// bf16 checkpoint, and of 4-bit stores built from the MXFP4 checkpoint against HF's logits of
// that checkpoint (whether 4 planes reproduce MXFP4).
TEST(GptOss, AnyPrecisionStoresAgainstMxfp4) {
  auto rel = [](const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
  };
  // The engine's logits over every fixture prompt of `ref_fixture`, with `store` at `bits`
  // (0: the checkpoint's experts), against that fixture's HF logits.
  auto error = [&](const std::string& model, const std::string& ref_fixture,
                   std::shared_ptr<const apw::ApwStore> store, int bits) -> double {
    auto eng = Engine::Create(testing::FixtureModelDir(model), {});
    EXPECT_TRUE(eng.ok()) << eng.status().ToString();
    std::unique_ptr<anyprec::ApwExpertProvider> provider;
    if (store != nullptr) {
      auto p = anyprec::ApwExpertProvider::Create(store, (*eng)->model(),
                                                  *anyprec::WidthMap::Uniform(bits, 3, 16));
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      provider = std::move(p).value();
      MoeHooks hooks;
      hooks.provider = provider.get();
      (*eng)->SetMoeHooks(hooks);
    }
    const size_t V = static_cast<size_t>((*eng)->vocab_size());
    auto refs = testing::ReadRefLogits(testing::FixtureModelDir(ref_fixture) + "/logits.safetensors", V);
    double worst = 0;
    for (const auto& r : refs) {
      auto got = (*eng)->ForwardLogits(r.ids);
      EXPECT_TRUE(got.ok());
      worst = std::max(worst, rel(got->data(), r.logits.data(), got->size()));
    }
    (*eng)->SetMoeHooks({});
    return worst;
  };
  auto build = [&](const std::string& model, const std::string& path) {
    anyprec::QuantizeModelOptions o;
    o.model_dir = testing::FixtureModelDir(model);
    o.tokenizer_path = "/nonexistent/tokenizer.json";
    o.calib_random_tokens = 200;
    o.out_path = path;
    o.threads = 2;
    o.ctx = 64;
    o.progress = false;
    auto r = anyprec::QuantizeModel(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    auto s = apw::ApwStore::Open(path);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::shared_ptr<const apw::ApwStore>(std::move(s).value());
  };
  pw::testing::TempDir dir;
  auto from_bf16 = build("gpt_oss", dir.File("bf16.apw"));
  auto from_mxfp4 = build("gpt_oss_mxfp4", dir.File("mxfp4.apw"));
  const double mxfp4 = error("gpt_oss_mxfp4", "gpt_oss", nullptr, 0);
  std::printf("vs the bf16 model's HF logits: MXFP4 checkpoint %.4f\n", mxfp4);
  double four_bf16 = 0;
  for (int bits = 3; bits <= 8; ++bits) {
    const double e = error("gpt_oss", "gpt_oss", from_bf16, bits);
    if (bits == 4) four_bf16 = e;
    std::printf("  %d-bit store from bf16 %.4f\n", bits, e);
  }
  const double four = error("gpt_oss_mxfp4", "gpt_oss_mxfp4", from_mxfp4, 4);
  std::printf("vs the MXFP4 checkpoint's HF logits: 4-bit store from MXFP4 %.4f, 8-bit %.4f\n",
              four, error("gpt_oss_mxfp4", "gpt_oss_mxfp4", from_mxfp4, 8));
  // What docs/quality.md states: on these weights the 4-bit store built from bf16 is closer to
  // the bf16 model than MXFP4 is, and 4 planes built from the MXFP4 values do not reproduce
  // MXFP4 (one 16-entry table per row cannot hold a row's 32-value block scales).
  EXPECT_LT(four_bf16, mxfp4);
  EXPECT_GT(four, 1e-2);
}

TEST(GptOss, LayerTypesOfTheWrongLengthAreNamed) {
  std::ifstream f(testing::FixtureModelDir("gpt_oss") + "/config.json");
  nlohmann::json j = nlohmann::json::parse(f);
  auto good = ParseModelConfig(j.dump(), "config.json");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->layer_sliding, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(good->sliding_window, 8);
  j["layer_types"].erase(j["layer_types"].size() - 1);
  auto bad = ParseModelConfig(j.dump(), "config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("layer_types"), std::string::npos)
      << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("num_hidden_layers is 3"), std::string::npos);
  j["layer_types"] = {"sliding_attention", "chunked_attention", "full_attention"};
  auto unknown = ParseModelConfig(j.dump(), "config.json");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("layer_types[1]"), std::string::npos);
  // Without its RoPE settings (HF's default is YaRN, factor 32): refused, never plain RoPE.
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  j.erase("rope_parameters");
  auto no_rope = ParseModelConfig(j.dump(), "config.json");
  ASSERT_FALSE(no_rope.ok());
  EXPECT_NE(no_rope.status().message().find("rope_parameters"), std::string::npos)
      << no_rope.status().ToString();
}

}  // namespace
}  // namespace pw::engine
