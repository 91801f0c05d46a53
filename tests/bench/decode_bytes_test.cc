// bench/decode_bytes.h: the bytes of a decode step, against an enumeration of the checkpoint's
// own tensors (every tensor the step reads whole, by its name) and the model's KV specs.
#include "bench/decode_bytes.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/formats/safetensors.h"
#include "engine/models/model.h"
#include "tests/engine/test_util.h"

namespace pw::bench {
namespace {

using engine::Model;
using engine::testing::FixtureModelDir;
using engine::testing::TinyModelDir;

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Bytes of every tensor of `dir`'s checkpoint a decode step reads whole: all but the routed
// experts and the embedding matrix; matrices at 2 bytes a weight (the engine's bf16), vectors,
// norms and the conv's taps at 4 (fp32 once loaded).
double CheckpointWeightBytes(const std::string& dir) {
  auto ckpt = Checkpoint::Open(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  double bytes = 0;
  for (const std::string& name : (*ckpt)->TensorNames()) {
    if (Contains(name, ".experts.") || Contains(name, "embed_tokens")) continue;
    auto t = (*ckpt)->Get(name);
    EXPECT_TRUE(t.ok());
    const bool matrix = t->shape.size() == 2;
    bytes += static_cast<double>(t->numel()) * (matrix ? 2 : 4);
  }
  return bytes;
}

std::unique_ptr<Model> Load(const std::string& dir) {
  auto m = Model::Load(dir);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

TEST(DecodeBytes, AttentionModelCountsItsTensorsKvAndExperts) {
  const std::string dir = TinyModelDir();
  auto model = Load(dir);
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  const int batch = 3;
  const double ctx = 40, experts = 12345;
  const StepBytes s = DecodeStepBytes(*model, batch, ctx, 4, experts);
  EXPECT_DOUBLE_EQ(s.weights, CheckpointWeightBytes(dir) + batch * 2.0 * c.hidden_size);
  EXPECT_DOUBLE_EQ(s.kv, c.num_layers * batch * ctx * 2.0 * c.num_kv_heads * c.head_dim * 4);
  EXPECT_EQ(s.state, 0);
  EXPECT_DOUBLE_EQ(s.experts, c.num_layers * experts);  // every layer of tiny-moe is MoE
  EXPECT_DOUBLE_EQ(DecodeStepBytes(*model, batch, ctx, 2, experts).kv, s.kv / 2);
}

TEST(DecodeBytes, HybridCountsItsStateTwiceAndKvOfFullLayersOnly) {
  const std::string dir = FixtureModelDir("qwen3_next");
  auto model = Load(dir);
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  const int batch = 2;
  const double ctx = 17;
  const StepBytes s = DecodeStepBytes(*model, batch, ctx, 4, 100);
  EXPECT_DOUBLE_EQ(s.weights, CheckpointWeightBytes(dir) + batch * 2.0 * c.hidden_size);
  // layer_types: linear, full, linear, full; mlp_only_layers [2].
  EXPECT_DOUBLE_EQ(s.kv, 2 * batch * ctx * 2.0 * c.num_kv_heads * c.head_dim * 4);
  const double state = static_cast<double>(c.linear_attention.state_bytes());
  EXPECT_GT(state, 0);
  EXPECT_DOUBLE_EQ(s.state, 2 * batch * 2 * state);
  EXPECT_DOUBLE_EQ(s.experts, 3 * 100.0);
  EXPECT_DOUBLE_EQ(s.total(), s.weights + s.kv + s.state + s.experts);
}

// The embedded model's step weight bytes as bf16 less those with its dense matrices in `dense`
// (the lm_head in `lm_head`); its config through *c.
double BytesSavedByDenseCopies(DenseFormat dense, DenseFormat lm_head, ModelConfig* c) {
  auto model = Load(TinyModelDir());
  EXPECT_NE(model, nullptr);
  if (model == nullptr) return 0;
  *c = model->config();
  const double bf16 = DecodeStepBytes(*model, 1, 8, 4, 0).weights;
  EXPECT_TRUE(model->QuantizeDense(dense, lm_head, 1).ok());
  return bf16 - DecodeStepBytes(*model, 1, 8, 4, 0).weights;
}

TEST(DecodeBytes, Int8CopiesCountOneByteAWeight) {
  ModelConfig c;
  const double saved = BytesSavedByDenseCopies(DenseFormat::kInt8, DenseFormat::kAsDense, &c);
  // tiny-moe's int8 matrices: q, k, v, o of every layer and lm_head (no dense or shared MLP).
  const double H = static_cast<double>(c.hidden_size);
  const double qkvo = H * c.num_heads * c.head_dim * 2 + H * c.num_kv_heads * c.head_dim * 2;
  EXPECT_DOUBLE_EQ(saved, c.num_layers * qkvo + static_cast<double>(c.vocab_size) * H);
}

// An any-precision copy counts its planes and int8 table (DenseApBytes), not 2 bytes a weight.
TEST(DecodeBytes, AnyPrecisionCopiesCountTheirPlanesAndTables) {
  ModelConfig c;
  const double saved = BytesSavedByDenseCopies(DenseFormat::kAp4, DenseFormat::kAp6, &c);
  const int H = static_cast<int>(c.hidden_size), q = static_cast<int>(c.num_heads * c.head_dim),
            kv = static_cast<int>(c.num_kv_heads * c.head_dim), V = static_cast<int>(c.vocab_size);
  const double bf16_bytes = 2.0 * H * (2 * q + 2 * kv) * c.num_layers + 2.0 * V * H;
  const double ap_bytes =
      static_cast<double>(c.num_layers) *
          static_cast<double>(anyprec::DenseApBytes(q, H, 4) + 2 * anyprec::DenseApBytes(kv, H, 4) +
                              anyprec::DenseApBytes(H, q, 4)) +
      static_cast<double>(anyprec::DenseApBytes(V, H, 6));
  EXPECT_DOUBLE_EQ(saved, bf16_bytes - ap_bytes);
}

}  // namespace
}  // namespace pw::bench
