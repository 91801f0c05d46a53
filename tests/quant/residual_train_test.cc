// The residual heads' training pipeline on the embedded model: a store from pw-quantize's
// calibration, then per-prompt damage measured with each prompt's own Hessian diagonal, heads
// fitted and written beside the store, read back for the same model and refused for another.
#include "quant/residual_train.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/formats/apw_store.h"
#include "common/formats/residual_heads.h"
#include "quant/quantize_model.h"

namespace pw::anyprec {
namespace {

const std::string kModel = std::string(PW_SOURCE_DIR) + "/models/tiny-moe";
const std::string kOtherModel = std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/qwen2_moe";

class ResidualTrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One folder per process: ctest runs each test of the suite in its own process at once.
    dir_ = std::string(PW_BINARY_DIR) + "/test-tmp/residual_train_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
    QuantizeModelOptions q;
    q.model_dir = kModel;
    q.calib_random_tokens = 1024;
    q.calib_seed = 1;
    q.threads = 2;
    q.progress = false;
    q.out_path = dir_ + "/tiny.apw";
    auto r = QuantizeModel(q);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  static ResidualTrainOptions Options(const std::string& out) {
    ResidualTrainOptions o;
    o.model_dir = kModel;
    o.store_path = dir_ + "/tiny.apw";
    o.calib_random_tokens = 24 * 32;
    o.calib_seed = 2;
    o.prompt_tokens = 32;
    o.holdout_every = 4;
    o.threads = 2;
    o.out_path = out;
    return o;
  }
  static std::string dir_;
};
std::string ResidualTrainTest::dir_;

TEST_F(ResidualTrainTest, TrainsHeadsBesideTheStoreDeterministically) {
  const std::string out = dir_ + "/tiny.pwrh";
  auto rep = TrainResidualHeads(Options(out));
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->prompts, 24);
  EXPECT_EQ(rep->train_prompts, 18);
  EXPECT_EQ(rep->heldout_prompts, 6);
  EXPECT_EQ(rep->samples, 24 * 4 * 2);  // every prompt routes tokens at all 4 layers, 2 heads each
  EXPECT_TRUE(std::isfinite(rep->heldout_r2));
  EXPECT_GE(rep->train_r2, 0.0);  // least squares with a bias explains at least the mean
  EXPECT_GT(rep->target_sd, 0.0);  // prompts do differ from the calibration mean

  auto store = apw::ApwStore::Open(dir_ + "/tiny.apw").value();
  auto heads = ResidualHeads::Load(out, store->info().model_hash);
  ASSERT_TRUE(heads.ok()) << heads.status().ToString();
  EXPECT_EQ(heads->num_layers(), 4);
  EXPECT_EQ(heads->num_experts(), 32);
  EXPECT_EQ(heads->fit().train_prompts, 18u);
  EXPECT_DOUBLE_EQ(heads->fit().heldout_r2, rep->heldout_r2);
  double weight_mass = 0;
  for (int l = 0; l < 4; ++l)
    for (auto p : {ExpertProj::kGateUp, ExpertProj::kDown})
      for (size_t k = 1; k < heads->head(l, p).size(); ++k) weight_mass += std::fabs(heads->head(l, p)[k]);
  EXPECT_GT(weight_mass, 0.0);

  // Scoring the heads on other prompts: all of them held out, nothing written.
  ResidualTrainOptions eval = Options(dir_ + "/not-written.pwrh");
  eval.out_path.clear();
  eval.evaluate_heads = out;
  eval.calib_seed = 3;
  auto scored = TrainResidualHeads(eval);
  ASSERT_TRUE(scored.ok()) << scored.status().ToString();
  EXPECT_EQ(scored->heldout_prompts, 24);
  EXPECT_EQ(scored->train_prompts, 0);
  EXPECT_TRUE(std::isfinite(scored->heldout_r2));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/not-written.pwrh"));

  // The same inputs give the same bytes.
  const std::string again = dir_ + "/again.pwrh";
  ASSERT_TRUE(TrainResidualHeads(Options(again)).ok());
  std::ifstream a(out, std::ios::binary), b(again, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), std::string(std::istreambuf_iterator<char>(b), {}));
}

TEST_F(ResidualTrainTest, RefusesAnotherModelsStoreAndTooFewPrompts) {
  ResidualTrainOptions o = Options(dir_ + "/x.pwrh");
  o.model_dir = kOtherModel;
  auto r = TrainResidualHeads(o);
  EXPECT_FALSE(r.ok());
  o = Options(dir_ + "/x.pwrh");
  o.calib_random_tokens = 5 * 32;  // 5 prompts < 2 * holdout_every
  r = TrainResidualHeads(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at least 8 prompts"), std::string::npos) << r.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/x.pwrh"));
}

}  // namespace
}  // namespace pw::anyprec
