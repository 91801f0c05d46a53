// Model families as data (engine/models/family.h): every ModelType has one registered family,
// found by type and by config.json's model_type string; a loaded fixture of each type carries
// its family and the family's gate and activation on every MoE layer.
#include "engine/models/family.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/formats/safetensors.h"
#include "common/formats/synthetic_moe.h"
#include "engine/engine.h"
#include "engine/models/model.h"
#include "tests/common/test_util.h"
#include "tests/engine/test_util.h"

namespace pw::engine {
namespace {

using testing::WriteFixtureCopy;

constexpr ModelType kTypes[] = {ModelType::kQwen2Moe, ModelType::kQwen3Moe, ModelType::kOlmoe,
                                ModelType::kMixtral,  ModelType::kGlm4Moe,  ModelType::kQwen3Next,
                                ModelType::kQwen35Moe};

// The fixture directory of a type: its name, but Qwen3.5-MoE's checkpoint is the wrapper's.
std::string FixtureOf(ModelType t) {
  return testing::FixtureModelDir(t == ModelType::kQwen35Moe ? "qwen3_5_moe" : ModelTypeName(t));
}

TEST(ModelFamily, EveryTypeIsRegisteredUnderItsName) {
  for (ModelType t : kTypes) {
    const ModelFamily* f = FindFamily(t);
    ASSERT_NE(f, nullptr) << ModelTypeName(t);
    EXPECT_EQ(f->type, t);
    EXPECT_STREQ(f->model_type, ModelTypeName(t));
    EXPECT_EQ(FindFamily(std::string(ModelTypeName(t))), f);
    EXPECT_EQ(f->gate, t == ModelType::kGlm4Moe ? GateKind::kSigmoidGroupedTopK
                                                : GateKind::kSoftmaxTopK);
    EXPECT_EQ(f->router_bias != nullptr, t == ModelType::kGlm4Moe);
    EXPECT_EQ(f->activation, ExpertActivation::kSwiGlu);
  }
  EXPECT_EQ(FindFamily("llama"), nullptr);
  EXPECT_EQ(FindFamily(""), nullptr);
  EXPECT_EQ(FindFamily("mixtral "), nullptr);
  // qwen2_moe has a gated shared expert, glm4_moe ungated shared experts.
  EXPECT_STREQ(FindFamily(ModelType::kQwen2Moe)->shared_expert, "shared_expert.");
  EXPECT_STREQ(FindFamily(ModelType::kGlm4Moe)->shared_expert, "shared_experts.");
  EXPECT_EQ(FindFamily(ModelType::kGlm4Moe)->shared_expert_gate, nullptr);
  EXPECT_EQ(FindFamily(ModelType::kQwen3Moe)->shared_expert, nullptr);
  EXPECT_EQ(FindFamily(ModelType::kMixtral)->shared_expert, nullptr);
  // The hybrids: zero-centred norms and an output-gated attention.
  for (ModelType t : kTypes) {
    const ModelFamily* f = FindFamily(t);
    const bool next = t == ModelType::kQwen3Next || t == ModelType::kQwen35Moe;
    EXPECT_EQ(f->linear_attention != nullptr, next) << ModelTypeName(t);
    EXPECT_EQ(f->zero_centred_norm, next) << ModelTypeName(t);
    EXPECT_EQ(f->attention_output_gate, next) << ModelTypeName(t);
  }
  EXPECT_STREQ(FindFamily(ModelType::kQwen3Next)->shared_expert_gate, "shared_expert_gate");
  EXPECT_EQ(FindFamily(ModelType::kQwen3Next)->text_of_wrapper, nullptr);
  EXPECT_STREQ(FindFamily(ModelType::kQwen35Moe)->text_of_wrapper, "qwen3_5_moe");
}

TEST(ModelFamily, LoadedModelsCarryTheirFamilyOnEveryMoeLayer) {
  for (ModelType t : kTypes) {
    auto m = Model::Load(FixtureOf(t));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const Model& model = **m;
    EXPECT_EQ(&model.family(), FindFamily(t));
    int moe_layers = 0;
    for (const LayerWeights& w : model.layers()) {
      if (!w.is_moe) continue;
      ++moe_layers;
      EXPECT_EQ(w.gate, model.family().gate);
      EXPECT_EQ(w.activation, model.family().activation);
      EXPECT_EQ(w.has_shared_expert, model.family().shared_expert != nullptr);
      EXPECT_EQ(w.router_bias.size(),
                model.family().router_bias != nullptr ? static_cast<size_t>(w.router.rows) : 0u);
    }
    EXPECT_GT(moe_layers, 0) << ModelTypeName(t);
  }
}

// glm4_moe: the first first_k_dense_replace layers are dense MLPs of intermediate_size, the
// shared experts one MLP of n_shared_experts * moe_intermediate_size with no gate, the
// selection bias read per layer, RoPE over half of each head; the MTP layer stored after the
// last is not loaded (the checkpoint has model.layers.3.*, the config 3 layers).
TEST(ModelFamily, Glm4MoeLayersFollowTheConfig) {
  for (const char* dir : {"glm4_moe", "glm4_moe_grouped"}) {
    auto m = Model::Load(testing::FixtureModelDir(dir));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const ModelConfig& c = (*m)->config();
    ASSERT_EQ(c.first_k_dense_replace, 1) << dir;
    ASSERT_EQ((*m)->layers().size(), 3u) << dir;
    EXPECT_EQ(c.rotary_dim, c.head_dim / 2) << dir;
    EXPECT_EQ((*m)->rope_inv_freq().size(), static_cast<size_t>(c.head_dim / 4)) << dir;
    const LayerWeights& dense = (*m)->layers()[0];
    EXPECT_FALSE(dense.is_moe);
    EXPECT_EQ(dense.mlp.gate.rows, c.intermediate_size);
    for (size_t l = 1; l < 3; ++l) {
      const LayerWeights& w = (*m)->layers()[l];
      ASSERT_TRUE(w.is_moe) << dir << " layer " << l;
      EXPECT_EQ(w.gate, GateKind::kSigmoidGroupedTopK);
      ASSERT_TRUE(w.has_shared_expert);
      EXPECT_EQ(w.shared_expert.gate.rows, c.n_shared_experts * c.moe_intermediate_size);
      EXPECT_EQ(w.shared_expert_gate.data, nullptr);
      ASSERT_EQ(w.router_bias.size(), static_cast<size_t>(c.num_experts));
      bool nonzero = false;
      for (float b : w.router_bias) nonzero = nonzero || b != 0.f;
      EXPECT_TRUE(nonzero) << "the fixture's bias must move the selection";
    }
  }
}

// Copies the glm4_moe fixture into `dir` as shards: tensors whose name passes `shard1` go to
// model-00001-of-00002.safetensors, the rest to -00002-, with model.safetensors.index.json
// naming them (as the released GLM-4.5 checkpoints ship); tensors `drop` names are left out.
void WriteShardedGlm4Moe(const std::string& dir, const std::string& drop = "") {
  const std::string src = testing::FixtureModelDir("glm4_moe");
  std::filesystem::copy_file(src + "/config.json", dir + "/config.json");
  auto ck = Checkpoint::Open(src);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  SafetensorsWriter w1, w2;
  nlohmann::json map = nlohmann::json::object();
  for (const std::string& name : (*ck)->TensorNames()) {
    if (name == drop) continue;
    auto t = (*ck)->Get(name);
    ASSERT_TRUE(t.ok());
    const bool first = name.find("layers.2.") == std::string::npos;
    ASSERT_TRUE((first ? w1 : w2).Add(name, t->dtype, t->shape, t->data, t->nbytes).ok());
    map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(w1.Write(dir + "/model-00001-of-00002.safetensors").ok());
  ASSERT_TRUE(w2.Write(dir + "/model-00002-of-00002.safetensors").ok());
  pw::testing::WriteFile(dir + "/model.safetensors.index.json",
                         nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", map}}
                             .dump());
}

// A sharded glm4_moe checkpoint gives the single file's logits bit for bit; a shard the index
// names but the directory lacks is an error naming that file, at load.
TEST(ModelFamily, Glm4MoeShardedCheckpointLoadsAndAMissingShardIsNamed) {
  pw::testing::TempDir tmp;
  WriteShardedGlm4Moe(tmp.path());
  auto single = Engine::Create(testing::FixtureModelDir("glm4_moe"), {});
  auto sharded = Engine::Create(tmp.path(), {});
  ASSERT_TRUE(single.ok() && sharded.ok()) << sharded.status().ToString();
  const std::vector<int32_t> ids = {5, 900, 17, 3000, 42, 7};
  auto a = (*single)->ForwardLogits(ids);
  auto b = (*sharded)->ForwardLogits(ids);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0);

  std::filesystem::remove(tmp.File("model-00002-of-00002.safetensors"));
  auto missing = Model::Load(tmp.path());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("model-00002-of-00002.safetensors"), std::string::npos)
      << missing.status().ToString();
  EXPECT_NE(missing.status().message().find("model.safetensors.index.json"), std::string::npos);
}

// glm4_moe's config.json as transformers 5 itself writes it (Glm4MoeConfig's own to_dict:
// rope_theta and partial_rotary_factor inside rope_parameters, no top-level rope fields; the
// fixture's is in the released GLM-4.5 layout): the same model, the same logits bit for bit,
// so HF's references hold for it too.
TEST(ModelFamily, Glm4MoeConfigAsTransformers5WritesItGivesTheSameLogits) {
  pw::testing::TempDir tmp;
  WriteFixtureCopy("glm4_moe", tmp.path(), "", [](nlohmann::json& c) {
    const double theta = c["rope_theta"].get<double>(), partial = c["partial_rotary_factor"].get<double>();
    c.erase("rope_theta");
    c.erase("partial_rotary_factor");
    c.erase("rope_scaling");
    c["rope_parameters"] = {{"rope_theta", theta}, {"partial_rotary_factor", partial}, {"rope_type", "default"}};
  });
  auto released = Engine::Create(testing::FixtureModelDir("glm4_moe"), {});
  auto v5 = Engine::Create(tmp.path(), {});
  ASSERT_TRUE(released.ok() && v5.ok()) << v5.status().ToString();
  const std::vector<int32_t> ids = {5, 900, 17, 3000, 42, 7, 1, 77};
  auto a = (*released)->ForwardLogits(ids);
  auto b = (*v5)->ForwardLogits(ids);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0);
  // The rotary fraction is read from rope_parameters, not defaulted: a full rotary gives
  // other logits.
  pw::testing::TempDir full;
  WriteFixtureCopy("glm4_moe", full.path(), "", [](nlohmann::json& c) {
    const double theta = c["rope_theta"].get<double>();
    c.erase("rope_theta");
    c.erase("partial_rotary_factor");
    c.erase("rope_scaling");
    c["rope_parameters"] = {{"rope_theta", theta}, {"partial_rotary_factor", 1.0}, {"rope_type", "default"}};
  });
  auto other = Engine::Create(full.path(), {});
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  auto c = (*other)->ForwardLogits(ids);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(std::memcmp(a->data(), c->data(), a->size() * sizeof(float)), 0);
}

// The selection bias is required: without it the routing would silently differ from the
// model's, so its absence is an error naming the tensor.
TEST(ModelFamily, Glm4MoeWithoutTheSelectionBiasIsRefusedNamingIt) {
  pw::testing::TempDir tmp;
  const std::string bias = "model.layers.2.mlp.gate.e_score_correction_bias";
  WriteShardedGlm4Moe(tmp.path(), bias);
  auto m = Model::Load(tmp.path());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find(bias), std::string::npos) << m.status().ToString();
}

// qwen3_next (tests/fixtures/models/qwen3_next: full_attention_interval 2, mlp_only_layers [2]):
// layers 0 and 2 are Gated DeltaNet with no attention weights, 1 and 3 output-gated attention
// (q_proj twice as wide); the zero-centred norms are stored as w and held as 1 + w, the gated
// norm of the linear layers as is; the KV pool gives each linear layer a recurrent state of
// LinearAttentionConfig::state_bytes, in pages of every block.
TEST(ModelFamily, Qwen3NextLayersFollowTheConfig) {
  const std::string dir = testing::FixtureModelDir("qwen3_next");
  auto m = Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = (*m)->config();
  const LinearAttentionConfig& la = c.linear_attention;
  ASSERT_EQ(la.layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(c.rotary_dim, c.head_dim / 4);
  auto ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok());
  auto file_value = [&](const std::string& name) {
    auto t = (*ck)->Get(name);
    EXPECT_TRUE(t.ok()) << name;
    uint16_t h;
    std::memcpy(&h, t->data, 2);
    return Bf16ToF32(h);
  };
  for (size_t l = 0; l < 4; ++l) {
    const LayerWeights& w = (*m)->layers()[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    EXPECT_EQ(w.is_linear_attention, l % 2 == 0) << l;
    EXPECT_EQ(w.is_moe, l != 2) << l;
    EXPECT_EQ(w.input_norm[0], 1.f + file_value(p + "input_layernorm.weight")) << l;
    if (w.is_linear_attention) {
      EXPECT_EQ(w.q.data, nullptr);
      EXPECT_EQ(w.linear.in_proj_qkvz.rows,
                2 * la.num_key_heads * la.key_head_dim + 2 * la.num_value_heads * la.value_head_dim);
      EXPECT_EQ(w.linear.conv.size(), static_cast<size_t>(la.conv_dim() * la.conv_kernel));
      EXPECT_EQ(w.linear.norm[0], file_value(p + "linear_attn.norm.weight"));
    } else {
      EXPECT_EQ(w.q.rows, 2 * c.num_heads * c.head_dim);
      EXPECT_EQ(w.q_norm[0], 1.f + file_value(p + "self_attn.q_norm.weight"));
    }
    if (w.is_moe) {
      EXPECT_TRUE(w.has_shared_expert);
      EXPECT_NE(w.shared_expert_gate.data, nullptr);
    }
  }
  EXPECT_EQ((*m)->final_norm()[0], 1.f + file_value("model.norm.weight"));

  auto e = Engine::Create(dir, {.block_size = 4});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const memory::KvBlockPool& pool = (*e)->kv_pool();
  const size_t page = pool.pages().page_bytes();
  const int state_pages = static_cast<int>((la.state_bytes() + page - 1) / page);
  for (int l = 0; l < 4; ++l) {
    const memory::KvLayerSpec& spec = pool.specs()[static_cast<size_t>(l)];
    if (la.IsLinear(l)) {
      EXPECT_EQ(spec.kind, memory::KvKind::kRecurrentState);
      EXPECT_EQ(spec.state_bytes, la.state_bytes());
      EXPECT_EQ(pool.LayerPages(l), state_pages);
    } else {
      EXPECT_EQ(spec.kind, memory::KvKind::kFullAttention);
      EXPECT_EQ(pool.LayerPages(l), 1);
    }
  }
  EXPECT_EQ(pool.pages_per_block(), 2 + 2 * state_pages);
}

// Bad hybrid checkpoints are refused at load with the tensor or field named: a missing conv or
// A_log, linear head counts that disagree with the tensors, a layer_types list of the wrong
// length.
TEST(ModelFamily, Qwen3NextBadCheckpointsNameTheTensorOrField) {
  auto no_edit = [](nlohmann::json&) {};
  for (const std::string drop : {"model.layers.2.linear_attn.conv1d.weight",
                                 "model.layers.0.linear_attn.A_log"}) {
    pw::testing::TempDir tmp;
    WriteFixtureCopy("qwen3_next", tmp.path(), drop, no_edit);
    auto m = Model::Load(tmp.path());
    ASSERT_FALSE(m.ok()) << drop;
    EXPECT_EQ(m.status().code(), StatusCode::kNotFound) << m.status().ToString();
    EXPECT_NE(m.status().message().find(drop), std::string::npos) << m.status().ToString();
  }
  {
    // 4 key heads of 16 for 4 value heads: in_proj_qkvz would be [192, 64], the file has 128.
    pw::testing::TempDir tmp;
    WriteFixtureCopy("qwen3_next", tmp.path(), "",
                     [](nlohmann::json& c) { c["linear_num_key_heads"] = 4; });
    auto m = Model::Load(tmp.path());
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("model.layers.0.linear_attn.in_proj_qkvz.weight"),
              std::string::npos)
        << m.status().ToString();
  }
  {
    pw::testing::TempDir tmp;
    WriteFixtureCopy("qwen3_next", tmp.path(), "", [](nlohmann::json& c) {
      c["layer_types"] = {"linear_attention", "full_attention", "linear_attention"};
    });
    auto m = Model::Load(tmp.path());
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("'layer_types'"), std::string::npos)
        << m.status().ToString();
  }
  {
    // The value heads must be a multiple of the key heads.
    pw::testing::TempDir tmp;
    WriteFixtureCopy("qwen3_next", tmp.path(), "",
                     [](nlohmann::json& c) { c["linear_num_key_heads"] = 3; });
    auto m = Model::Load(tmp.path());
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("'linear_num_value_heads'"), std::string::npos)
        << m.status().ToString();
  }
}

// make_synthetic_moe's qwen3_next (common/formats/synthetic_moe.h) loads as the hybrid and
// runs: finite logits over a prompt, three Gated DeltaNet layers and one attention layer.
TEST(ModelFamily, SyntheticQwen3NextRunsInTheEngine) {
  pw::testing::TempDir tmp;
  SyntheticMoeSpec spec;
  spec.type = ModelType::kQwen3Next;
  spec.layers = 4;
  spec.hidden = 64;
  spec.heads = 2;
  spec.kv_heads = 1;
  spec.experts = 64;
  spec.top_k = 10;
  spec.expert_ffn = 16;
  spec.shared_ffn = 32;
  spec.linear_key_heads = 2;
  spec.linear_value_heads = 4;
  spec.linear_head_dim = 16;
  spec.vocab = 256;
  ASSERT_TRUE(WriteSyntheticMoe(spec, tmp.path()).ok());
  auto e = Engine::Create(tmp.path(), {.block_size = 4});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const std::vector<int32_t> ids = {5, 9, 200, 17, 3, 42, 77};
  auto logits = (*e)->ForwardLogits(ids);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ((*e)->model().config().linear_attention.layers,
            (std::vector<bool>{true, true, true, false}));
}

// Qwen3.5-MoE's multimodal checkpoint is served text-only: the language model under
// model.language_model. with the split linear projections; the vision tower is not loaded. A
// wrapper a family does not serve is refused naming it, and so is a qwen3_next text_config in
// Qwen3.5's wrapper; a missing split projection is named.
TEST(ModelFamily, Qwen35MoeServesItsMultimodalCheckpointTextOnly) {
  auto m = Model::Load(testing::FixtureModelDir("qwen3_5_moe"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.weights_prefix, "model.language_model.");
  for (const LayerWeights& w : (*m)->layers()) {
    EXPECT_TRUE(w.is_moe);
    if (!w.is_linear_attention) continue;
    EXPECT_TRUE(w.linear.split);
    EXPECT_EQ(w.linear.in_proj_qkv.rows, c.linear_attention.conv_dim());
    EXPECT_EQ(w.linear.in_proj_b.rows, c.linear_attention.num_value_heads);
    EXPECT_EQ(w.linear.in_proj_qkvz.data, nullptr);
  }
  {
    pw::testing::TempDir tmp;
    WriteFixtureCopy("qwen3_5_moe", tmp.path(), "",
                     [](nlohmann::json& j) { j["model_type"] = "some_vlm"; });
    auto other = Model::Load(tmp.path());
    ASSERT_FALSE(other.ok());
    EXPECT_EQ(other.status().code(), StatusCode::kUnsupported);
    EXPECT_NE(other.status().message().find("'some_vlm' wraps a qwen3_5_moe_text"),
              std::string::npos)
        << other.status().ToString();
  }
  {
    pw::testing::TempDir tmp;
    WriteFixtureCopy("qwen3_5_moe", tmp.path(), "",
                     [](nlohmann::json& j) { j["text_config"]["model_type"] = "qwen3_next"; });
    auto next = Model::Load(tmp.path());
    ASSERT_FALSE(next.ok());
    EXPECT_EQ(next.status().code(), StatusCode::kUnsupported) << next.status().ToString();
  }
  {
    pw::testing::TempDir tmp;
    const std::string drop = "model.language_model.layers.2.linear_attn.in_proj_a.weight";
    WriteFixtureCopy("qwen3_5_moe", tmp.path(), drop, [](nlohmann::json&) {});
    auto missing = Model::Load(tmp.path());
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find(drop), std::string::npos)
        << missing.status().ToString();
  }
}

}  // namespace
}  // namespace pw::engine
