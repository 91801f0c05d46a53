// The broker's PlannerDriver with prompt residual heads: a worker's promptFeatures, through
// the heads, change which block the planner lowers; the "no prompt residuals" ablation, no
// features, or features of the wrong size restore the plain table's choice.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "common/formats/apw_store.h"
#include "common/formats/residual_heads.h"
#include "services/broker/planner_driver.h"
#include "tests/services/broker/damage_scaled_store.h"

namespace pw::broker {
namespace {

constexpr int kLayers = 2, kExperts = 1, kHidden = 64, kFfn = 32;
constexpr uint64_t kPage = 1024, kHash = 7;

class PlannerResidualsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TestStorePath("planner_residuals_");
    // Layer 1 is 1.5 times as sensitive as layer 0 by the table.
    WriteDamageScaledStore(path_, {kLayers, kExperts, kHidden, kFfn, kHash},
                           [](uint32_t l, uint32_t) { return l == 0 ? 1.0 : 1.5; });
    ASSERT_FALSE(HasFatalFailure());
    store_ = apw::ApwStore::Open(path_).value();
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove(path_);
  }

  static planner::PlannerParams Params() { return WatermarkParams(); }
  // Heads that say layer 0's blocks take twice the table's damage whenever the prompts route
  // to its (only) expert.
  static std::shared_ptr<const ResidualHeads> Heads() {
    auto h = std::make_shared<ResidualHeads>(kLayers, kExperts, kHash);
    for (auto p : {ExpertProj::kGateUp, ExpertProj::kDown}) h->head(0, p) = {0.0, std::log(2.0)};
    return h;
  }

  // The layer of the one block lowered by a decision for a pool 7 pages short of the low
  // watermark (one 8 -> 7 step frees 9 pages), with these prompt features; -1 if no plan.
  int LoweredLayer(planner::PlannerParams params, std::shared_ptr<const ResidualHeads> heads,
                   std::vector<float> features) {
    PlanBook book(kLayers, kExperts, 8, 3, 8);
    std::vector<BlockWidth> all;
    for (int l = 0; l < kLayers; ++l)
      for (auto p : {ExpertProj::kGateUp, ExpertProj::kDown}) all.push_back({l, 0, p, 8});
    EXPECT_TRUE(book.Mirror("d0", all).ok());
    auto driver = PlannerDriver::Create(*store_, params).value();
    EXPECT_TRUE(driver->SetResidualHeads(std::move(heads)).ok());
    WorkerPool pool{kPage, 500, 4 * 24, 59, 0, 0};
    pool.prompt_features = std::move(features);
    book.Telemetry("d0", pool);
    auto r = driver->Tick(1000, &book, {"d0"});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok() || !r->has_value()) return -1;
    last_residuals_ = (*r)->prompt_residuals;
    const auto& d = (*r)->decision;
    EXPECT_EQ(d.action, planner::PlanAction::kLower);
    EXPECT_EQ(d.changes.size(), 1u);
    return d.changes.empty() ? -1 : d.changes[0].layer;
  }

  std::vector<double> last_residuals_;  // the last decision's prompt factors
  std::string path_;
  std::unique_ptr<apw::ApwStore> store_;
};

TEST_F(PlannerResidualsTest, PromptFeaturesThroughTheHeadsChangeTheLoweredBlock) {
  const std::vector<float> routed = {1.0f, 1.0f};  // both layers' prompts on expert 0
  // No heads: the table's cheaper layer 0.
  EXPECT_EQ(LoweredLayer(Params(), nullptr, routed), 0);
  // Heads: layer 0 is twice as fragile for these prompts (2 > 1.5), so layer 1 goes.
  EXPECT_EQ(LoweredLayer(Params(), Heads(), routed), 1);
  ASSERT_EQ(last_residuals_.size(), 4u);  // layer 0 gate_up/down, layer 1 gate_up/down
  EXPECT_DOUBLE_EQ(last_residuals_[0], 2.0);
  EXPECT_DOUBLE_EQ(last_residuals_[1], 2.0);
  EXPECT_DOUBLE_EQ(last_residuals_[2], 1.0);
  // The ablation, no features, all-zero or wrong-size features: the table's choice again.
  planner::PlannerParams off = Params();
  off.use_prompt_residuals = false;
  EXPECT_EQ(LoweredLayer(off, Heads(), routed), 0);
  EXPECT_TRUE(last_residuals_.empty());
  EXPECT_EQ(LoweredLayer(Params(), Heads(), {}), 0);
  EXPECT_EQ(LoweredLayer(Params(), Heads(), {0.0f, 0.0f}), 0);
  EXPECT_EQ(LoweredLayer(Params(), Heads(), {1.0f, 1.0f, 1.0f}), 0);
}

TEST_F(PlannerResidualsTest, HeadsOfAnotherShapeAreRefused) {
  auto driver = PlannerDriver::Create(*store_, Params()).value();
  Status s = driver->SetResidualHeads(std::make_shared<ResidualHeads>(3, kExperts, kHash));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("do not fit the store"), std::string::npos) << s.ToString();
  EXPECT_EQ(driver->residual_heads(), nullptr);
  EXPECT_TRUE(driver->SetResidualHeads(Heads()).ok());
  EXPECT_NE(driver->residual_heads(), nullptr);
}

}  // namespace
}  // namespace pw::broker
