// generation_config.json as the checkpoint's sampling defaults (router/generation_defaults.h).
#include "services/router/generation_defaults.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "services/router/openai_api.h"

namespace pw::router {
namespace {

using ::testing::HasSubstr;

Result<GenerationDefaults> Parse(const std::string& text) {
  return ParseGenerationDefaults(text, "gen.json", 1000);
}

TEST(GenerationDefaults, ReadsSamplingValuesAndEosIds) {
  // Qwen3's file, with its list of eos ids.
  auto d = Parse(R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [5, 9],
                     "pad_token_id": 3, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                     "transformers_version": "4.51.0"})");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_FLOAT_EQ(d->temperature, 0.6f);
  EXPECT_FLOAT_EQ(d->top_p, 0.95f);
  EXPECT_EQ(d->top_k, 20);
  EXPECT_EQ(d->eos_token_ids, (std::vector<int32_t>{5, 9}));
  // One id; nothing else: the OpenAI defaults.
  d = Parse(R"({"eos_token_id": 2})");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_FLOAT_EQ(d->temperature, 1.f);
  EXPECT_FLOAT_EQ(d->top_p, 1.f);
  EXPECT_EQ(d->top_k, 0);
}

TEST(GenerationDefaults, BadValuesNameTheFileAndKey) {
  for (auto [text, key] : {std::pair{R"({"temperature": "hot"})", "temperature"},
                           {R"({"temperature": -1})", "temperature"},
                           {R"({"top_p": 0})", "top_p"},
                           {R"({"top_k": -2})", "top_k"},
                           {R"({"top_k": 1.5})", "top_k"},
                           {R"({"eos_token_id": 1000})", "eos_token_id"},
                           {R"({"eos_token_id": [1, "x"]})", "eos_token_id[1]"}}) {
    auto d = Parse(text);
    ASSERT_FALSE(d.ok()) << text;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(d.status().message(), HasSubstr("gen.json: field '" + std::string(key) + "'"))
        << text;
  }
  EXPECT_FALSE(Parse("[1]").ok());
  EXPECT_FALSE(Parse("{").ok());
}

TEST(GenerationDefaults, FromTheModelDirectory) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pw_gen_defaults_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto none = LoadGenerationDefaults(dir.string(), 1000);  // no file: the defaults
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FLOAT_EQ(none->temperature, 1.f);
  EXPECT_TRUE(none->eos_token_ids.empty());
  std::ofstream(dir / "generation_config.json") << R"({"temperature": 0.7, "eos_token_id": 4})";
  auto d = LoadGenerationDefaults(dir.string(), 1000);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_FLOAT_EQ(d->temperature, 0.7f);
  EXPECT_EQ(d->eos_token_ids, (std::vector<int32_t>{4}));
  std::ofstream(dir / "generation_config.json") << R"({"top_p": 2})";
  auto bad = LoadGenerationDefaults(dir.string(), 1000);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("generation_config.json: field 'top_p'"));
  std::filesystem::remove_all(dir);
}

// The defaults reach a parsed request only where the request leaves the field out.
TEST(GenerationDefaults, RequestValuesOverrideThem) {
  ApiLimits l;
  l.model_name = "m";
  l.default_temperature = 0.6f;
  l.default_top_p = 0.9f;
  l.default_top_k = 40;
  auto r = ParseApiRequest(R"({"model":"m","prompt":"x"})", Endpoint::kCompletions, l);
  ASSERT_TRUE(std::holds_alternative<ApiRequest>(r));
  EXPECT_FLOAT_EQ(std::get<ApiRequest>(r).temperature, 0.6f);
  EXPECT_FLOAT_EQ(std::get<ApiRequest>(r).top_p, 0.9f);
  EXPECT_EQ(std::get<ApiRequest>(r).top_k, 40);
  r = ParseApiRequest(R"({"model":"m","prompt":"x","temperature":0,"top_p":1,"top_k":-1})",
                      Endpoint::kCompletions, l);
  ASSERT_TRUE(std::holds_alternative<ApiRequest>(r));
  EXPECT_FLOAT_EQ(std::get<ApiRequest>(r).temperature, 0.f);
  EXPECT_FLOAT_EQ(std::get<ApiRequest>(r).top_p, 1.f);
  EXPECT_EQ(std::get<ApiRequest>(r).top_k, 0);
}

}  // namespace
}  // namespace pw::router
