// deepseek_v3's pieces: its MLA layers and the latent KV pages they keep (one row of
// kv_lora_rank + qk_rope_head_dim values per token and layer, not 2 * heads * head_dim), its
// config (YaRN's mscale_all_dim in the softmax scale, moe_layer_freq, Kimi-K2's model_type over
// the DeepseekV3 architecture), FP8 block-scaled weights, and its bad input: inconsistent MLA
// dimensions, n_group not dividing the experts, an FP8 weight without its scale tensor. HF
// parity of the whole model: engine_test (fixtures deepseek_v3, deepseek_v3_direct, kimi_k2,
// deepseek_v3_fp8).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/dtype.h"
#include "common/formats/checkpoint_experts.h"
#include "common/formats/model_config.h"
#include "common/formats/safetensors.h"
#include "common/formats/synthetic_moe.h"
#include "engine/engine.h"
#include "engine/models/model.h"
#include "tests/common/test_util.h"
#include "tests/engine/test_util.h"

namespace pw::engine {
namespace {

using testing::WriteFixtureCopy;

// Loads a copy of `fixture` with `drop` left out and `edit` applied; returns the status.
Status LoadEdited(const std::string& fixture, const std::string& drop,
                  const std::function<void(nlohmann::json&)>& edit) {
  pw::testing::TempDir tmp;
  WriteFixtureCopy(fixture, tmp.path(), drop, edit);
  return Model::Load(tmp.path()).status();
}

// tests/fixtures/models/deepseek_v3: 3 layers (the first dense), 4 heads, q_lora_rank 24,
// kv_lora_rank 32, qk_nope 16, qk_rope 8, v 12, YaRN factor 4 with mscale = mscale_all_dim = 1.
TEST(DeepseekV3, MlaLayersAndTheirLatentKvPages) {
  const std::string dir = testing::FixtureModelDir("deepseek_v3");
  auto m = Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.type, ModelType::kDeepseekV3);
  EXPECT_EQ(c.mla.q_lora_rank, 24);
  EXPECT_EQ(c.mla.latent_dim(), 40);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_TRUE(c.mla.rope_interleave);
  // qk_head_dim^-0.5 times YaRN's mscale(4, mscale_all_dim 1)^2 (HF yarn_apply_mscale).
  const double mscale = 0.1 * std::log(4.0) + 1.0;
  EXPECT_NEAR(c.mla.softmax_scale, mscale * mscale / std::sqrt(24.0), 1e-12);
  EXPECT_EQ(c.rope_scaling.attention_factor, 1.0);  // mscale / mscale_all_dim
  for (int l = 0; l < 3; ++l) {
    const LayerWeights& w = (*m)->layers()[static_cast<size_t>(l)];
    EXPECT_TRUE(w.is_mla) << l;
    EXPECT_EQ(w.q.data, nullptr);
    EXPECT_EQ(w.mla.q_a.rows, 24);
    EXPECT_EQ(w.mla.q_b.rows, 4 * 24);
    EXPECT_EQ(w.mla.q.data, nullptr);
    EXPECT_EQ(w.mla.kv_b.rows, 4 * (16 + 12));
    EXPECT_EQ(w.mla.uk_t.rows, 4 * 32);
    EXPECT_EQ(w.mla.uk_t.cols, 16);
    // uk_t is W_UK transposed per head: row h*32 + j, column i = kv_b row h*28 + i, column j.
    EXPECT_EQ(w.mla.uk_t.data[(1 * 32 + 5) * 16 + 3], w.mla.kv_b.data[(1 * 28 + 3) * 32 + 5]);
    EXPECT_EQ(w.is_moe, l >= 1) << l;
    if (w.is_moe) {
      EXPECT_EQ(w.gate, GateKind::kSigmoidGroupedTopK);
      EXPECT_EQ(w.router_bias.size(), 16u);
      EXPECT_TRUE(w.has_shared_expert);
    }
  }
  // Without q_lora: q_proj from the hidden state.
  auto direct = Model::Load(testing::FixtureModelDir("deepseek_v3_direct"));
  ASSERT_TRUE(direct.ok()) << direct.status().ToString();
  EXPECT_EQ((*direct)->config().mla.q_lora_rank, 0);
  EXPECT_EQ((*direct)->layers()[0].mla.q.rows, 4 * 24);
  EXPECT_EQ((*direct)->layers()[0].mla.q_a.data, nullptr);

  // The KV pool: every layer a latent of 40 values per token, one page per block and layer of
  // block_size * 40 elements: 40 * 2 = 80 bytes per token and layer in bf16 (a full-attention
  // cache of the expanded heads would keep 4 * (24 + 12) = 144 values).
  for (memory::KvDtype dtype : {memory::KvDtype::kF32, memory::KvDtype::kBf16}) {
    auto e = Engine::Create(dir, {.block_size = 16, .kv_dtype = dtype});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const memory::KvBlockPool& pool = (*e)->kv_pool();
    const size_t eb = dtype == memory::KvDtype::kF32 ? 4 : 2;
    for (int l = 0; l < 3; ++l) {
      EXPECT_EQ(pool.specs()[static_cast<size_t>(l)].kind, memory::KvKind::kLatent);
      EXPECT_EQ(pool.specs()[static_cast<size_t>(l)].latent_dim, 40);
      EXPECT_EQ(pool.LayerPages(l), 1);
    }
    EXPECT_EQ(pool.pages().page_bytes(), 16 * 40 * eb);
    EXPECT_EQ(pool.bytes_per_block(), 3 * 16 * 40 * eb);
  }
}

// Kimi-K2's config.json says model_type kimi_k2 over DeepseekV3ForCausalLM: it loads as
// deepseek_v3 keeping its own model_type string; kimi_k2 without that architecture is refused
// naming the field.
TEST(DeepseekV3, KimiK2LoadsAsDeepseekV3OnlyWithItsArchitecture) {
  auto m = Model::Load(testing::FixtureModelDir("kimi_k2"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->config().type, ModelType::kDeepseekV3);
  EXPECT_EQ((*m)->config().model_type, "kimi_k2");
  EXPECT_EQ((*m)->family().type, ModelType::kDeepseekV3);
  const Status s = LoadEdited("kimi_k2", "", [](nlohmann::json& c) {
    c["architectures"] = {"KimiForCausalLM"};
  });
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'architectures'"), std::string::npos) << s.ToString();
}

// DeepSeek's moe_layer_freq: a layer at or past first_k_dense_replace is MoE when its index is a
// multiple of it.
TEST(DeepseekV3, MoeLayerFreqPicksTheMoeLayers) {
  auto c = ParseModelConfig(R"({"model_type": "deepseek_v3", "hidden_size": 64,
      "num_hidden_layers": 6, "num_attention_heads": 4, "vocab_size": 100,
      "n_routed_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
      "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "moe_layer_freq": 2})",
                            "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (int l = 0; l < 6; ++l) EXPECT_EQ(c->IsMoeLayer(l), l >= 1 && l % 2 == 0) << l;
  // The released checkpoints' defaults: q_lora 1536, kv_lora 512, 128 + 64 qk, v 128.
  EXPECT_EQ(c->mla.q_lora_rank, 1536);
  EXPECT_EQ(c->mla.latent_dim(), 576);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{1});
}

// float8_e4m3fn decoding: normals (bias 7), subnormals (2^-9 steps), the sign, 448 the largest.
TEST(DeepseekV3, F8E4M3DecodesExactly) {
  EXPECT_EQ(F8E4M3ToF32(0x38), 1.0f);
  EXPECT_EQ(F8E4M3ToF32(0xb8), -1.0f);
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(F8E4M3ToF32(0x3c), 1.5f);
  EXPECT_EQ(F8E4M3ToF32(0x08), 0.015625f);     // 2^-6, the smallest normal
  EXPECT_EQ(F8E4M3ToF32(0x01), 0.001953125f);  // 2^-9, the smallest subnormal
  EXPECT_EQ(F8E4M3ToF32(0x07), 7 * 0.001953125f);
  EXPECT_EQ(F8E4M3ToF32(0x00), 0.0f);
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0x7f)));
}

// The FP8 checkpoint's weights are its values times their 128x128 block's weight_scale_inv
// (hidden 192, FFN 160: partial edge blocks), rounded to bf16.
TEST(DeepseekV3, Fp8WeightsAreDequantizedPerBlock) {
  const std::string dir = testing::FixtureModelDir("deepseek_v3_fp8");
  auto m = Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->config().fp8_block_rows, 128);
  auto ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  const std::string name = "model.layers.0.mlp.gate_proj.weight";  // [160, 192]
  auto v = (*ck)->Get(name);
  auto s = (*ck)->Get(name + "_scale_inv");
  ASSERT_TRUE(v.ok() && s.ok());
  ASSERT_EQ(v->dtype, DType::kF8E4M3);
  ASSERT_EQ(s->shape, (std::vector<int64_t>{2, 2}));
  const Bf16Matrix& g = (*m)->layers()[0].mlp.gate;
  const float* scale = reinterpret_cast<const float*>(s->data);
  for (int64_t i : {0, 127, 128, 159}) {
    for (int64_t j : {0, 127, 128, 191}) {
      const float want = F8E4M3ToF32(v->data[i * 192 + j]) * scale[(i / 128) * 2 + j / 128];
      EXPECT_EQ(g.data[i * 192 + j], F32ToBf16(want)) << i << "," << j;
    }
  }
}

// The broker's and pw-quantize's reader of routed experts (CheckpointExperts) dequantizes an FP8
// checkpoint's experts as the engine does: the same bf16 bytes.
TEST(DeepseekV3, Fp8ExpertsReadByTheStoreReaderEqualTheEngines) {
  const std::string dir = testing::FixtureModelDir("deepseek_v3_fp8");
  auto m = Model::Load(dir);
  auto ce = CheckpointExperts::Open(dir);
  ASSERT_TRUE(m.ok() && ce.ok());
  for (int64_t e : {0, 15}) {
    auto x = (*ce)->Get(2, e);
    ASSERT_TRUE(x.ok()) << x.status().ToString();
    ASSERT_NE(x->converted[0], nullptr);  // dequantized, not the file's bytes
    const MlpWeights& w = (*m)->layers()[2].experts[static_cast<size_t>(e)];
    EXPECT_EQ(std::memcmp(x->gate, w.gate.data, 32 * 192 * 2), 0) << e;
    EXPECT_EQ(std::memcmp(x->up, w.up.data, 32 * 192 * 2), 0) << e;
    EXPECT_EQ(std::memcmp(x->down, w.down.data, 192 * 32 * 2), 0) << e;
  }
}

// With int8 dense weights (the MLA projections q_a, q_b, kv_a, o among them; kv_b stays bf16)
// the logits stay close to HF's, and the int8 path ran (the logits move). These random-weight
// fixtures amplify rounding: measured here (bf16 activations, this binary's default) 0.068 and
// 0.114 relative L2 with int8 values within 127, against 0.015 and 0.075 with bf16 activations
// alone and 0.050 for glm4_moe's fixture with int8; within 63 (AVX2's DenseQ8Max) 0.079 and
// 0.110, the argmax kept at 41 of 46 positions on both; so the bound is 0.15 and the same
// argmax at >= 85 % of positions (a broken int8 MLA product gives errors of order 1).
TEST(DeepseekV3, Int8DenseWeightsStayCloseToReference) {
  for (const char* type : {"deepseek_v3", "deepseek_v3_direct"}) {
    SCOPED_TRACE(type);
    const std::string dir = testing::FixtureModelDir(type);
    auto e = Engine::Create(dir, {.dense = DenseFormat::kInt8});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ASSERT_NE((*e)->model().layers()[1].mla.kv_a.q8, nullptr);
    EXPECT_EQ((*e)->model().layers()[1].mla.kv_b.q8, nullptr);
    const size_t V = static_cast<size_t>((*e)->vocab_size());
    auto refs = testing::ReadRefLogits(dir + "/logits.safetensors", static_cast<int64_t>(V));
    ASSERT_FALSE(refs.empty());
    double err = 0, norm = 0;
    int same = 0, positions = 0;
    for (const auto& r : refs) {
      auto got = (*e)->ForwardLogits(r.ids);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      for (size_t t = 0; t < r.ids.size(); ++t, ++positions) {
        const float* g = got->data() + t * V;
        const float* w = r.logits.data() + t * V;
        for (size_t i = 0; i < V; ++i) {
          err += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
          norm += double(w[i]) * w[i];
        }
        same += std::max_element(g, g + V) - g == std::max_element(w, w + V) - w;
      }
    }
    const double rel = std::sqrt(err / norm);
    std::printf("%s int8 dense: relative L2 error %.4f, argmax agrees at %d of %d positions\n",
                type, rel, same, positions);
    EXPECT_GT(rel, 1e-5) << "the int8 path did not run";
    EXPECT_LT(rel, 0.15);
    EXPECT_GE(same, 0.85 * positions);
  }
}

// bf16 latent KV pages (the pool's dtype): the cached latents and RoPE keys are rounded to bf16,
// so the logits move a little from the fp32 pages' and no further. Measured: 0.27 % relative L2
// with exact activations, 1.5 % with this binary's bf16 activations (whose rounding the random
// fixture amplifies); the bound is 5 % (a misread page gives errors of order 1).
TEST(DeepseekV3, Bf16LatentKvStaysCloseToFp32) {
  const std::string dir = testing::FixtureModelDir("deepseek_v3");
  auto f32 = Engine::Create(dir, {.block_size = 4});
  auto b16 = Engine::Create(dir, {.block_size = 4, .kv_dtype = memory::KvDtype::kBf16});
  ASSERT_TRUE(f32.ok() && b16.ok());
  const size_t V = static_cast<size_t>((*f32)->vocab_size());
  auto refs = testing::ReadRefLogits(dir + "/logits.safetensors", static_cast<int64_t>(V));
  ASSERT_FALSE(refs.empty());
  double err = 0, norm = 0;
  int same = 0, positions = 0;
  for (const auto& r : refs) {
    auto a = (*f32)->ForwardLogits(r.ids);
    auto b = (*b16)->ForwardLogits(r.ids);
    ASSERT_TRUE(a.ok() && b.ok());
    for (size_t t = 0; t < r.ids.size(); ++t, ++positions) {
      const float* x = a->data() + t * V;
      const float* y = b->data() + t * V;
      for (size_t i = 0; i < V; ++i) {
        err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
        norm += double(x[i]) * x[i];
      }
      same += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
    }
  }
  const double rel = std::sqrt(err / norm);
  std::printf("bf16 latent KV: relative L2 %.5f from fp32 pages, argmax agrees at %d of %d\n", rel,
              same, positions);
  EXPECT_GT(rel, 0.0) << "the bf16 pages were not used";
  EXPECT_LT(rel, 0.05);
  EXPECT_GE(same, 0.95 * positions);
}

// Bad input is refused at load, naming the field or tensor.
TEST(DeepseekV3, BadInputNamesTheFieldOrTensor) {
  struct Case {
    const char* fixture;
    const char* drop;
    std::function<void(nlohmann::json&)> edit;
    StatusCode code;
    const char* named;
  };
  const Case cases[] = {
      {"deepseek_v3", "", [](nlohmann::json& c) { c["qk_head_dim"] = 32; },
       StatusCode::kInvalidArgument, "'qk_head_dim' is 32, but qk_nope_head_dim + qk_rope_head_dim"},
      {"deepseek_v3", "", [](nlohmann::json& c) { c["head_dim"] = 16; },
       StatusCode::kInvalidArgument, "'head_dim' is 16, but qk_rope_head_dim is 8"},
      {"deepseek_v3", "", [](nlohmann::json& c) { c["qk_rope_head_dim"] = 7; },
       StatusCode::kInvalidArgument, "'qk_rope_head_dim'"},
      {"deepseek_v3", "", [](nlohmann::json& c) { c["q_lora_rank"] = 0; },
       StatusCode::kInvalidArgument, "'q_lora_rank'"},
      // A kv_lora_rank the tensors do not have: the first tensor it shapes is named.
      {"deepseek_v3", "", [](nlohmann::json& c) { c["kv_lora_rank"] = 16; },
       StatusCode::kInvalidArgument, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"},
      {"deepseek_v3", "", [](nlohmann::json& c) { c["n_group"] = 3; },
       StatusCode::kInvalidArgument, "'n_group' is 3, which does not divide n_routed_experts 16"},
      // DeepSeek-V2's gate named in a deepseek_v3 config: refused, not run as V3's.
      {"deepseek_v3", "", [](nlohmann::json& c) { c["scoring_func"] = "softmax"; },
       StatusCode::kUnsupported, "'scoring_func' is \"softmax\"; deepseek_v3 is served with sigmoid only"},
      {"deepseek_v3", "", [](nlohmann::json& c) { c["topk_method"] = "group_limited_greedy"; },
       StatusCode::kUnsupported, "'topk_method' is \"group_limited_greedy\"; deepseek_v3 is served with noaux_tc only"},
      {"deepseek_v3_fp8", "model.layers.1.self_attn.o_proj.weight_scale_inv",
       [](nlohmann::json&) {}, StatusCode::kInvalidArgument,
       "its scale tensor 'model.layers.1.self_attn.o_proj.weight_scale_inv' is missing"},
      {"deepseek_v3_fp8", "", [](nlohmann::json& c) { c.erase("quantization_config"); },
       StatusCode::kInvalidArgument, "declares no FP8 weight_block_size"},
      {"deepseek_v3_fp8", "",
       [](nlohmann::json& c) { c["quantization_config"]["quant_method"] = "awq"; },
       StatusCode::kUnsupported, "'quantization_config.quant_method'"},
      {"deepseek_v3_fp8", "",
       [](nlohmann::json& c) { c["quantization_config"]["weight_block_size"] = {128}; },
       StatusCode::kInvalidArgument, "'quantization_config.weight_block_size'"},
  };
  for (const Case& k : cases) {
    const Status s = LoadEdited(k.fixture, k.drop, k.edit);
    EXPECT_EQ(s.code(), k.code) << k.named << ": " << s.ToString();
    EXPECT_NE(s.message().find(k.named), std::string::npos) << s.ToString();
  }
}

// make_synthetic_moe --type deepseek_v3 (common/formats/synthetic_moe.h): DeepseekV3QuarterSpec
// keeps the real MLA head dimensions (a latent row of 576 values), its grouping and YaRN; a
// small spec of the same layout loads and runs in the engine with latent KV pages, with and
// without q_lora.
TEST(DeepseekV3, SyntheticCheckpointRunsInTheEngine) {
  const SyntheticMoeSpec quarter = DeepseekV3QuarterSpec();
  const double gb = static_cast<double>(SyntheticMoeBytes(quarter)) / 1e9;
  EXPECT_GT(gb, 1.3);
  EXPECT_LT(gb, 1.5);
  auto qc = ParseModelConfig(SyntheticMoeConfigJson(quarter), "config.json");
  ASSERT_TRUE(qc.ok()) << qc.status().ToString();
  EXPECT_EQ(qc->mla.latent_dim(), 576);
  EXPECT_EQ(qc->n_group, 8);
  EXPECT_EQ(qc->topk_group, 4);
  EXPECT_EQ(qc->rope_scaling.type, RopeType::kYarn);
  EXPECT_FALSE(qc->IsMoeLayer(0));
  EXPECT_TRUE(qc->IsMoeLayer(1));

  for (int64_t q_lora : {0, 24}) {
    SCOPED_TRACE(q_lora);
    pw::testing::TempDir tmp;
    SyntheticMoeSpec spec;
    spec.type = ModelType::kDeepseekV3;
    spec.layers = 3;
    spec.hidden = 64;
    spec.heads = 4;
    spec.kv_heads = 4;
    spec.q_lora_rank = q_lora;
    spec.kv_lora_rank = 32;
    spec.qk_nope_head_dim = 16;
    spec.qk_rope_head_dim = 8;
    spec.v_head_dim = 12;
    spec.experts = 16;
    spec.top_k = 4;
    spec.n_group = 4;
    spec.topk_group = 2;
    spec.expert_ffn = 16;
    spec.shared_ffn = 16;
    spec.dense_layers = 1;
    spec.dense_ffn = 48;
    spec.vocab = 256;
    spec.max_positions = 64;
    ASSERT_TRUE(WriteSyntheticMoe(spec, tmp.path()).ok());
    auto e = Engine::Create(tmp.path(), {.block_size = 4});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const ModelConfig& c = (*e)->model().config();
    EXPECT_EQ(c.mla.q_lora_rank, q_lora);
    EXPECT_EQ((*e)->kv_pool().specs()[2].kind, memory::KvKind::kLatent);
    const std::vector<int32_t> ids = {5, 9, 200, 17, 3, 42, 77};
    auto logits = (*e)->ForwardLogits(ids);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
  }
  // An MLA the model could not have is refused.
  SyntheticMoeSpec bad = quarter;
  bad.qk_rope_head_dim = 63;
  pw::testing::TempDir tmp;
  EXPECT_EQ(WriteSyntheticMoe(bad, tmp.path()).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pw::engine
