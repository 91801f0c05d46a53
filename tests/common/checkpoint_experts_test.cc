// The routed experts' tensor names, one table for every family (checkpoint_experts.h), which
// the engine's loader and the broker both read: hand-written names per type.
#include "common/formats/checkpoint_experts.h"

#include <gtest/gtest.h>

namespace pw {
namespace {

TEST(CheckpointExperts, MixtralNamesItsBlockAndExpertsItsOwnWay) {
  ModelConfig c;
  c.type = ModelType::kMixtral;
  EXPECT_STREQ(ExpertNamingOf(c.type).moe_block, "block_sparse_moe");
  EXPECT_EQ(MoeBlockPrefix(c, 3), "model.layers.3.block_sparse_moe.");
  EXPECT_EQ(ExpertTensorName(c, 3, 5, ExpertMatrix::kGate),
            "model.layers.3.block_sparse_moe.experts.5.w1.weight");
  EXPECT_EQ(ExpertTensorName(c, 3, 5, ExpertMatrix::kUp),
            "model.layers.3.block_sparse_moe.experts.5.w3.weight");
  EXPECT_EQ(ExpertTensorName(c, 0, 0, ExpertMatrix::kDown),
            "model.layers.0.block_sparse_moe.experts.0.w2.weight");
}

TEST(CheckpointExperts, QwenAndOlmoeUseTheMlpBlockAndProjNames) {
  ModelConfig c;
  for (ModelType t : {ModelType::kQwen2Moe, ModelType::kQwen3Moe, ModelType::kOlmoe}) {
    c.type = t;
    SCOPED_TRACE(ModelTypeName(t));
    EXPECT_EQ(MoeBlockPrefix(c, 1), "model.layers.1.mlp.");
    EXPECT_EQ(ExpertTensorName(c, 1, 12, ExpertMatrix::kGate),
              "model.layers.1.mlp.experts.12.gate_proj.weight");
    EXPECT_EQ(ExpertTensorName(c, 1, 12, ExpertMatrix::kUp),
              "model.layers.1.mlp.experts.12.up_proj.weight");
    EXPECT_EQ(ExpertTensorName(c, 1, 12, ExpertMatrix::kDown),
              "model.layers.1.mlp.experts.12.down_proj.weight");
  }
}

// Qwen3.5-MoE's multimodal checkpoint keeps its language model under model.language_model.
// (ModelConfig::weights_prefix): the broker's store reads its routed experts there; a wrapper
// whose language model's place is not known is still refused.
TEST(CheckpointExperts, AServedWrapperIsReadUnderItsWeightsPrefix) {
  ModelConfig c;
  c.type = ModelType::kQwen35Moe;
  c.weights_prefix = "model.language_model.";
  EXPECT_EQ(ExpertTensorName(c, 2, 7, ExpertMatrix::kUp),
            "model.language_model.layers.2.mlp.experts.7.up_proj.weight");
  const std::string dir = std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/qwen3_5_moe";
  auto ck = CheckpointExperts::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  auto e = (*ck)->Get(3, 15);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->ffn, 32);
}

}  // namespace
}  // namespace pw
