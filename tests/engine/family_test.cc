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
                                ModelType::kMixtral};

TEST(ModelFamily, EveryTypeIsRegisteredUnderItsName) {
  for (ModelType t : kTypes) {
    const ModelFamily* f = FindFamily(t);
    ASSERT_NE(f, nullptr) << ModelTypeName(t);
    EXPECT_EQ(f->type, t);
    EXPECT_STREQ(f->model_type, ModelTypeName(t));
    EXPECT_EQ(FindFamily(std::string(ModelTypeName(t))), f);
    EXPECT_EQ(f->gate, GateKind::kSoftmaxTopK);
    EXPECT_EQ(f->activation, ExpertActivation::kSwiGlu);
  }
  EXPECT_EQ(FindFamily("llama"), nullptr);
  EXPECT_EQ(FindFamily(""), nullptr);
  EXPECT_EQ(FindFamily("mixtral "), nullptr);
  // Only qwen2_moe has a shared expert.
  EXPECT_STREQ(FindFamily(ModelType::kQwen2Moe)->shared_expert, "shared_expert.");
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
    }
    EXPECT_GT(moe_layers, 0) << ModelTypeName(t);
  }
}

}  // namespace
}  // namespace pw::engine
