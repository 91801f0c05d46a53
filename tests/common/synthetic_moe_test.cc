#include "common/formats/synthetic_moe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/dtype.h"
#include "common/formats/model_config.h"
#include "common/formats/safetensors.h"
#include "tests/common/test_util.h"

namespace pw {
namespace {

SyntheticMoeSpec Small(ModelType type) {
  SyntheticMoeSpec s;
  s.type = type;
  s.layers = 2;
  s.hidden = 64;
  s.heads = 4;
  s.kv_heads = 2;
  s.experts = 4;
  s.top_k = 2;
  s.expert_ffn = 32;
  s.shared_ffn = 48;
  s.vocab = 300;
  return s;
}

TEST(SyntheticMoeTest, DefaultsAreOlmoe1b7bDimensions) {
  SyntheticMoeSpec s;
  EXPECT_EQ(s.type, ModelType::kOlmoe);
  EXPECT_EQ(s.hidden, 2048);
  EXPECT_EQ(s.heads, 16);
  EXPECT_EQ(s.experts, 64);
  EXPECT_EQ(s.top_k, 8);
  EXPECT_EQ(s.expert_ffn, 1024);
  EXPECT_EQ(s.vocab, 50304);
  // 2 layers: ~2.1 GB (experts 805 MB/layer, attention 34 MB/layer, embeddings + lm_head 412 MB).
  double gb = static_cast<double>(SyntheticMoeBytes(s)) / 1e9;
  EXPECT_GT(gb, 2.0);
  EXPECT_LT(gb, 2.2);
}

TEST(SyntheticMoeTest, WritesLoadableCheckpointForEveryType) {
  for (ModelType type :
       {ModelType::kOlmoe, ModelType::kQwen2Moe, ModelType::kQwen3Moe, ModelType::kMixtral}) {
    SCOPED_TRACE(ModelTypeName(type));
    pw::testing::TempDir tmp;
    SyntheticMoeSpec spec = Small(type);
    ASSERT_TRUE(WriteSyntheticMoe(spec, tmp.path()).ok());

    auto cfg = LoadModelConfig(tmp.File("config.json"));
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    EXPECT_EQ(cfg->type, type);
    EXPECT_EQ(cfg->hidden_size, 64);
    EXPECT_EQ(cfg->num_layers, 2);
    EXPECT_EQ(cfg->num_kv_heads, 2);
    EXPECT_EQ(cfg->head_dim, 16);
    EXPECT_EQ(cfg->num_experts, 4);
    EXPECT_EQ(cfg->num_experts_per_tok, 2);
    EXPECT_EQ(cfg->moe_intermediate_size, 32);
    EXPECT_EQ(cfg->vocab_size, 300);
    EXPECT_EQ(cfg->shared_expert_intermediate_size, type == ModelType::kQwen2Moe ? 48 : 0);

    auto ck = Checkpoint::Open(tmp.path());
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    const bool mixtral = type == ModelType::kMixtral;
    const std::string moe = mixtral ? "block_sparse_moe." : "mlp.";
    const std::string gate = mixtral ? "w1" : "gate_proj";
    const std::string down = mixtral ? "w2" : "down_proj";
    EXPECT_TRUE((*ck)->Get("model.embed_tokens.weight", DType::kBF16, {300, 64}).ok());
    EXPECT_TRUE((*ck)->Get("lm_head.weight", DType::kBF16, {300, 64}).ok());
    EXPECT_TRUE((*ck)->Get("model.layers.1.self_attn.k_proj.weight", DType::kBF16, {32, 64}).ok());
    EXPECT_TRUE((*ck)->Get("model.layers.1." + moe + "gate.weight", DType::kBF16, {4, 64}).ok());
    EXPECT_TRUE(
        (*ck)
            ->Get("model.layers.1." + moe + "experts.3." + gate + ".weight", DType::kBF16, {32, 64})
            .ok());
    EXPECT_TRUE(
        (*ck)
            ->Get("model.layers.0." + moe + "experts.0." + down + ".weight", DType::kBF16, {64, 32})
            .ok());
    EXPECT_EQ((*ck)->Has("model.layers.0.self_attn.q_norm.weight"),
              type == ModelType::kOlmoe || type == ModelType::kQwen3Moe);
    if (type == ModelType::kOlmoe) {
      EXPECT_TRUE((*ck)->Get("model.layers.0.self_attn.k_norm.weight", DType::kBF16, {32}).ok());
    }
    if (type == ModelType::kQwen3Moe) {
      EXPECT_TRUE((*ck)->Get("model.layers.0.self_attn.k_norm.weight", DType::kBF16, {16}).ok());
    }
    EXPECT_EQ((*ck)->Has("model.layers.0.mlp.shared_expert_gate.weight"),
              type == ModelType::kQwen2Moe);
    EXPECT_EQ((*ck)->Has("model.layers.0.self_attn.q_proj.bias"), type == ModelType::kQwen2Moe);

    uint64_t data = 0;
    for (const auto& n : (*ck)->TensorNames()) data += (*ck)->Get(n)->nbytes;
    EXPECT_EQ(data, SyntheticMoeBytes(spec));
  }
}

// qwen3_next: Gated DeltaNet layers but every full_attention_interval-th, output-gated
// attention (q_proj twice as wide) with per-head norms, a gated shared expert; the config parses
// to the same hybrid. The quarter-width default keeps Qwen3-Next's 512 experts top-10.
TEST(SyntheticMoeTest, Qwen3NextIsAHybridWithTheLinearLayersTensors) {
  pw::testing::TempDir tmp;
  SyntheticMoeSpec spec = Small(ModelType::kQwen3Next);
  spec.heads = 2;  // head dim 32: a quarter rotary of 8
  spec.linear_key_heads = 2;
  spec.linear_value_heads = 4;
  spec.linear_head_dim = 8;
  spec.full_attention_interval = 2;
  ASSERT_TRUE(WriteSyntheticMoe(spec, tmp.path()).ok());
  auto cfg = LoadModelConfig(tmp.File("config.json"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->type, ModelType::kQwen3Next);
  EXPECT_EQ(cfg->linear_attention.layers, (std::vector<bool>{true, false}));
  EXPECT_EQ(cfg->linear_attention.num_value_heads, 4);
  EXPECT_EQ(cfg->rotary_dim, 8);
  EXPECT_EQ(cfg->shared_expert_intermediate_size, 48);
  auto ck = Checkpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  const int64_t conv = 2 * 2 * 8 + 4 * 8;
  EXPECT_TRUE((*ck)
                  ->Get("model.layers.0.linear_attn.in_proj_qkvz.weight", DType::kBF16,
                        {2 * 2 * 8 + 2 * 4 * 8, 64})
                  .ok());
  EXPECT_TRUE(
      (*ck)->Get("model.layers.0.linear_attn.conv1d.weight", DType::kBF16, {conv, 1, 4}).ok());
  EXPECT_TRUE((*ck)->Has("model.layers.0.linear_attn.A_log"));
  EXPECT_FALSE((*ck)->Has("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE((*ck)->Get("model.layers.1.self_attn.q_proj.weight", DType::kBF16, {128, 64}).ok());
  EXPECT_TRUE((*ck)->Has("model.layers.1.mlp.shared_expert_gate.weight"));
  uint64_t data = 0;
  for (const auto& n : (*ck)->TensorNames()) data += (*ck)->Get(n)->nbytes;
  EXPECT_EQ(data, SyntheticMoeBytes(spec));
  const SyntheticMoeSpec quarter = Qwen3NextQuarterSpec();
  EXPECT_EQ(quarter.experts, 512);
  EXPECT_EQ(quarter.top_k, 10);
  const double gb = static_cast<double>(SyntheticMoeBytes(quarter)) / 1e9;
  EXPECT_GT(gb, 4.4);
  EXPECT_LT(gb, 4.8);
}

// glm4_moe: a dense first layer, then MoE layers with the selection bias, ungated shared
// experts and q/k/v biases; the config carries the grouping and partial rotary.
TEST(SyntheticMoeTest, Glm4MoeHasDenseLayersSharedExpertsAndTheSelectionBias) {
  pw::testing::TempDir tmp;
  SyntheticMoeSpec spec = Small(ModelType::kGlm4Moe);
  spec.layers = 3;
  spec.experts = 8;
  spec.shared_ffn = 64;  // two shared experts of 32
  spec.dense_layers = 1;
  spec.dense_ffn = 96;
  spec.n_group = 2;
  spec.topk_group = 1;
  ASSERT_TRUE(WriteSyntheticMoe(spec, tmp.path()).ok());
  auto cfg = LoadModelConfig(tmp.File("config.json"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->type, ModelType::kGlm4Moe);
  EXPECT_EQ(cfg->first_k_dense_replace, 1);
  EXPECT_EQ(cfg->intermediate_size, 96);
  EXPECT_EQ(cfg->n_shared_experts, 2);
  EXPECT_EQ(cfg->shared_expert_intermediate_size, 64);
  EXPECT_EQ(cfg->n_group, 2);
  EXPECT_EQ(cfg->topk_group, 1);
  EXPECT_EQ(cfg->rotary_dim, 8);
  EXPECT_TRUE(cfg->qkv_bias);
  EXPECT_FALSE(cfg->IsMoeLayer(0));
  EXPECT_TRUE(cfg->IsMoeLayer(2));
  auto ck = Checkpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_TRUE((*ck)->Get("model.layers.0.mlp.gate_proj.weight", DType::kBF16, {96, 64}).ok());
  EXPECT_FALSE((*ck)->Has("model.layers.0.mlp.gate.weight"));
  for (const std::string l : {"1", "2"}) {
    const std::string m = "model.layers." + l + ".mlp.";
    EXPECT_TRUE((*ck)->Get(m + "gate.e_score_correction_bias", DType::kBF16, {8}).ok());
    EXPECT_TRUE((*ck)->Get(m + "shared_experts.down_proj.weight", DType::kBF16, {64, 64}).ok());
    EXPECT_TRUE((*ck)->Get(m + "experts.7.up_proj.weight", DType::kBF16, {32, 64}).ok());
    EXPECT_TRUE((*ck)->Get("model.layers." + l + ".self_attn.v_proj.bias", DType::kBF16, {32}).ok());
  }
  uint64_t data = 0;
  for (const auto& n : (*ck)->TensorNames()) data += (*ck)->Get(n)->nbytes;
  EXPECT_EQ(data, SyntheticMoeBytes(spec));

  // GLM-4.5-Air at half width: ~1.9 GB.
  const double gb = static_cast<double>(SyntheticMoeBytes(Glm4MoeAirHalfSpec())) / 1e9;
  EXPECT_GT(gb, 1.85);
  EXPECT_LT(gb, 1.95);
  // A grouping the gate could not run is refused.
  spec.n_group = 3;
  EXPECT_EQ(WriteSyntheticMoe(spec, tmp.path()).code(), StatusCode::kInvalidArgument);
}

TEST(SyntheticMoeTest, WeightsLookLikeAnInitialisation) {
  pw::testing::TempDir tmp;
  SyntheticMoeSpec spec = Small(ModelType::kOlmoe);
  spec.vocab = 4000;
  ASSERT_TRUE(WriteSyntheticMoe(spec, tmp.path()).ok());
  auto ck = Checkpoint::Open(tmp.path());
  ASSERT_TRUE(ck.ok());
  auto emb = (*ck)->Get("model.embed_tokens.weight");
  ASSERT_TRUE(emb.ok());
  double sum = 0, sq = 0, maxabs = 0;
  int64_t n = emb->numel();
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, emb->data + 2 * i, 2);
    double v = Bf16ToF32(b);
    sum += v;
    sq += v * v;
    maxabs = std::max(maxabs, std::fabs(v));
  }
  double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(sd, 0.02, 0.001);
  EXPECT_LE(maxabs, 0.02 * 2 * std::sqrt(3.0) * 1.01);
  auto norm = (*ck)->Get("model.layers.0.input_layernorm.weight");
  ASSERT_TRUE(norm.ok());
  uint16_t b;
  std::memcpy(&b, norm->data, 2);
  EXPECT_EQ(Bf16ToF32(b), 1.0f);
}

TEST(SyntheticMoeTest, DeterministicPerSeed) {
  pw::testing::TempDir a, b, c;
  SyntheticMoeSpec spec = Small(ModelType::kQwen3Moe);
  ASSERT_TRUE(WriteSyntheticMoe(spec, a.path()).ok());
  ASSERT_TRUE(WriteSyntheticMoe(spec, b.path()).ok());
  spec.seed = 2;
  ASSERT_TRUE(WriteSyntheticMoe(spec, c.path()).ok());
  auto fa = SafetensorsFile::Open(a.File("model.safetensors"));
  auto fb = SafetensorsFile::Open(b.File("model.safetensors"));
  auto fc = SafetensorsFile::Open(c.File("model.safetensors"));
  ASSERT_TRUE(fa.ok() && fb.ok() && fc.ok());
  auto ta = (*fa)->Get("lm_head.weight"), tb = (*fb)->Get("lm_head.weight"),
       tc = (*fc)->Get("lm_head.weight");
  EXPECT_EQ(std::memcmp(ta->data, tb->data, ta->nbytes), 0);
  EXPECT_NE(std::memcmp(ta->data, tc->data, ta->nbytes), 0);
}

TEST(SyntheticMoeTest, RejectsInconsistentSpecs) {
  pw::testing::TempDir tmp;
  SyntheticMoeSpec s = Small(ModelType::kOlmoe);
  s.heads = 5;
  EXPECT_EQ(WriteSyntheticMoe(s, tmp.path()).code(), StatusCode::kInvalidArgument);
  s = Small(ModelType::kOlmoe);
  s.top_k = 9;
  EXPECT_EQ(WriteSyntheticMoe(s, tmp.path()).code(), StatusCode::kInvalidArgument);
  s = Small(ModelType::kOlmoe);
  s.kv_heads = 3;
  EXPECT_EQ(WriteSyntheticMoe(s, tmp.path()).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pw
