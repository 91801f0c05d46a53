// Held-out perplexity of the trained tiny model within 0.1% of HF's (tests/fixtures/
// heldout.json, same window rule: services/engine/perplexity.h). Needs the held-out text that
// `make eval-data` writes to <build>/eval/heldout.txt. Not labelled `unit`: it runs the whole
// held-out set. Skipped only while models/tiny-moe/model.safetensors is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/tokenizer.h"
#include "services/engine/engine.h"
#include "services/engine/perplexity.h"
#include "tests/engine/test_util.h"

namespace pw::engine {
namespace {

TEST(TinyModel, HeldOutPerplexityWithinPointOnePercentOfReference) {
  const std::string model = testing::TinyModelDir();
  if (!std::filesystem::exists(model + "/model.safetensors")) {
    GTEST_SKIP() << model << "/model.safetensors is absent (not trained yet)";
  }
  std::ifstream ref_in(std::string(PW_SOURCE_DIR) + "/tests/fixtures/heldout.json");
  ASSERT_TRUE(ref_in) << "tests/fixtures/heldout.json missing";
  const nlohmann::json ref = nlohmann::json::parse(ref_in);
  const std::string text_path = std::string(PW_BINARY_DIR) + "/eval/heldout.txt";
  std::ifstream in(text_path, std::ios::binary);
  ASSERT_TRUE(in) << text_path << " missing: run `make eval-data`";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  ASSERT_EQ(text.size(), ref["bytes"].get<size_t>())
      << "held-out text differs from the reference's";
  auto tok = Tokenizer::FromModelDir(model);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto ids = (*tok)->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  ASSERT_EQ(ids->size(), ref["n_ids"].get<size_t>());
  const int ctx = ref["ctx"].get<int>();
  auto engine = Engine::Create(
      model, {.num_kv_blocks = BlocksForTokens(ctx, 16) + 1, .max_batch_tokens = ctx});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto r = Perplexity(**engine, *ids, ctx);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->n_tokens, ref["n_tokens"].get<int64_t>());
  EXPECT_EQ(r->n_windows, ref["n_windows"].get<int64_t>());
  const double want = ref["ppl"].get<double>();
  RecordProperty("ppl", std::to_string(r->ppl()));
  EXPECT_LE(std::fabs(r->ppl() - want) / want, 1e-3) << "ppl " << r->ppl() << " vs HF " << want;
}

}  // namespace
}  // namespace pw::engine
