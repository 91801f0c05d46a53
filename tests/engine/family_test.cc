// Model families as data (engine/models/family.h): every ModelType has one registered family,
// found by type and by config.json's model_type string; a loaded fixture of each type carries
// its family and the family's gate and activation on every MoE layer.
#include "engine/models/family.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/models/model.h"
#include "tests/engine/test_util.h"

namespace pw::engine {
namespace {

constexpr ModelType kTypes[] = {ModelType::kQwen2Moe, ModelType::kQwen3Moe, ModelType::kOlmoe,
                                ModelType::kMixtral, ModelType::kGlm4Moe};

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
}

TEST(ModelFamily, LoadedModelsCarryTheirFamilyOnEveryMoeLayer) {
  for (ModelType t : kTypes) {
    auto m = Model::Load(testing::FixtureModelDir(ModelTypeName(t)));
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

}  // namespace
}  // namespace pw::engine
