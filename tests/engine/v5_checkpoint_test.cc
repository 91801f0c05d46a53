// Checkpoints as transformers 5 writes them (tests/fixtures/models_v5, tools/make_v5_fixtures.py):
// each family with 5.x's config names (num_local_experts, rope_parameters, dtype), fp16 and fp32
// weights, rope_parameters with rope_theta 1e6, and the RoPE scalings (yarn, also in the 4.x
// rope_scaling form, linear, dynamic NTK, llama3) load and give HF's logits.
//
// Tolerance: 2e-3 max abs against HF and the same argmax at every position, as engine_test's.
// For fp16 / fp32 checkpoints the reference is HF with the matrices rounded to bf16 the way the
// engine stores them (tests/fixtures/README.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/formats/checkpoint_experts.h"
#include "common/formats/model_config.h"
#include "engine/engine.h"
#include "engine/models/model.h"
#include "tests/engine/test_util.h"

namespace pw::engine {
namespace {

using testing::ReadRefLogits;

std::string V5Dir(const std::string& name) {
  return std::string(PW_SOURCE_DIR) + "/tests/fixtures/models_v5/" + name;
}

double MaxAbsDiff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

int Argmax(const float* v, size_t n) { return static_cast<int>(std::max_element(v, v + n) - v); }

class V5Checkpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(V5Checkpoint, LogitsMatchHfAtEveryPosition) {
  auto engine = Engine::Create(V5Dir(GetParam()), {});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const size_t V = static_cast<size_t>((*engine)->vocab_size());
  auto refs = ReadRefLogits(V5Dir(GetParam()) + "/logits.safetensors", V);
  ASSERT_EQ(refs.size(), 3u);
  for (size_t p = 0; p < refs.size(); ++p) {
    auto got = (*engine)->ForwardLogits(refs[p].ids);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->size(), refs[p].logits.size());
    for (size_t t = 0; t < refs[p].ids.size(); ++t) {
      const float* g = got->data() + t * V;
      const float* r = refs[p].logits.data() + t * V;
      EXPECT_LE(MaxAbsDiff(g, r, V), 2e-3) << "prompt " << p << " position " << t;
      EXPECT_EQ(Argmax(g, V), Argmax(r, V)) << "prompt " << p << " position " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V5Checkpoint,
                         ::testing::Values("qwen2_moe", "qwen3_moe", "olmoe", "mixtral",
                                           "qwen2_moe_fp16", "qwen3_moe_fp32", "olmoe_theta_1e6",
                                           "qwen3_moe_yarn", "qwen2_moe_yarn_v4",
                                           "mixtral_linear", "olmoe_dynamic",
                                           "qwen2_moe_llama3"),
                         [](const auto& info) { return info.param; });

// What the files say is what the engine reads (the logits above would also catch a wrong value;
// these name it).
TEST(V5Config, ReadsTheFieldsTransformers5Writes) {
  auto q3 = LoadModelConfig(V5Dir("qwen3_moe") + "/config.json");
  ASSERT_TRUE(q3.ok()) << q3.status().ToString();
  EXPECT_EQ(q3->num_experts, 4);  // num_local_experts in the file
  EXPECT_EQ(q3->dtype, "bfloat16");
  auto theta = LoadModelConfig(V5Dir("olmoe_theta_1e6") + "/config.json");
  ASSERT_TRUE(theta.ok()) << theta.status().ToString();
  EXPECT_DOUBLE_EQ(theta->rope_theta, 1e6);  // rope_parameters.rope_theta
  auto v4 = LoadModelConfig(V5Dir("qwen2_moe_yarn_v4") + "/config.json");
  ASSERT_TRUE(v4.ok()) << v4.status().ToString();
  EXPECT_EQ(v4->rope_scaling.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(v4->rope_scaling.factor, 4.0);
  EXPECT_DOUBLE_EQ(v4->rope_scaling.beta_fast, 16.0);
  EXPECT_NEAR(v4->rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1, 1e-12);
  EXPECT_DOUBLE_EQ(v4->rope_theta, 1e6);
  EXPECT_EQ(v4->dtype, "bfloat16");  // torch_dtype
}

// The broker and the store builder read the experts through CheckpointExperts: an fp16 / fp32
// checkpoint's experts come out as the same bf16 values the engine computes with.
TEST(V5Checkpoint, ExpertsOfFp16AndFp32CheckpointsAreTheEnginesBf16) {
  for (const std::string name : {"qwen2_moe_fp16", "qwen3_moe_fp32"}) {
    auto experts = CheckpointExperts::Open(V5Dir(name));
    ASSERT_TRUE(experts.ok()) << experts.status().ToString();
    auto model = Model::Load(V5Dir(name));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const ModelConfig& c = (*experts)->config();
    for (int64_t l = 0; l < c.num_layers; ++l) {
      for (int64_t e = 0; e < c.num_experts; ++e) {
        auto t = (*experts)->Get(l, e);
        ASSERT_TRUE(t.ok()) << t.status().ToString();
        ASSERT_NE(t->converted[0], nullptr) << name << ": the file is not bf16";
        const MlpWeights& w = (*model)->layers()[l].experts[e];
        const size_t bytes = static_cast<size_t>(t->ffn * t->hidden) * 2;
        EXPECT_EQ(std::memcmp(t->gate, w.gate.data, bytes), 0) << name << " " << l << "/" << e;
        EXPECT_EQ(std::memcmp(t->up, w.up.data, bytes), 0) << name << " " << l << "/" << e;
        EXPECT_EQ(std::memcmp(t->down, w.down.data, bytes), 0) << name << " " << l << "/" << e;
      }
    }
    auto hash = (*experts)->Hash();
    EXPECT_TRUE(hash.ok()) << hash.status().ToString();
  }
}

}  // namespace
}  // namespace pw::engine
