// The broker's PlannerDriver over a real .apw store and PlanBook: Telemetry in, a new epoch
// of desired widths out; no plan for a worker that has not committed the last one.
#include "services/broker/planner_driver.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "common/formats/apw_store.h"
#include "memory/weight_page_table.h"
#include "tests/services/broker/damage_scaled_store.h"

namespace pw::broker {
namespace {

constexpr int kLayers = 1, kExperts = 2, kHidden = 64, kFfn = 32;
constexpr uint64_t kPage = 1024;

class PlannerDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TestStorePath("planner_driver_");
    // Expert 1 is ten times as sensitive as expert 0.
    WriteDamageScaledStore(path_, {kLayers, kExperts, kHidden, kFfn, 7},
                           [](uint32_t, uint32_t e) { return e == 0 ? 1.0 : 10.0; });
    ASSERT_FALSE(HasFatalFailure());
    store_ = apw::ApwStore::Open(path_).value();
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove(path_);
  }

  static std::vector<BlockWidth> All(int bits) {
    std::vector<BlockWidth> t;
    for (int e = 0; e < kExperts; ++e) {
      for (auto p : {ExpertProj::kGateUp, ExpertProj::kDown}) t.push_back({0, e, p, bits});
    }
    return t;
  }
  static planner::PlannerParams Params() { return WatermarkParams(); }

  std::string path_;
  std::unique_ptr<apw::ApwStore> store_;
};

TEST_F(PlannerDriverTest, LowersUnderPressureWaitsForTheAckThenRaises) {
  PlanBook book(kLayers, kExperts, 8, 3, 8);
  ASSERT_TRUE(book.Mirror("d0", All(8)).ok());
  auto driver = PlannerDriver::Create(*store_, Params()).value();
  const std::vector<std::string> workers = {"d0"};

  // No Telemetry yet: nothing to plan from.
  auto none = driver->Tick(1000, &book, workers);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());

  // 4 blocks at 8 bits in 1 KiB pages: gate_up [64 x 64] and down [64 x 32] take one page a
  // plane and 16 pages of LUT: 24 pages each.
  const int64_t weights = 4 * 24;
  book.Telemetry("d0", WorkerPool{kPage, 500, static_cast<uint32_t>(weights), 10, 0, 0});
  auto low = driver->Tick(1100, &book, workers);
  ASSERT_TRUE(low.ok()) << low.status().ToString();
  ASSERT_TRUE(low->has_value());
  const auto& d = (*low)->decision;
  EXPECT_EQ(d.action, planner::PlanAction::kLower);
  EXPECT_EQ(d.target_pages, 61 - 10);  // ceil(0.1 * 606) - 10
  EXPECT_TRUE(d.target_met);
  EXPECT_EQ((*low)->epoch, 1u);
  EXPECT_EQ(book.epoch(), 1u);
  // The cheap expert 0 goes down before the sensitive expert 1.
  int lowered0 = 0, lowered1 = 0;
  for (const auto& c : d.changes) {
    EXPECT_EQ(book.desired(ExpertBlockIndex(0, c.expert, c.proj, kExperts)), c.to);
    (c.expert == 0 ? lowered0 : lowered1) += c.from - c.to;
  }
  EXPECT_GT(lowered0, lowered1);
  const std::vector<BlockWidth> pending = book.PendingFor("d0");
  EXPECT_EQ(pending.size(), d.changes.size());

  // Too soon, then not acknowledged yet: no new plan.
  auto soon = driver->Tick(1150, &book, workers);
  ASSERT_TRUE(soon.ok());
  EXPECT_FALSE(soon->has_value());
  auto unacked = driver->Tick(1300, &book, workers);
  ASSERT_TRUE(unacked.ok());
  EXPECT_FALSE(unacked->has_value());
  EXPECT_EQ(book.epoch(), 1u);

  // Acknowledged, and the burst is over: widths come back up.
  ASSERT_TRUE(book.Acked("d0", 1, pending, false).ok());
  book.Telemetry("d0", WorkerPool{kPage, 100, static_cast<uint32_t>(weights - d.pages_moved), 500, 1, 0});
  auto high = driver->Tick(1500, &book, workers);
  ASSERT_TRUE(high.ok()) << high.status().ToString();
  ASSERT_TRUE(high->has_value());
  EXPECT_EQ((*high)->decision.action, planner::PlanAction::kRaise);
  EXPECT_EQ((*high)->epoch, 2u);
  for (const auto& c : (*high)->decision.changes) EXPECT_GT(c.to, c.from);
  ASSERT_NE(driver->last(), nullptr);
  EXPECT_EQ(driver->last()->epoch, 2u);
}

// A model whose layer 0 is dense (GLM-4.5's first_k_dense_replace): the store holds layers 1
// and 2 under those numbers; the plan book never selects, pends or shows layer 0's (absent)
// blocks, and the planner, under a pressure no lowering can meet, lowers exactly the MoE layers'
// blocks to the floor: the pages it frees are the sum over those blocks only.
TEST(PlannerDriverDense, ADenseLayerIsNeverPlannedNorCounted) {
  const std::string path = TestStorePath("planner_driver_");
  WriteDamageScaledStore(path, {3, kExperts, kHidden, kFfn, 7, {1, 2}},
                         [](uint32_t, uint32_t e) { return e == 0 ? 1.0 : 10.0; });
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  auto store = apw::ApwStore::Open(path).value();
  PlanBook book(3, kExperts, 8, 3, 8, {false, true, true});
  // The worker's table is in the model's numbering: layer 0's slots are reported at 0 bits.
  std::vector<BlockWidth> committed;
  for (int l = 0; l < 3; ++l) {
    for (int e = 0; e < kExperts; ++e) {
      for (auto p : {ExpertProj::kGateUp, ExpertProj::kDown}) committed.push_back({l, e, p, l == 0 ? 0 : 8});
    }
  }
  ASSERT_TRUE(book.Mirror("d0", committed).ok());
  EXPECT_TRUE(book.PendingFor("d0").empty());
  auto dense = book.SetBits(5, 0, -1, -1);
  ASSERT_FALSE(dense.ok());
  EXPECT_NE(dense.status().message().find("layer 0 is dense"), std::string::npos) << dense.status().ToString();
  EXPECT_NE(book.Show(false, -1).find("0     dense (no expert blocks)"), std::string::npos) << book.Show(false, -1);

  auto driver = PlannerDriver::Create(*store, WatermarkParams()).value();
  int64_t moe_pages_at_8 = 0, moe_pages_at_3 = 0;
  for (int i = 0; i < store->num_blocks(); ++i) {
    const apw::BlockData& b = store->block(i);
    moe_pages_at_8 += memory::WeightPageTable::PagesFor(static_cast<int>(b.rows), static_cast<int>(b.cols), 8, kPage);
    moe_pages_at_3 += memory::WeightPageTable::PagesFor(static_cast<int>(b.rows), static_cast<int>(b.cols), 3, kPage);
  }
  EXPECT_EQ(store->num_blocks(), 2 * kExperts * 2);  // the MoE layers' blocks only
  // No free pages and a large KV demand: more than every block at 3 bits frees.
  book.Telemetry("d0", WorkerPool{kPage, 1000, static_cast<uint32_t>(moe_pages_at_8), 0, 0, 0, 5000});
  auto low = driver->Tick(1000, &book, {"d0"});
  ASSERT_TRUE(low.ok()) << low.status().ToString();
  ASSERT_TRUE(low->has_value()) << "no plan for a store with a dense layer";
  const planner::PlannerDecision& d = (*low)->decision;
  EXPECT_EQ(d.action, planner::PlanAction::kLower);
  EXPECT_FALSE(d.target_met);
  EXPECT_EQ(d.changes.size(), 2u * kExperts * 2);
  for (const auto& c : d.changes) {
    EXPECT_NE(c.layer, 0);
    EXPECT_EQ(c.to, 3);
  }
  EXPECT_EQ(d.pages_moved, moe_pages_at_8 - moe_pages_at_3);
  for (const BlockWidth& b : book.PendingFor("d0")) EXPECT_NE(b.layer, 0);
  EXPECT_EQ(book.PendingFor("d0").size(), 2u * kExperts * 2);
  store.reset();
  std::filesystem::remove(path);
}

TEST_F(PlannerDriverTest, ALoweringTakesBackPendingRaisesTheKvLeftNoRoomFor) {
  // Committed at 5 bits, desired 8 (a raise planned while pages were free): all four blocks
  // have a raise pending. 5-bit blocks take 5 plane pages and 2 LUT pages each.
  const uint32_t weights = 4 * 7;
  auto setup = [&](PlanBook* book) {
    ASSERT_TRUE(book->Mirror("d0", All(5)).ok());
    ASSERT_EQ(book->PendingFor("d0").size(), 4u);
  };
  {
    // The raise has pages to go on with (available 400 above the low watermark 53): wait for
    // its ack, as for any plan.
    PlanBook book(kLayers, kExperts, 8, 3, 8);
    setup(&book);
    book.Telemetry("d0", WorkerPool{kPage, 100, weights, 400, 0, 4});
    auto driver = PlannerDriver::Create(*store_, Params()).value();
    auto r = driver->Tick(1000, &book, {"d0"});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->has_value());
    EXPECT_EQ(book.epoch(), 0u);
  }
  {
    // KV has taken the pages since: 2 free, 10 more demanded (total 530: low 53). The raise
    // cannot finish; a lowering goes out now and every raise it leaves is taken back.
    PlanBook book(kLayers, kExperts, 8, 3, 8);
    setup(&book);
    WorkerPool pool{kPage, 500, weights, 2, 0, 4};
    pool.kv_demand = 10;
    book.Telemetry("d0", pool);
    auto driver = PlannerDriver::Create(*store_, Params()).value();
    auto r = driver->Tick(1000, &book, {"d0"});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_value());
    const auto& o = **r;
    EXPECT_EQ(o.decision.action, planner::PlanAction::kLower);
    EXPECT_EQ(o.decision.target_pages, 53 - (2 - 10));
    EXPECT_EQ(o.epoch, 1u);
    EXPECT_FALSE(o.decision.changes.empty());
    EXPECT_EQ(o.raises_taken_back + static_cast<int>(o.decision.changes.size()), 4);
    for (const auto& c : o.decision.changes) EXPECT_LT(c.to, c.from);
    // Nothing the worker has to make is a raise now: each block at 5 or below.
    for (int e = 0; e < kExperts; ++e) {
      for (auto p : {ExpertProj::kGateUp, ExpertProj::kDown}) EXPECT_LE(book.desired(ExpertBlockIndex(0, e, p, kExperts)), 5);
    }
    for (const BlockWidth& b : book.PendingFor("d0")) EXPECT_LT(b.bits, 5);
    // Pending lowerings are waited for as before.
    book.Telemetry("d0", pool);
    auto again = driver->Tick(2000, &book, {"d0"});
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->has_value());
    EXPECT_EQ(book.epoch(), 1u);
  }
}

TEST_F(PlannerDriverTest, KvDemandAndRoutingMassFromTelemetryReachThePlanner) {
  // Free pages above the high watermark, but the worker reports KV demand that leaves too few:
  // the planner lowers before the free pages are gone.
  const uint32_t weights = 4 * 24;
  auto lowered = [&](bool use_routing, std::vector<float> mass, int* by0, int* by1) {
    PlanBook book(kLayers, kExperts, 8, 3, 8);
    ASSERT_TRUE(book.Mirror("d0", All(8)).ok());
    planner::PlannerParams p = Params();
    p.use_routing = use_routing;
    p.hot_threshold = 100.0;  // no hot floor here: only the weighting
    auto driver = PlannerDriver::Create(*store_, p).value();
    WorkerPool pool{kPage, 500, weights, 300, 0, 0};
    pool.kv_demand = 260;  // total 896: low 90, high 269; available 300 - 260 = 40
    pool.mass = std::move(mass);
    book.Telemetry("d0", pool);
    auto r = driver->Tick(1000, &book, {"d0"});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_value());
    EXPECT_EQ((*r)->decision.action, planner::PlanAction::kLower);
    EXPECT_EQ((*r)->decision.target_pages, 90 - 40);
    EXPECT_TRUE((*r)->decision.target_met);
    *by0 = *by1 = 0;
    for (const auto& c : (*r)->decision.changes) (c.expert == 0 ? *by0 : *by1) += c.from - c.to;
  };
  int a0 = 0, a1 = 0;
  // Without routing mass the cheap expert 0 goes down first...
  lowered(true, {}, &a0, &a1);
  EXPECT_GT(a0, a1);
  // ... but it takes 95 % of the gate weight: the sensitive, cold expert 1 is cheaper now.
  int b0 = 0, b1 = 0;
  lowered(true, {0.95f, 0.05f}, &b0, &b1);
  EXPECT_GT(b1, b0);
  // The routing ablation ignores the same mass.
  int c0 = 0, c1 = 0;
  lowered(false, {0.95f, 0.05f}, &c0, &c1);
  EXPECT_EQ(c0, a0);
  EXPECT_EQ(c1, a1);
  // All zero (no decode step seen yet) or the wrong size: every expert average.
  int d0 = 0, d1 = 0;
  lowered(true, {0.f, 0.f}, &d0, &d1);
  EXPECT_EQ(d0, a0);
  lowered(true, {0.5f, 0.3f, 0.2f}, &d0, &d1);
  EXPECT_EQ(d0, a0);
}

TEST_F(PlannerDriverTest, TheStoresCalibrationCountsWeighStepsUntilTheWorkerMeasuresMass) {
  // The same damage tables (expert 1 ten times as sensitive per routed token), but the
  // calibration routed 99 % of its tokens to expert 0: per token of traffic expert 0 is the
  // costly one to lower, until live mass says otherwise.
  const std::string path = TestStorePath("planner_driver_calib_");
  std::vector<anyprec::RandomBlock> blocks;
  anyprec::WriteRandomStore(path, {kLayers, kExperts, kHidden, kFfn, 7}, 5, &blocks, [](apw::BlockData& b) {
    const double s = b.expert == 0 ? 1.0 : 10.0;
    for (int bits = apw::kMinBits; bits <= apw::kMaxBits; ++bits) b.damage[bits] = s * std::pow(2.0, 8 - bits);
    b.damage[0] = s * 1000;
    b.calib_tokens = b.expert == 0 ? 9899 : 99;
  });
  ASSERT_FALSE(HasFatalFailure());
  auto store = apw::ApwStore::Open(path).value();
  const std::vector<double> shares = apw::CalibrationShares(*store);
  for (int i = 0; i < store->num_blocks(); ++i) {
    EXPECT_NEAR(shares[i], store->block(i).expert == 0 ? 2 * 9900.0 / 10000 : 2 * 100.0 / 10000, 1e-12);
  }
  auto lowered = [&](bool use_routing, std::vector<float> mass, int* by0, int* by1) {
    PlanBook book(kLayers, kExperts, 8, 3, 8);
    ASSERT_TRUE(book.Mirror("d0", All(8)).ok());
    planner::PlannerParams p = Params();
    p.use_routing = use_routing;
    p.hot_threshold = 100.0;  // no hot floor: only the weighting
    auto driver = PlannerDriver::Create(*store, p).value();
    WorkerPool pool{kPage, 500, 4 * 24, 300, 0, 0};
    pool.kv_demand = 260;
    pool.mass = std::move(mass);
    book.Telemetry("d0", pool);
    auto r = driver->Tick(1000, &book, {"d0"});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_value());
    *by0 = *by1 = 0;
    for (const auto& c : (*r)->decision.changes) (c.expert == 0 ? *by0 : *by1) += c.from - c.to;
  };
  int a0 = 0, a1 = 0;
  lowered(true, {}, &a0, &a1);  // no mass measured yet: the calibration's counts
  EXPECT_GT(a1, a0);
  int b0 = 0, b1 = 0;
  lowered(false, {0.5f, 0.5f}, &b0, &b1);  // the routing ablation: the same
  EXPECT_EQ(b0, a0);
  EXPECT_EQ(b1, a1);
  int c0 = 0, c1 = 0;
  lowered(true, {0.5f, 0.5f}, &c0, &c1);  // live traffic routes both alike: expert 0 is cheap again
  EXPECT_GT(c0, c1);
  store.reset();
  std::filesystem::remove(path);
}

TEST_F(PlannerDriverTest, StaticModeAndBadParams) {
  PlanBook book(kLayers, kExperts, 8, 3, 8);
  ASSERT_TRUE(book.Mirror("d0", All(8)).ok());
  book.Telemetry("d0", WorkerPool{kPage, 500, 96, 0, 0, 0});
  planner::PlannerParams p = Params();
  p.static_mode = true;
  auto driver = PlannerDriver::Create(*store_, p).value();
  auto r = driver->Tick(1000, &book, {"d0"});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->has_value());
  EXPECT_TRUE((*r)->decision.changes.empty());
  EXPECT_EQ((*r)->epoch, 0u);
  EXPECT_EQ(book.epoch(), 0u);

  p = Params();
  p.interval_ms = 0;
  EXPECT_EQ(PlannerDriver::Create(*store_, p).status().code(), StatusCode::kInvalidArgument);

  // A page too small for one row of an 8-bit LUT is a clear error, not a plan.
  auto ok = PlannerDriver::Create(*store_, Params()).value();
  book.Telemetry("d0", WorkerPool{128, 500, 96, 0, 0, 0});
  auto bad = ok->Tick(1000, &book, {"d0"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("128 bytes"), std::string::npos) << bad.status().ToString();
}

}  // namespace
}  // namespace pw::broker
