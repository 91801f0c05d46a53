#include "common/formats/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/mmap_file.h"
#include "tests/common/test_util.h"

namespace pw {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// The structural fields every type requires, for `type`.
json Minimal(const std::string& type) {
  json j = {{"model_type", type},       {"hidden_size", 64},  {"num_hidden_layers", 2},
            {"num_attention_heads", 4}, {"vocab_size", 1000}, {"num_experts_per_tok", 2}};
  if (type == "mixtral") {
    j["num_attention_heads"] = 8;  // its class default of 8 kv heads must divide the head count
    j["num_local_experts"] = 8;
    j["intermediate_size"] = 32;
  } else if (type == "olmoe") {
    j["num_experts"] = 8;
    j["intermediate_size"] = 32;
  } else {
    j["num_experts"] = 8;
    j["moe_intermediate_size"] = 32;
  }
  if (type == "qwen2_moe") {  // its class default of 16 kv heads must divide the head count
    j["hidden_size"] = 256;
    j["num_attention_heads"] = 16;
  }
  return j;
}

Result<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump(), "cfg.json"); }

void ExpectError(const json& j, StatusCode code, const std::string& field) {
  auto r = Parse(j);
  ASSERT_FALSE(r.ok()) << "accepted: " << j.dump();
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("cfg.json"));
  EXPECT_THAT(r.status().message(), HasSubstr("'" + field + "'"));
}

TEST(ModelConfigTest, Qwen2MoeDefaults) {
  auto r = Parse(Minimal("qwen2_moe"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.type, ModelType::kQwen2Moe);
  EXPECT_EQ(c.num_kv_heads, 16);  // class default
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.shared_expert_intermediate_size, 5632);
  EXPECT_EQ(c.intermediate_size, 5632);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
}

TEST(ModelConfigTest, Qwen2MoeKvDefaultMustDivideHeads) {
  // The class default of 16 kv heads does not divide 4 query heads: refused, naming the field.
  json j = Minimal("qwen2_moe");
  j["num_attention_heads"] = 4;
  auto r = Parse(j);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'num_key_value_heads'"));
}

TEST(ModelConfigTest, Qwen3MoePerHeadNormAndExplicitHeadDim) {
  json j = Minimal("qwen3_moe");
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 32;  // head_dim * heads != hidden is fine for qwen3_moe
  j["norm_topk_prob"] = true;
  j["mlp_only_layers"] = {1};
  j["decoder_sparse_step"] = 1;
  j["eos_token_id"] = 7;
  j["rope_theta"] = 1000000;  // an integer where a float is expected is fine
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->head_dim, 32);
  EXPECT_EQ(r->qk_norm, QkNorm::kPerHead);
  EXPECT_FALSE(r->qkv_bias);
  EXPECT_TRUE(r->norm_topk_prob);
  EXPECT_EQ(r->shared_expert_intermediate_size, 0);
  EXPECT_EQ(r->intermediate_size, 6144);
  EXPECT_TRUE(r->IsMoeLayer(0));
  EXPECT_FALSE(r->IsMoeLayer(1));
  EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{7}));
  EXPECT_DOUBLE_EQ(r->rope_theta, 1e6);

  json k = Minimal("qwen3_moe");
  auto d = Parse(k);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->num_kv_heads, 4);  // class default
  EXPECT_EQ(d->head_dim, 16);     // hidden / heads
}

TEST(ModelConfigTest, DecoderSparseStep) {
  json j = Minimal("qwen2_moe");
  j["num_key_value_heads"] = 4;
  j["num_hidden_layers"] = 4;
  j["decoder_sparse_step"] = 2;
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->IsMoeLayer(0));
  EXPECT_TRUE(r->IsMoeLayer(1));
  EXPECT_FALSE(r->IsMoeLayer(2));
  EXPECT_TRUE(r->IsMoeLayer(3));
  j["decoder_sparse_step"] = 0;
  ExpectError(j, StatusCode::kInvalidArgument, "decoder_sparse_step");
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = {0, 9};
  ExpectError(j, StatusCode::kInvalidArgument, "mlp_only_layers[1]");
}

TEST(ModelConfigTest, OlmoeDefaults) {
  json j = Minimal("olmoe");
  j["head_dim"] = 999;  // olmoe ignores head_dim
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->type, ModelType::kOlmoe);
  EXPECT_EQ(r->num_kv_heads, 4);  // = num_attention_heads
  EXPECT_EQ(r->head_dim, 16);
  EXPECT_EQ(r->qk_norm, QkNorm::kFull);
  EXPECT_FALSE(r->qkv_bias);
  EXPECT_FALSE(r->norm_topk_prob);
  EXPECT_EQ(r->moe_intermediate_size, 32);
  EXPECT_DOUBLE_EQ(r->rms_norm_eps, 1e-5);
  EXPECT_EQ(r->max_position_embeddings, 4096);
  EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{50279}));
  EXPECT_EQ(r->pad_token_id, 1);
  EXPECT_FALSE(r->bos_token_id.has_value());
  EXPECT_FALSE(r->clip_qkv.has_value());
  EXPECT_TRUE(r->IsMoeLayer(0));
  EXPECT_TRUE(r->IsMoeLayer(1));

  j["clip_qkv"] = 8.0;
  j["attention_bias"] = true;
  j["num_key_value_heads"] = nullptr;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->clip_qkv, 8.0);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->o_bias);
  EXPECT_EQ(c->num_kv_heads, 4);
}

TEST(ModelConfigTest, MixtralDefaults) {
  json j = Minimal("mixtral");
  j["num_attention_heads"] = 8;
  j["sliding_window"] = nullptr;
  j["eos_token_id"] = {2, 3};
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_experts, 8);
  EXPECT_EQ(r->num_kv_heads, 8);
  EXPECT_TRUE(r->norm_topk_prob);
  EXPECT_FALSE(r->qkv_bias);
  EXPECT_EQ(r->qk_norm, QkNorm::kNone);
  EXPECT_DOUBLE_EQ(r->rope_theta, 1e6);
  EXPECT_EQ(r->bos_token_id, 1);
  EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r->max_position_embeddings, 131072);

  j["head_dim"] = nullptr;  // null head_dim falls back to hidden / heads
  auto n = Parse(j);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->head_dim, 8);
  j["sliding_window"] = 4096;
  j["max_position_embeddings"] = 32768;
  ExpectError(j, StatusCode::kUnsupported, "sliding_window");
}

TEST(ModelConfigTest, RejectsUnknownModelType) {
  json j = Minimal("olmoe");
  j["model_type"] = "llama";
  ExpectError(j, StatusCode::kUnsupported, "model_type");
  j.erase("model_type");
  ExpectError(j, StatusCode::kInvalidArgument, "model_type");
  j["model_type"] = 3;
  ExpectError(j, StatusCode::kInvalidArgument, "model_type");
}

TEST(ModelConfigTest, RejectsMissingRequiredFields) {
  for (const std::string type : {"qwen2_moe", "qwen3_moe", "olmoe", "mixtral"}) {
    json full = Minimal(type);
    for (auto it = full.begin(); it != full.end(); ++it) {
      if (it.key() == "model_type") continue;
      json j = full;
      j.erase(it.key());
      SCOPED_TRACE(type + " without " + it.key());
      ExpectError(j, StatusCode::kInvalidArgument, it.key());
    }
  }
}

TEST(ModelConfigTest, RejectsWrongTypesAndRanges) {
  json j = Minimal("olmoe");
  j["hidden_size"] = "64";
  ExpectError(j, StatusCode::kInvalidArgument, "hidden_size");
  j = Minimal("olmoe");
  j["hidden_size"] = 64.5;
  ExpectError(j, StatusCode::kInvalidArgument, "hidden_size");
  j = Minimal("olmoe");
  j["num_hidden_layers"] = 0;
  ExpectError(j, StatusCode::kInvalidArgument, "num_hidden_layers");
  j = Minimal("olmoe");
  j["rms_norm_eps"] = "small";
  ExpectError(j, StatusCode::kInvalidArgument, "rms_norm_eps");
  j = Minimal("olmoe");
  j["rms_norm_eps"] = -1;
  ExpectError(j, StatusCode::kInvalidArgument, "rms_norm_eps");
  j = Minimal("olmoe");
  j["tie_word_embeddings"] = 1;
  ExpectError(j, StatusCode::kInvalidArgument, "tie_word_embeddings");
  j = Minimal("olmoe");
  j["num_experts_per_tok"] = 9;
  ExpectError(j, StatusCode::kInvalidArgument, "num_experts_per_tok");
  j = Minimal("olmoe");
  j["num_key_value_heads"] = 3;
  ExpectError(j, StatusCode::kInvalidArgument, "num_key_value_heads");
  j = Minimal("olmoe");
  j["eos_token_id"] = {1, "x"};
  ExpectError(j, StatusCode::kInvalidArgument, "eos_token_id[1]");
  j = Minimal("qwen3_moe");
  j["mlp_only_layers"] = 3;
  ExpectError(j, StatusCode::kInvalidArgument, "mlp_only_layers");
}

TEST(ModelConfigTest, RefusesUnsupportedFeatures) {
  json j = Minimal("qwen3_moe");
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  ExpectError(j, StatusCode::kUnsupported, "rope_scaling.rope_type");
  j["rope_scaling"] = {{"rope_type", "default"}};  // the same as null
  EXPECT_TRUE(Parse(j).ok());
  j["rope_scaling"] = nullptr;
  EXPECT_TRUE(Parse(j).ok());
  j["layer_types"] = {"full_attention", "full_attention"};  // 5.x writes this
  EXPECT_TRUE(Parse(j).ok());
  j["layer_types"] = {"full_attention", "sliding_attention"};
  ExpectError(j, StatusCode::kUnsupported, "layer_types[1]");
  j.erase("layer_types");
  j["hidden_act"] = "gelu";
  ExpectError(j, StatusCode::kUnsupported, "hidden_act");
  j["hidden_act"] = "silu";
  j["use_sliding_window"] = true;
  ExpectError(j, StatusCode::kUnsupported, "use_sliding_window");
}

TEST(ModelConfigTest, RejectsMalformedJsonAndFiles) {
  auto r = ParseModelConfig("{\"model_type\": ", "cfg.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("cfg.json: not valid JSON"));
  r = ParseModelConfig("[1]", "cfg.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("not a JSON object"));

  pw::testing::TempDir tmp;
  auto missing = LoadModelConfig(tmp.File("config.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("config.json"));

  pw::testing::WriteFile(tmp.File("config.json"), Minimal("olmoe").dump());
  auto ok = LoadModelConfig(tmp.File("config.json"));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->model_type, "olmoe");
}

// transformers 5.x names: num_local_experts for any type, rope_parameters (rope_theta inside),
// dtype; 4.x's num_experts, rope_theta + rope_scaling, torch_dtype read the same.
TEST(ModelConfigTest, ReadsTransformers5Names) {
  json j = Minimal("qwen3_moe");
  j.erase("num_experts");
  j["num_local_experts"] = 6;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  j["dtype"] = "float32";
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_experts, 6);
  EXPECT_DOUBLE_EQ(r->rope_theta, 1e6);  // not the family default 10000
  EXPECT_EQ(r->rope_scaling.type, RopeType::kDefault);
  EXPECT_EQ(r->dtype, "float32");

  json m = Minimal("mixtral");  // mixtral: num_experts read as well
  m.erase("num_local_experts");
  m["num_experts"] = 4;
  m["torch_dtype"] = "float16";
  auto rm = Parse(m);
  ASSERT_TRUE(rm.ok()) << rm.status().ToString();
  EXPECT_EQ(rm->num_experts, 4);
  EXPECT_EQ(rm->dtype, "float16");
  EXPECT_DOUBLE_EQ(rm->rope_theta, 1e6);  // mixtral's default, nothing in the file
}

TEST(ModelConfigTest, OneSettingUnderTwoNamesMustAgree) {
  json j = Minimal("qwen3_moe");
  j["num_local_experts"] = 8;  // == num_experts: fine
  EXPECT_TRUE(Parse(j).ok());
  j["num_local_experts"] = 16;
  auto r = Parse(j);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'num_experts'"));
  EXPECT_THAT(r.status().message(), HasSubstr("'num_local_experts'"));

  j = Minimal("olmoe");
  j["rope_theta"] = 10000.0;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  r = Parse(j);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'rope_theta'"));
  EXPECT_THAT(r.status().message(), HasSubstr("'rope_parameters.rope_theta'"));
  j["rope_theta"] = 500000;  // the same number
  ASSERT_TRUE(Parse(j).ok());
  EXPECT_DOUBLE_EQ(Parse(j)->rope_theta, 5e5);

  j = Minimal("olmoe");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  ExpectError(j, StatusCode::kInvalidArgument, "rope_parameters");
  j["rope_scaling"] = j["rope_parameters"];
  EXPECT_TRUE(Parse(j).ok());

  j = Minimal("olmoe");
  j["dtype"] = "bfloat16";
  j["torch_dtype"] = "float32";
  ExpectError(j, StatusCode::kInvalidArgument, "dtype");
  j["torch_dtype"] = "bfloat16";
  EXPECT_TRUE(Parse(j).ok());
  j["dtype"] = j["torch_dtype"] = "float8_e4m3fn";
  ExpectError(j, StatusCode::kUnsupported, "dtype");

  j = Minimal("olmoe");
  j["rope_scaling"] = {{"type", "yarn"}, {"rope_type", "linear"}, {"factor", 2.0}};
  ExpectError(j, StatusCode::kInvalidArgument, "rope_scaling.rope_type");
}

TEST(ModelConfigTest, RopeScalingTypes) {
  json j = Minimal("qwen3_moe");
  j["max_position_embeddings"] = 4096;
  // 5.x yarn: attention factor derived from factor when not given.
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0},
                          {"original_max_position_embeddings", 1024}};
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rope_scaling.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(r->rope_scaling.factor, 4.0);
  EXPECT_EQ(r->rope_scaling.original_max_position_embeddings, 1024);
  EXPECT_DOUBLE_EQ(r->rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1);
  EXPECT_DOUBLE_EQ(r->rope_scaling.beta_fast, 32);
  EXPECT_DOUBLE_EQ(r->rope_scaling.beta_slow, 1);
  EXPECT_EQ(r->MaxContext(), 4096);
  // Given attention_factor wins; mscale / mscale_all_dim give the ratio of their mscales.
  j["rope_parameters"]["attention_factor"] = 0.5;
  EXPECT_DOUBLE_EQ(Parse(j)->rope_scaling.attention_factor, 0.5);
  j["rope_parameters"].erase("attention_factor");
  j["rope_parameters"]["mscale"] = 1.0;
  j["rope_parameters"]["mscale_all_dim"] = 0.5;
  EXPECT_DOUBLE_EQ(Parse(j)->rope_scaling.attention_factor,
                   (0.1 * std::log(4.0) + 1) / (0.05 * std::log(4.0) + 1));
  // Without factor: max_position_embeddings / original.
  j["rope_parameters"].erase("factor");
  EXPECT_DOUBLE_EQ(Parse(j)->rope_scaling.factor, 4.0);
  // Without original: max_position_embeddings (HF's setdefault); the top level is read too.
  j["rope_parameters"]["factor"] = 2.0;
  j["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_EQ(Parse(j)->rope_scaling.original_max_position_embeddings, 4096);
  j["original_max_position_embeddings"] = 2048;
  EXPECT_EQ(Parse(j)->rope_scaling.original_max_position_embeddings, 2048);
  j["rope_parameters"]["original_max_position_embeddings"] = 1024;
  ExpectError(j, StatusCode::kInvalidArgument, "original_max_position_embeddings");
  j.erase("original_max_position_embeddings");

  // A key its type does not use is refused, not ignored.
  j["rope_parameters"]["low_freq_factor"] = 1.0;
  ExpectError(j, StatusCode::kUnsupported, "rope_parameters.low_freq_factor");

  json l = Minimal("olmoe");
  l["rope_scaling"] = {{"type", "linear"}, {"factor", 8}};  // 4.x spelling
  EXPECT_EQ(Parse(l)->rope_scaling.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(Parse(l)->rope_scaling.factor, 8.0);
  l["rope_scaling"] = {{"type", "linear"}};
  ExpectError(l, StatusCode::kInvalidArgument, "rope_scaling.factor");

  json d = Minimal("olmoe");
  d["max_position_embeddings"] = 2048;
  d["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_EQ(Parse(d)->rope_scaling.type, RopeType::kDynamic);
  EXPECT_EQ(Parse(d)->MaxContext(), 4096);

  json ll = Minimal("mixtral");
  ll["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  auto r3 = Parse(ll);
  ASSERT_TRUE(r3.ok()) << r3.status().ToString();
  EXPECT_EQ(r3->rope_scaling.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(r3->rope_scaling.high_freq_factor, 4.0);
  ll["rope_parameters"].erase("high_freq_factor");
  ExpectError(ll, StatusCode::kInvalidArgument, "rope_parameters.high_freq_factor");

  json p = Minimal("olmoe");
  p["partial_rotary_factor"] = 0.5;
  ExpectError(p, StatusCode::kUnsupported, "partial_rotary_factor");
}

// A multimodal wrapper: the language model's fields come from text_config.
TEST(ModelConfigTest, ReadsTextConfigOfAWrapper) {
  json j = {{"model_type", "some_vlm"}, {"text_config", Minimal("qwen3_moe")}};
  j["text_config"]["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->model_type, "qwen3_moe");
  EXPECT_EQ(r->wrapper_model_type, "some_vlm");
  EXPECT_DOUBLE_EQ(r->rope_theta, 1e6);
  j["text_config"].erase("hidden_size");
  ExpectError(j, StatusCode::kInvalidArgument, "text_config.hidden_size");
  json both = Minimal("olmoe");
  both["text_config"] = Minimal("olmoe");
  EXPECT_FALSE(Parse(both).ok());
}

// Configs written by HF transformers (tests/fixtures/models/<type>/config.json), when present.
TEST(ModelConfigTest, LoadsHfFixtureConfigs) {
  int found = 0;
  for (const std::string type : {"qwen2_moe", "qwen3_moe", "olmoe", "mixtral"}) {
    std::string path =
        std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/" + type + "/config.json";
    if (!std::filesystem::exists(path)) continue;
    ++found;
    auto r = LoadModelConfig(path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->model_type, type);
    EXPECT_GT(r->num_experts, 0);
    EXPECT_EQ(r->num_heads % r->num_kv_heads, 0);
  }
  std::string tiny = std::string(PW_SOURCE_DIR) + "/models/tiny-moe/config.json";
  if (std::filesystem::exists(tiny)) {
    ++found;
    auto r = LoadModelConfig(tiny);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
  }
  if (found == 0) GTEST_SKIP() << "no HF fixture configs in tests/fixtures/models yet";
}

// A GLM-4.5-Air-shaped glm4_moe config, scaled down.
json Glm4Moe() {
  return {{"model_type", "glm4_moe"}, {"hidden_size", 128},  {"num_hidden_layers", 4},
          {"num_attention_heads", 8}, {"vocab_size", 1000},  {"num_experts_per_tok", 4},
          {"n_routed_experts", 16},   {"moe_intermediate_size", 32}};
}

TEST(ModelConfigTest, Glm4MoeDefaults) {
  auto r = Parse(Glm4Moe());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.type, ModelType::kGlm4Moe);
  EXPECT_STREQ(ModelTypeName(c.type), "glm4_moe");
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_EQ(c.num_kv_heads, 8);  // class default
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rotary_dim, 8);  // partial_rotary_factor 0.5
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.shared_expert_intermediate_size, 32);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.intermediate_size, 10944);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FALSE(c.IsMoeLayer(0));
  EXPECT_TRUE(c.IsMoeLayer(1));
  EXPECT_TRUE(c.IsMoeLayer(3));
}

TEST(ModelConfigTest, Glm4MoeFieldsAsGiven) {
  json j = Glm4Moe();
  j["num_key_value_heads"] = 2;
  j["attention_bias"] = true;
  j["use_qk_norm"] = true;
  j["head_dim"] = 32;
  j["partial_rotary_factor"] = 0.25;
  j["n_group"] = 4;
  j["topk_group"] = 2;
  j["norm_topk_prob"] = false;
  j["routed_scaling_factor"] = 2.5;
  j["n_shared_experts"] = 2;
  j["first_k_dense_replace"] = 2;
  j["intermediate_size"] = 96;
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_kv_heads, 2);
  EXPECT_TRUE(r->qkv_bias);
  EXPECT_FALSE(r->o_bias);  // GLM's o_proj never has one
  EXPECT_EQ(r->qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(r->rotary_dim, 8);
  EXPECT_EQ(r->n_group, 4);
  EXPECT_EQ(r->topk_group, 2);
  EXPECT_FALSE(r->norm_topk_prob);
  EXPECT_EQ(r->routed_scaling_factor, 2.5);
  EXPECT_EQ(r->shared_expert_intermediate_size, 64);
  EXPECT_FALSE(r->IsMoeLayer(1));
  EXPECT_TRUE(r->IsMoeLayer(2));
  // transformers 5 writes partial_rotary_factor inside rope_parameters.
  json v5 = Glm4Moe();
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0},
                           {"partial_rotary_factor", 1.0}};
  auto r5 = Parse(v5);
  ASSERT_TRUE(r5.ok()) << r5.status().ToString();
  EXPECT_EQ(r5->rotary_dim, 16);
  // The other types rotate every dim.
  auto q = Parse(Minimal("qwen3_moe"));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->rotary_dim, q->head_dim);
}

TEST(ModelConfigTest, Glm4MoeBadGroupingNamesTheField) {
  json j = Glm4Moe();
  j["n_group"] = 3;  // does not divide 16
  ExpectError(j, StatusCode::kInvalidArgument, "n_group");
  j["n_group"] = 16;  // groups of one expert: no second best
  j["topk_group"] = 4;
  ExpectError(j, StatusCode::kInvalidArgument, "n_group");
  j["n_group"] = 4;
  j["topk_group"] = 5;
  ExpectError(j, StatusCode::kInvalidArgument, "topk_group");
  j["topk_group"] = 1;  // 4 experts kept, top-k 4 fits
  EXPECT_TRUE(Parse(j).ok());
  j["num_experts_per_tok"] = 5;  // more than the 4 experts of one group
  ExpectError(j, StatusCode::kInvalidArgument, "num_experts_per_tok");
  json d = Glm4Moe();
  d["first_k_dense_replace"] = 5;
  ExpectError(d, StatusCode::kInvalidArgument, "first_k_dense_replace");
  json p = Glm4Moe();
  p["partial_rotary_factor"] = 0.1;  // 1.6 dims
  ExpectError(p, StatusCode::kInvalidArgument, "partial_rotary_factor");
  json m = Glm4Moe();
  m.erase("n_routed_experts");
  ExpectError(m, StatusCode::kInvalidArgument, "n_routed_experts");
  json s = Glm4Moe();
  s["routed_scaling_factor"] = 0;
  ExpectError(s, StatusCode::kInvalidArgument, "routed_scaling_factor");
}

// A Qwen3-Next-shaped qwen3_next config, scaled down; the linear-attention fields take HF's
// defaults unless given.
json Qwen3Next() {
  return {{"model_type", "qwen3_next"}, {"hidden_size", 128}, {"num_hidden_layers", 8},
          {"num_attention_heads", 8},   {"vocab_size", 1000}, {"num_experts_per_tok", 4},
          {"num_experts", 16},          {"moe_intermediate_size", 32}, {"head_dim", 32}};
}

TEST(ModelConfigTest, Qwen3NextDefaults) {
  auto r = Parse(Qwen3Next());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.type, ModelType::kQwen3Next);
  EXPECT_STREQ(ModelTypeName(c.type), "qwen3_next");
  EXPECT_EQ(c.num_kv_heads, 2);  // class default
  EXPECT_EQ(c.rotary_dim, 8);    // partial_rotary_factor 0.25 of head_dim 32
  EXPECT_EQ(c.qk_norm, QkNorm::kPerHead);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  const LinearAttentionConfig& la = c.linear_attention;
  EXPECT_EQ(la.num_key_heads, 16);
  EXPECT_EQ(la.num_value_heads, 32);
  EXPECT_EQ(la.key_head_dim, 128);
  EXPECT_EQ(la.value_head_dim, 128);
  EXPECT_EQ(la.conv_kernel, 4);
  // full_attention_interval 4: layers 3 and 7 full attention, the rest linear.
  EXPECT_EQ(la.layers, (std::vector<bool>{true, true, true, false, true, true, true, false}));
  EXPECT_EQ(la.conv_dim(), 2 * 16 * 128 + 32 * 128);
  EXPECT_EQ(la.state_bytes(), static_cast<size_t>(la.conv_dim() * 3 + 32 * 128 * 128) * 4);
  for (int64_t l = 0; l < 8; ++l) EXPECT_TRUE(c.IsMoeLayer(l));
}

TEST(ModelConfigTest, Qwen3NextLayerKindsAsGiven) {
  json j = Qwen3Next();
  j["full_attention_interval"] = 2;
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->linear_attention.layers,
            (std::vector<bool>{true, false, true, false, true, false, true, false}));
  j["layer_types"] = {"full_attention",   "linear_attention", "linear_attention",
                      "linear_attention", "full_attention",   "linear_attention",
                      "linear_attention", "linear_attention"};
  j["mlp_only_layers"] = {1};
  r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();  // layer_types wins over the interval
  EXPECT_EQ(r->linear_attention.layers,
            (std::vector<bool>{false, true, true, true, false, true, true, true}));
  EXPECT_FALSE(r->IsMoeLayer(1));
  EXPECT_TRUE(r->IsMoeLayer(2));
}

// Bad input names the field: a layer_types list of the wrong length or with an unknown kind,
// value heads that the key heads do not divide, a zero head count.
TEST(ModelConfigTest, Qwen3NextBadLinearAttentionNamesTheField) {
  json j = Qwen3Next();
  j["layer_types"] = {"linear_attention", "full_attention"};
  ExpectError(j, StatusCode::kInvalidArgument, "layer_types");
  auto r = Parse(j);
  EXPECT_THAT(r.status().message(), HasSubstr("2 entries for num_hidden_layers 8"));
  json k = Qwen3Next();
  k["layer_types"] = json::array();
  for (int i = 0; i < 8; ++i) k["layer_types"].push_back("linear_attention");
  k["layer_types"][5] = "sliding_attention";
  ExpectError(k, StatusCode::kUnsupported, "layer_types[5]");
  json h = Qwen3Next();
  h["linear_num_key_heads"] = 3;
  h["linear_num_value_heads"] = 8;
  ExpectError(h, StatusCode::kInvalidArgument, "linear_num_value_heads");
  json z = Qwen3Next();
  z["linear_num_key_heads"] = 0;
  ExpectError(z, StatusCode::kInvalidArgument, "linear_num_key_heads");
  json p = Qwen3Next();
  p["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0},
                          {"partial_rotary_factor", 0.01}};
  ExpectError(p, StatusCode::kInvalidArgument, "partial_rotary_factor");
}

// Qwen3.5-MoE: its language model is the text_config (qwen3_5_moe_text) of a qwen3_5_moe
// checkpoint, whose tensors are under model.language_model.; the router always renormalises
// and every layer is MoE whatever the file says; M-RoPE's keys are accepted for it (text only:
// plain RoPE) and refused for qwen3_next, which does not use them.
TEST(ModelConfigTest, Qwen35MoeTextInsideItsWrapper) {
  json text = Qwen3Next();
  text["model_type"] = "qwen3_5_moe_text";
  text["norm_topk_prob"] = false;
  text["mlp_only_layers"] = {1};
  text["rope_parameters"] = {{"rope_type", "default"},
                             {"rope_theta", 1e7},
                             {"partial_rotary_factor", 0.25},
                             {"mrope_section", {11, 11, 10}},
                             {"mrope_interleaved", true}};
  json j = {{"model_type", "qwen3_5_moe"}, {"text_config", text}};
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->type, ModelType::kQwen35Moe);
  EXPECT_STREQ(ModelTypeName(r->type), "qwen3_5_moe_text");
  EXPECT_EQ(r->wrapper_model_type, "qwen3_5_moe");
  EXPECT_EQ(r->weights_prefix, "model.language_model.");
  EXPECT_TRUE(r->norm_topk_prob);
  EXPECT_TRUE(r->IsMoeLayer(1));
  EXPECT_EQ(r->rotary_dim, 8);
  EXPECT_EQ(r->linear_attention.layers.size(), 8u);
  auto bare = Parse(text);  // a text-only checkpoint of the language model
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  EXPECT_EQ(bare->weights_prefix, "model.");
  EXPECT_EQ(Parse(Qwen3Next())->weights_prefix, "model.");
  json next = Qwen3Next();
  next["rope_parameters"] = text["rope_parameters"];
  auto refused = Parse(next);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnsupported);
  EXPECT_THAT(refused.status().message(), HasSubstr("rope_parameters.mrope_"));
}

TEST(ModelConfigTest, LoadsGlm4MoeFixtureConfigs) {
  for (const std::string dir : {"glm4_moe", "glm4_moe_grouped"}) {
    auto r = LoadModelConfig(std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/" + dir +
                             "/config.json");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->type, ModelType::kGlm4Moe);
    EXPECT_EQ(r->num_nextn_predict_layers, 1);
    EXPECT_EQ(r->rotary_dim, 8);
  }
}

// The fixture of tools/make_family_fixtures.py (transformers' Gemma4TextConfig as written).
json Gemma4() {
  auto r = MmapFile::Open(std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/gemma4/config.json");
  EXPECT_TRUE(r.ok());
  return json::parse(std::string(reinterpret_cast<const char*>((*r)->data()), (*r)->size()));
}

TEST(ModelConfigTest, Gemma4FieldsAsGiven) {
  auto r = Parse(Gemma4());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->type, ModelType::kGemma4);
  EXPECT_STREQ(ModelTypeName(r->type), "gemma4_text");
  EXPECT_EQ(r->num_experts, 16);
  EXPECT_EQ(r->num_experts_per_tok, 4);
  EXPECT_EQ(r->moe_intermediate_size, 32);
  EXPECT_EQ(r->intermediate_size, 48);
  EXPECT_TRUE(r->norm_topk_prob);
  EXPECT_EQ(r->layer_sliding, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(r->sliding_window, 8);
  EXPECT_TRUE(r->sliding_rope);
  EXPECT_EQ(r->sliding_rope_theta, 10000.0);
  EXPECT_EQ(r->sliding_rope_scaling.type, RopeType::kDefault);
  EXPECT_EQ(r->rope_theta, 1e6);
  EXPECT_EQ(r->rope_scaling.type, RopeType::kProportional);
  EXPECT_EQ(r->rope_scaling.proportion, 0.25);
  EXPECT_EQ(r->rotary_dim, 16);
  EXPECT_TRUE(r->k_eq_v && r->v_norm && r->scale_embeddings && r->tie_word_embeddings);
  EXPECT_EQ(r->attention_scale, 1.0);
  EXPECT_EQ(r->final_logit_softcapping, 30.0);
  EXPECT_EQ(r->qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(r->weights_prefix, "model.");
  // The multimodal checkpoint: its language model under model.language_model.
  json wrapped = {{"model_type", "gemma4"}, {"text_config", Gemma4()}};
  auto w = Parse(wrapped);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->wrapper_model_type, "gemma4");
  EXPECT_EQ(w->weights_prefix, "model.language_model.");
}

// HF's defaults where the file is silent: every 6th layer full (and the last), window 512,
// RoPE per layer type; without per_layer_config, the full layers' head size is global_head_dim
// (default 512) and their kv heads num_key_value_heads unless num_global_key_value_heads says.
TEST(ModelConfigTest, Gemma4Defaults) {
  json j = Gemma4();
  for (const char* k : {"layer_types", "sliding_window", "rope_parameters", "per_layer_config"}) {
    j.erase(k);
  }
  j["num_hidden_layers"] = 7;
  j["global_head_dim"] = 16;
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->layer_sliding,
            (std::vector<bool>{true, true, true, true, true, false, false}));
  EXPECT_EQ(r->sliding_window, 512);
  EXPECT_EQ(r->sliding_rope_theta, 10000.0);
  EXPECT_EQ(r->rope_theta, 1e6);
  EXPECT_EQ(r->rope_scaling.type, RopeType::kProportional);
  EXPECT_EQ(r->rope_scaling.proportion, 0.25);
  EXPECT_EQ(r->LayerHeadDim(5), 16);
  j.erase("global_head_dim");
  r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->full_head_dim, 512);
  EXPECT_EQ(r->full_num_kv_heads, 2);
  EXPECT_EQ(r->LayerHeadDim(4), 16);
  EXPECT_EQ(r->LayerHeadDim(5), 512);
  EXPECT_EQ(r->LayerHeadDim(6), 512);
  EXPECT_EQ(r->LayerKvHeads(6), 2);
  EXPECT_EQ(r->MaxHeadDim(), 512);
  EXPECT_EQ(r->MaxKvWidth(), 2 * 512);
}

// Gemma-4-26B-A4B's full layers have their own shape (global_head_dim 512 against 256, 2 kv heads
// against 8); the fixture gemma4_global has 1 x 32 against 4 x 16, in the released layout.
// transformers 5 writes the same as per_layer_config; both read alike.
TEST(ModelConfigTest, Gemma4FullLayersOfTheirOwnShape) {
  auto fixture = MmapFile::Open(std::string(PW_SOURCE_DIR) +
                                "/tests/fixtures/models/gemma4_global/config.json");
  ASSERT_TRUE(fixture.ok());
  const json released = json::parse(
      std::string(reinterpret_cast<const char*>((*fixture)->data()), (*fixture)->size()));
  auto expect_shape = [](const json& j, int64_t full_kv) {
    auto r = Parse(j);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->head_dim, 16);
    EXPECT_EQ(r->num_kv_heads, 4);
    EXPECT_EQ(r->full_head_dim, 32);
    EXPECT_EQ(r->full_num_kv_heads, full_kv);
    for (int64_t l : {0, 2}) {
      EXPECT_EQ(r->LayerHeadDim(l), 16);
      EXPECT_EQ(r->LayerKvHeads(l), 4);
    }
    for (int64_t l : {1, 3}) {
      EXPECT_EQ(r->LayerHeadDim(l), 32);
      EXPECT_EQ(r->LayerKvHeads(l), full_kv);
    }
    EXPECT_EQ(r->rotary_dim, 16);
    EXPECT_EQ(r->MaxHeadDim(), 32);
    EXPECT_EQ(r->MaxKvWidth(), std::max<int64_t>(4 * 16, full_kv * 32));
  };
  expect_shape(released, 1);
  auto r = Parse(released);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->Summary().find("4/4 heads x 16 (full layers 4/1 x 32)"), std::string::npos)
      << r->Summary();
  // As transformers 5 writes it: per_layer_config, keys zero-padded or not.
  for (const char* one : {"1", "01"}) {
    json j = released;
    j.erase("global_head_dim");
    j.erase("num_global_key_value_heads");
    j["per_layer_config"] = {{one, {{"head_dim", 32}, {"num_key_value_heads", 1}}},
                             {"3", {{"head_dim", 32}, {"num_key_value_heads", 1}}}};
    expect_shape(j, 1);
  }
  // Without attention_k_eq_v HF takes no kv-head override from num_global_key_value_heads.
  json j = released;
  j["attention_k_eq_v"] = false;
  expect_shape(j, 4);
  // Inside the multimodal wrapper.
  expect_shape(json{{"model_type", "gemma4"}, {"text_config", released}}, 1);
}

// Gemma-4-26B-A4B's text_config with the fields its released multimodal checkpoint gives (as
// public copies of it show; the checkpoint itself is not here): every one is read, none refused.
TEST(ModelConfigTest, Gemma4ReleasedMoeConfigLoads) {
  json layer_types = json::array();
  for (int l = 0; l < 30; ++l)
    layer_types.push_back(l % 6 == 5 ? "full_attention" : "sliding_attention");
  const json text = {{"model_type", "gemma4_text"},
                     {"attention_bias", false},
                     {"attention_dropout", 0.0},
                     {"attention_k_eq_v", true},
                     {"dtype", "bfloat16"},
                     {"enable_moe_block", true},
                     {"final_logit_softcapping", 30.0},
                     {"global_head_dim", 512},
                     {"head_dim", 256},
                     {"hidden_activation", "gelu_pytorch_tanh"},
                     {"hidden_size", 2816},
                     {"hidden_size_per_layer_input", 0},
                     {"intermediate_size", 2112},
                     {"layer_types", layer_types},
                     {"max_position_embeddings", 262144},
                     {"moe_intermediate_size", 704},
                     {"num_attention_heads", 16},
                     {"num_experts", 128},
                     {"num_global_key_value_heads", 2},
                     {"num_hidden_layers", 30},
                     {"num_key_value_heads", 8},
                     {"num_kv_shared_layers", 0},
                     {"pad_token_id", 0},
                     {"rms_norm_eps", 1e-6},
                     {"rope_parameters",
                      {{"full_attention",
                        {{"partial_rotary_factor", 0.25},
                         {"rope_theta", 1000000.0},
                         {"rope_type", "proportional"}}},
                       {"sliding_attention", {{"rope_theta", 10000.0}, {"rope_type", "default"}}}}},
                     {"sliding_window", 1024},
                     {"tie_word_embeddings", true},
                     {"top_k_experts", 8},
                     {"use_bidirectional_attention", "vision"},
                     {"use_cache", true},
                     {"use_double_wide_mlp", false},
                     {"vocab_size", 262144},
                     {"vocab_size_per_layer_input", 262144}};
  const json wrapped = {{"model_type", "gemma4"},
                        {"architectures", {"Gemma4ForConditionalGeneration"}},
                        {"text_config", text},
                        {"audio_config", nullptr},
                        {"vision_config", {{"model_type", "gemma4_vision"}, {"hidden_size", 1152}}},
                        {"eos_token_id", {1, 106}}};
  auto r = Parse(wrapped);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->wrapper_model_type, "gemma4");
  EXPECT_EQ(r->num_experts, 128);
  EXPECT_EQ(r->num_experts_per_tok, 8);
  EXPECT_EQ(r->sliding_window, 1024);
  EXPECT_EQ(r->LayerHeadDim(0), 256);
  EXPECT_EQ(r->LayerKvHeads(0), 8);
  EXPECT_EQ(r->LayerHeadDim(5), 512);
  EXPECT_EQ(r->LayerKvHeads(5), 2);
  EXPECT_EQ(r->LayerHeadDim(29), 512);
  EXPECT_TRUE(r->k_eq_v);
  EXPECT_EQ(r->MaxKvWidth(), 8 * 256);
}

// Bad input and the variants not served are refused at load, naming the field.
TEST(ModelConfigTest, Gemma4BadInputNamesTheField) {
  json j = Gemma4();
  j["layer_types"].push_back("full_attention");
  ExpectError(j, StatusCode::kInvalidArgument, "layer_types");
  j = Gemma4();
  j["layer_types"][3] = "sliding_attention";
  ExpectError(j, StatusCode::kInvalidArgument, "layer_types[3]");
  j = Gemma4();
  j["layer_types"][0] = "linear_attention";
  ExpectError(j, StatusCode::kInvalidArgument, "layer_types[0]");
  j = Gemma4();
  j["hidden_size_per_layer_input"] = 256;
  ExpectError(j, StatusCode::kUnsupported, "hidden_size_per_layer_input");
  j.erase("hidden_size_per_layer_input");  // HF's default is 256: per-layer inputs on
  ExpectError(j, StatusCode::kUnsupported, "hidden_size_per_layer_input");
  j = Gemma4();
  j["num_kv_shared_layers"] = 2;
  ExpectError(j, StatusCode::kUnsupported, "num_kv_shared_layers");
  j = Gemma4();
  j["enable_moe_block"] = false;
  ExpectError(j, StatusCode::kUnsupported, "enable_moe_block");
  j = Gemma4();
  j["use_bidirectional_attention"] = "all";
  ExpectError(j, StatusCode::kUnsupported, "use_bidirectional_attention");
  j["use_bidirectional_attention"] = "vision";  // causal on text
  EXPECT_TRUE(Parse(j).ok());
  j = Gemma4();
  j["attention_bias"] = true;
  ExpectError(j, StatusCode::kUnsupported, "attention_bias");
  j = Gemma4();
  j["hidden_activation"] = "silu";
  ExpectError(j, StatusCode::kUnsupported, "hidden_activation");
  // Full layers of their own shape: one shape for every full layer, none for a sliding one,
  // no other field, an even head size, kv heads dividing the query heads.
  j = Gemma4();
  j["per_layer_config"] = {{"1", {{"head_dim", 32}, {"num_key_value_heads", 1}}}};
  ExpectError(j, StatusCode::kInvalidArgument, "per_layer_config");
  j = Gemma4();
  j["per_layer_config"] = {{"0", {{"head_dim", 32}}}};
  ExpectError(j, StatusCode::kUnsupported, "per_layer_config.0.head_dim");
  j = Gemma4();
  j["per_layer_config"] = {{"1", {{"sliding_window", 4}}}, {"3", {{"sliding_window", 4}}}};
  ExpectError(j, StatusCode::kUnsupported, "per_layer_config.1.sliding_window");
  for (const char* key : {"x", "4", "-1"}) {
    j = Gemma4();
    j["per_layer_config"] = {{key, json::object()}};
    ExpectError(j, StatusCode::kInvalidArgument, std::string("per_layer_config.") + key);
  }
  j = Gemma4();
  j["per_layer_config"] = {{"1", {{"head_dim", 32}}}, {"3", {{"head_dim", 32}}}};
  j["global_head_dim"] = 64;  // says otherwise than per_layer_config
  ExpectError(j, StatusCode::kInvalidArgument, "global_head_dim");
  j = Gemma4();
  j.erase("per_layer_config");
  j["global_head_dim"] = 33;
  ExpectError(j, StatusCode::kInvalidArgument, "global_head_dim");
  j["global_head_dim"] = 32;
  j["num_global_key_value_heads"] = 3;
  ExpectError(j, StatusCode::kInvalidArgument, "num_global_key_value_heads");
  j = Gemma4();
  j["rope_parameters"]["full_attention"]["rope_type"] = "yarn";
  ExpectError(j, StatusCode::kUnsupported, "rope_parameters.full_attention.rope_type");
  j = Gemma4();
  j["rope_parameters"]["sliding_attention"]["partial_rotary_factor"] = 0.5;
  ExpectError(j, StatusCode::kUnsupported,
              "rope_parameters.sliding_attention.partial_rotary_factor");
  j = Gemma4();
  j.erase("top_k_experts");
  ExpectError(j, StatusCode::kInvalidArgument, "top_k_experts");
  // Inside the multimodal wrapper the field is named under text_config.
  json wrapped = {{"model_type", "gemma4"}, {"text_config", Gemma4()}};
  wrapped["text_config"]["num_kv_shared_layers"] = 1;
  ExpectError(wrapped, StatusCode::kUnsupported, "text_config.num_kv_shared_layers");
}

}  // namespace
}  // namespace pw
