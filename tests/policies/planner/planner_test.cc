#include "policies/planner/planner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "policies/planner/step_damage.h"

namespace pw::planner {
namespace {

// A block of 10 pages a bit from 3 bits up (30 pages at 3 bits, 80 at 8) whose damage doubles
// with each bit removed: D[b] = scale * 2^(8 - b), D[0] = scale * 1000.
BlockInput MakeBlock(int layer, int expert, ExpertProj proj, int committed, double scale) {
  BlockInput b;
  b.layer = layer;
  b.expert = expert;
  b.proj = proj;
  b.committed = committed;
  for (int w = 3; w <= 8; ++w) {
    b.pages[w] = 10 * w;
    b.damage[w] = scale * std::pow(2.0, 8 - w);
  }
  b.damage[0] = scale * 1000;
  return b;
}

// One layer of `experts` experts, gate_up blocks only, all at `bits`, equal damage; a pool of
// 1000 pages of 4 KiB with `free` pages free.
PlannerInputs MakeInputs(int experts, int bits, int64_t free, double scale = 1.0) {
  PlannerInputs in;
  in.num_layers = 1;
  in.num_experts = experts;
  for (int e = 0; e < experts; ++e)
    in.blocks.push_back(MakeBlock(0, e, ExpertProj::kGateUp, bits, scale));
  in.pool.page_bytes = 4096;
  int64_t weights = 0;
  for (const auto& b : in.blocks) weights += b.pages[b.committed];
  in.pool.weights = weights;
  in.pool.free = free;
  in.pool.kv = 1000 - weights - free;
  return in;
}

PlannerParams Params() {
  PlannerParams p;
  p.enabled = true;
  p.low_watermark = 0.10;   // 100 pages
  p.high_watermark = 0.30;  // 300 pages
  p.headroom = 0.0;
  p.min_interval_ms = 0;
  return p;
}

int64_t PagesFreed(const PlannerInputs& in, const PlannerDecision& d) {
  int64_t freed = 0;
  for (const auto& c : d.changes) {
    const auto& b = in.blocks[c.block];
    freed += static_cast<int64_t>(b.pages[c.from]) - b.pages[c.to];
  }
  return freed;
}

int WidthOf(const PlannerInputs& in, const PlannerDecision& d, size_t block) {
  for (const auto& c : d.changes) {
    if (c.block == block) return c.to;
  }
  return in.blocks[block].committed;
}

TEST(PlannerTest, HysteresisNoChangeBetweenWatermarks) {
  for (int64_t free : {100, 200, 300}) {  // low = 100, high = 300: both ends are inside
    PlannerInputs in = MakeInputs(4, 6, free);
    auto d = Plan(in, Params());
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->action, PlanAction::kNone) << "free " << free;
    EXPECT_TRUE(d->changes.empty()) << "free " << free;
  }
  // Just outside either watermark the planner acts.
  auto lower = Plan(MakeInputs(4, 6, 99), Params());
  ASSERT_TRUE(lower.ok());
  EXPECT_EQ(lower->action, PlanAction::kLower);
  EXPECT_FALSE(lower->changes.empty());
  auto raise = Plan(MakeInputs(4, 6, 311), Params());
  ASSERT_TRUE(raise.ok());
  EXPECT_EQ(raise->action, PlanAction::kRaise);
  EXPECT_FALSE(raise->changes.empty());
}

TEST(PlannerTest, HotExpertProtected) {
  // Expert 0 carries 70 % of the layer's routing mass (r = 2.8, hot); three cold ones 10 %.
  PlannerInputs in = MakeInputs(4, 8, 80);  // 20 pages short of the low watermark
  in.routing_mass = {0.7, 0.1, 0.1, 0.1};
  auto d = Plan(in, Params());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->action, PlanAction::kLower);
  EXPECT_GE(d->pages_moved, 20);
  EXPECT_EQ(WidthOf(in, *d, 0), 8)
      << "the hot expert was lowered while cold ones were not at their floor";

  // A shortfall larger than all the cold experts can give: the hot one stops at hot_floor_bits.
  in.kv_demand_pages = 1000;
  auto all = Plan(in, Params());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(WidthOf(in, *all, 0), Params().hot_floor_bits);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(WidthOf(in, *all, i), 3) << "block " << i;
  EXPECT_FALSE(all->target_met);

  // Ablation: without routing statistics every expert weighs the same; the tie goes to the
  // lowest block index, so expert 0 is lowered first and has no hot floor.
  PlannerParams off = Params();
  off.use_routing = false;
  in.kv_demand_pages = 0;
  in.pool.free = 90;
  in.pool.kv = 1000 - in.pool.weights - 90;
  auto flat = Plan(in, off);
  ASSERT_TRUE(flat.ok());
  ASSERT_EQ(flat->changes.size(), 1u);
  EXPECT_EQ(flat->changes[0].block, 0u);
  EXPECT_EQ(flat->changes[0].to, 7);
}

TEST(PlannerTest, FloorsHeld) {
  PlannerInputs in = MakeInputs(3, 8, 0);
  in.blocks[0].floor = 5;
  in.blocks[2].floor = 7;
  PlannerParams p = Params();
  p.min_bits = 4;
  auto d = Plan(in, p);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(WidthOf(in, *d, 0), 5);
  EXPECT_EQ(WidthOf(in, *d, 1), 4);
  EXPECT_EQ(WidthOf(in, *d, 2), 7);
  EXPECT_FALSE(d->target_met);
  EXPECT_EQ(d->pages_moved, 30 + 40 + 10);
  for (const auto& c : d->changes) EXPECT_LT(c.to, c.from);
}

TEST(PlannerTest, MinBitsFloorHoldsUnderABacklogAndTheHotFloorAboveIt) {
  // A backlog: the KV demand is more than the whole pool, so every step would be taken.
  PlannerInputs in = MakeInputs(4, 8, 0);
  in.kv_demand_pages = 5000;
  in.routing_mass = {4.0, 1.0, 1.0, 1.0};  // expert 0 hot (r = 4 / 1.75 > 2)
  PlannerParams p = Params();
  p.min_bits = 4;
  auto d = Plan(in, p);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->action, PlanAction::kLower);
  EXPECT_FALSE(d->target_met);
  EXPECT_EQ(WidthOf(in, *d, 0), 6) << "hot floor";
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(WidthOf(in, *d, i), 4) << "block " << i;
  EXPECT_EQ(d->pages_moved, 20 + 3 * 40);
  // The same inputs with the default floor go to 3 bits: the floor is what held them.
  p.min_bits = 3;
  auto low = Plan(in, p);
  ASSERT_TRUE(low.ok());
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(WidthOf(in, *low, i), 3) << "block " << i;
  // A block already below min_bits is left alone (neither lowered nor raised by the floor).
  in.blocks[1].committed = 3;
  in.kv_demand_pages = 0;
  in.pool.free = 900;
  p.min_bits = 4;
  auto up = Plan(in, p);
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->action, PlanAction::kRaise);
  EXPECT_EQ(WidthOf(in, *up, 1), 3);
}

TEST(PlannerTest, MeanWidthFloorStopsTheGreedyAtTheMeanNotEveryBlockAtAFloor) {
  // A backlog on four equal-size blocks with damage scales 1, 4, 16, 64: with min_mean_bits
  // 5.5 the widths may sum to 22 (from 32): the ten cheapest steps (costs 1, 2, 4, 4, 8, 8, 16,
  // 16, 16, 32) take block 0 to 3 bits, block 1 to 4, block 2 to 7 and leave block 3 at 8.
  PlannerInputs in = MakeInputs(4, 8, 0);
  for (int e = 0; e < 4; ++e)
    in.blocks[e] = MakeBlock(0, e, ExpertProj::kGateUp, 8, std::pow(4.0, e));
  in.kv_demand_pages = 5000;
  PlannerParams p = Params();
  p.min_mean_bits = 5.5;
  auto d = Plan(in, p);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(WidthOf(in, *d, 0), 3);
  EXPECT_EQ(WidthOf(in, *d, 1), 4);
  EXPECT_EQ(WidthOf(in, *d, 2), 7);
  EXPECT_EQ(WidthOf(in, *d, 3), 8);
  EXPECT_EQ(d->pages_moved, 100);
  EXPECT_FALSE(d->target_met);
  // Without it every block goes to 3 bits.
  p.min_mean_bits = 0;
  auto all = Plan(in, p);
  ASSERT_TRUE(all.ok());
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(WidthOf(in, *all, i), 3) << "block " << i;
  // Already at the mean floor: nothing to lower.
  p.min_mean_bits = 8;
  auto none = Plan(in, p);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->changes.empty());
  // Out of range: refused.
  p.min_mean_bits = 9;
  EXPECT_FALSE(Plan(in, p).ok());
}

TEST(PlannerTest, MeanWidthCeilingTrimsWithoutPressureAndCapsRaises) {
  // Four equal-size blocks at 8 bits, damage scales 1, 4, 16, 64, and free pages between the
  // watermarks (no pressure): with max_mean_bits 5.5 the widths must come down to a sum of 22
  // by the same least-damage steps as the floor above (costs 1, 2, 4, 4, 8, 8, 16, 16, 16, 32):
  // block 0 at 3 bits, block 1 at 4, block 2 at 7, block 3 at 8.
  PlannerInputs in = MakeInputs(4, 8, 0);
  for (int e = 0; e < 4; ++e)
    in.blocks[e] = MakeBlock(0, e, ExpertProj::kGateUp, 8, std::pow(4.0, e));
  in.pool.free = 200;
  in.pool.kv = 1000 - in.pool.weights - 200;
  PlannerParams p = Params();
  p.max_mean_bits = 5.5;
  auto d = Plan(in, p);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->action, PlanAction::kLower);
  EXPECT_EQ(d->target_pages, 0);
  EXPECT_EQ(d->pages_moved, 100);
  EXPECT_EQ(WidthOf(in, *d, 0), 3);
  EXPECT_EQ(WidthOf(in, *d, 1), 4);
  EXPECT_EQ(WidthOf(in, *d, 2), 7);
  EXPECT_EQ(WidthOf(in, *d, 3), 8);
  EXPECT_NE(d->reason.find("max_mean_bits"), std::string::npos) << d->reason;
  // Without the ceiling the same pool is within the watermarks: no change.
  p.max_mean_bits = 0;
  auto none = Plan(in, p);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->action, PlanAction::kNone);

  // Raising from 3 bits everywhere with the whole pool free: the ceiling stops the greedy at a
  // mean of 5.5 (sum 22 from 12: ten one-bit steps), most damage avoided per page first, so
  // the block of scale 64 is raised to 8 first and the one of scale 1 least.
  PlannerInputs low = MakeInputs(4, 3, 0);
  for (int e = 0; e < 4; ++e)
    low.blocks[e] = MakeBlock(0, e, ExpertProj::kGateUp, 3, std::pow(4.0, e));
  low.pool.free = 800;
  low.pool.kv = 1000 - low.pool.weights - 800;
  p.max_mean_bits = 5.5;
  auto up = Plan(low, p);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  EXPECT_EQ(up->action, PlanAction::kRaise);
  int sum = 0;
  for (size_t i = 0; i < 4; ++i) sum += WidthOf(low, *up, i);
  EXPECT_EQ(sum, 22);
  EXPECT_EQ(WidthOf(low, *up, 3), 8);
  EXPECT_LE(WidthOf(low, *up, 0), WidthOf(low, *up, 1));
  EXPECT_LE(WidthOf(low, *up, 1), WidthOf(low, *up, 2));
  EXPECT_EQ(up->pages_moved, 100);
  // Without it every block goes to 8 (200 pages, within the budget of 800 - 300 = 500).
  p.max_mean_bits = 0;
  auto all = Plan(low, p);
  ASSERT_TRUE(all.ok());
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(WidthOf(low, *all, i), 8) << "block " << i;

  // A ceiling below the floor, or above max_bits, is refused.
  p.min_mean_bits = 5;
  p.max_mean_bits = 4.5;
  EXPECT_FALSE(Plan(low, p).ok());
  p.min_mean_bits = 0;
  p.max_mean_bits = 9;
  EXPECT_FALSE(Plan(low, p).ok());
}

TEST(PlannerTest, TargetMetExactlyWithLeastDamage) {
  // Three experts with damage scales 1, 3 and 10; the pool is 25 pages short plus 2 % (20
  // pages) of headroom: 45 pages, so five 10-page steps.
  PlannerInputs in = MakeInputs(3, 8, 75);
  in.blocks[1] = MakeBlock(0, 1, ExpertProj::kGateUp, 8, 3.0);
  in.blocks[2] = MakeBlock(0, 2, ExpertProj::kGateUp, 8, 10.0);
  PlannerParams p = Params();
  p.headroom = 0.02;
  auto d = Plan(in, p);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->target_pages, 45);
  EXPECT_TRUE(d->target_met);
  EXPECT_EQ(d->pages_moved, PagesFreed(in, *d));
  EXPECT_GE(d->pages_moved, 45);
  EXPECT_LT(d->pages_moved - 10, 45) << "one step more than needed";

  // The least total damage over every assignment of widths 3..8 that frees >= 45 pages.
  double best = std::numeric_limits<double>::infinity();
  for (int a = 3; a <= 8; ++a) {
    for (int b = 3; b <= 8; ++b) {
      for (int c = 3; c <= 8; ++c) {
        const int w[3] = {a, b, c};
        int64_t freed = 0;
        double dmg = 0;
        for (int i = 0; i < 3; ++i) {
          freed += in.blocks[i].pages[8] - in.blocks[i].pages[w[i]];
          dmg += in.blocks[i].damage[w[i]] - in.blocks[i].damage[8];
        }
        if (freed >= 45) best = std::min(best, dmg);
      }
    }
  }
  double chosen = 0;
  for (const auto& c : d->changes)
    chosen += in.blocks[c.block].damage[c.to] - in.blocks[c.block].damage[c.from];
  EXPECT_DOUBLE_EQ(chosen, best);
  EXPECT_DOUBLE_EQ(d->damage, best);  // uniform routing: hot = 1
}

TEST(PlannerTest, KvDemandThatDoesNotFitLowers) {
  PlannerInputs in = MakeInputs(4, 8, 250);  // free is inside the band ...
  in.kv_demand_pages = 300;                  // ... but admitted KV needs more than is free
  auto d = Plan(in, Params());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->available_pages, -50);
  EXPECT_EQ(d->action, PlanAction::kLower);
  EXPECT_EQ(d->target_pages, 150);
  EXPECT_GE(d->pages_moved, 150);
}

TEST(PlannerTest, RateLimitsHonoured) {
  PlannerInputs in = MakeInputs(4, 8, 0);
  PlannerParams p = Params();
  p.max_bytes_per_decision = 25 * 4096;  // 25 pages: two 10-page steps
  auto d = Plan(in, p);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->pages_moved, 20);
  EXPECT_LE(PagesFreed(in, *d) * 4096, static_cast<int64_t>(p.max_bytes_per_decision));
  EXPECT_FALSE(d->target_met);

  // Raise side: 4 blocks at 3 bits, 880 pages free.
  in.pool.kv = 0;
  for (auto& b : in.blocks) b.committed = 3;
  in.pool.weights = 120;
  in.pool.free = 880;
  auto r = Plan(in, p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->action, PlanAction::kRaise);
  EXPECT_EQ(r->pages_moved, 20);

  // min_interval_ms: nothing within it of the last change, the same decision after it.
  p.max_bytes_per_decision = 0;
  p.min_interval_ms = 500;
  in.now_ms = 10'000;
  in.last_change_ms = 9'700;
  auto early = Plan(in, p);
  ASSERT_TRUE(early.ok());
  EXPECT_TRUE(early->changes.empty());
  EXPECT_NE(early->reason.find("rate limited"), std::string::npos) << early->reason;
  in.last_change_ms = 9'500;
  auto later = Plan(in, p);
  ASSERT_TRUE(later.ok());
  EXPECT_FALSE(later->changes.empty());
}

TEST(PlannerTest, RaisesHottestFirstAndStaysAboveHighWatermark) {
  PlannerInputs in = MakeInputs(4, 3, 315);  // 15 pages above the high watermark: one step
  in.routing_mass = {0.1, 0.1, 0.5, 0.3};
  auto d = Plan(in, Params());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->action, PlanAction::kRaise);
  ASSERT_EQ(d->changes.size(), 1u);
  EXPECT_EQ(d->changes[0].block, 2u);
  EXPECT_EQ(d->changes[0].to, 4);
  EXPECT_GE(d->available_pages - d->pages_moved, d->high_pages);

  // Lots of room: every block goes up to max_bits and no further.
  in.pool.free = 800;
  in.pool.kv = 1000 - in.pool.weights - 800;
  auto all = Plan(in, Params());
  ASSERT_TRUE(all.ok());
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(WidthOf(in, *all, i), 8);
  EXPECT_GE(all->available_pages - all->pages_moved, all->high_pages);
}

TEST(PlannerTest, StaticModeReturnsNothing) {
  PlannerParams p = Params();
  p.static_mode = true;
  for (int64_t free : {0, 800}) {
    PlannerInputs in = MakeInputs(4, free == 0 ? 8 : 3, free);
    auto d = Plan(in, p);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->action, PlanAction::kNone);
    EXPECT_TRUE(d->changes.empty());
    EXPECT_EQ(d->reason, "static mode");
  }
}

TEST(PlannerTest, LeavesWidthsOutsideItsRangeAlone) {
  PlannerInputs in = MakeInputs(2, 8, 0);
  in.blocks[0].committed = 0;  // not resident: not the planner's to move
  auto d = Plan(in, Params());
  ASSERT_TRUE(d.ok());
  for (const auto& c : d->changes) EXPECT_NE(c.block, 0u);
}

TEST(PlannerTest, BadInputIsRefused) {
  PlannerInputs in = MakeInputs(2, 8, 0);
  PlannerParams p = Params();
  p.low_watermark = 0.5;
  p.high_watermark = 0.2;
  EXPECT_EQ(Plan(in, p).status().code(), StatusCode::kInvalidArgument);

  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    PlannerInputs share = in;
    share.blocks[0].calib_share = bad;
    auto r = Plan(share, Params());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("calib_share"), std::string::npos);
  }
  PlannerInputs mass = in;
  mass.routing_mass = {1.0, 2.0, 3.0};
  auto r = Plan(mass, Params());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("routing_mass"), std::string::npos);

  PlannerInputs pages = in;
  pages.blocks[1].pages[5] = 1;
  r = Plan(pages, Params());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("expert 1"), std::string::npos) << r.status().message();

  PlannerInputs dup = in;
  dup.blocks[1].expert = 0;
  EXPECT_EQ(Plan(dup, Params()).status().code(), StatusCode::kInvalidArgument);

  PlannerInputs nan = in;
  nan.blocks[0].damage[4] = std::nan("");
  EXPECT_EQ(Plan(nan, Params()).status().code(), StatusCode::kInvalidArgument);

  PlannerParams bytes = Params();
  bytes.max_bytes_per_decision = 1 << 20;
  PlannerInputs no_page = in;
  no_page.pool.page_bytes = 0;
  EXPECT_EQ(Plan(no_page, bytes).status().code(), StatusCode::kInvalidArgument);
}

TEST(PlannerTest, StepDamageWeighsByHotness) {
  BlockInput b = MakeBlock(0, 0, ExpertProj::kDown, 8, 2.0);
  EXPECT_DOUBLE_EQ(StepDamage(b, 8, 7, 1.0), 2.0);
  EXPECT_DOUBLE_EQ(StepDamage(b, 8, 6, 3.0), 18.0);
  EXPECT_DOUBLE_EQ(PromptResidual(b), 1.0);
  auto r = NormalizedMass({0.0, 0.0, 3.0, 1.0}, 2, 2, true);
  EXPECT_EQ(r, (std::vector<double>{1.0, 1.0, 1.5, 0.5}));  // a layer with no mass: uniform
  PlannerParams p = Params();
  EXPECT_DOUBLE_EQ(HotWeight(0.0, p), p.hot_weight_min);
  EXPECT_DOUBLE_EQ(HotWeight(100.0, p), p.hot_weight_max);
  EXPECT_DOUBLE_EQ(HotWeight(1.5, p), 1.5);
}

TEST(PlannerTest, RoutingSharesAreTheLiveMassWhereMeasuredElseTheCalibrationShare) {
  PlannerInputs in;
  in.num_layers = 2;
  in.num_experts = 2;
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 2; ++e) {
      in.blocks.push_back(MakeBlock(l, e, ExpertProj::kDown, 8, 1.0));
      in.blocks.back().calib_share = l == 0 ? 0.5 + e : 0.25 + 1.5 * e;
    }
  }
  in.routing_mass = {0.0, 0.0, 3.0, 1.0};  // layer 0 measured nothing yet, layer 1 did
  BlockShares s = RoutingShares(in, true);
  EXPECT_EQ(s.r, (std::vector<double>{0.5, 1.5, 1.5, 0.5}));
  EXPECT_EQ(s.live, (std::vector<bool>{false, false, true, true}));
  // Blended with the calibration share where live: a quarter of the live share and three
  // quarters of the calibration's (layer 0, not live, keeps its calibration share).
  BlockShares q = RoutingShares(in, true, 0.25);
  EXPECT_EQ(q.r, (std::vector<double>{0.5, 1.5, 0.25 * 1.5 + 0.75 * 0.25, 0.25 * 0.5 + 0.75 * 1.75}));
  EXPECT_EQ(q.live, s.live);
  // Without routing statistics (or with them off) every block has its calibration share.
  for (bool on : {true, false}) {
    PlannerInputs none = in;
    if (on) none.routing_mass.clear();
    BlockShares c = RoutingShares(none, on);
    EXPECT_EQ(c.r, (std::vector<double>{0.5, 1.5, 0.25, 1.75}));
    EXPECT_EQ(c.live, (std::vector<bool>(4, false)));
  }
}

TEST(PlannerTest, WithoutLiveMassTheCalibrationShareWeighsStepsAndGivesNoHotFloor) {
  // Four equal blocks; the calibration routed expert 0 four times as often as average and the
  // others a fraction: a lowering takes the rarely routed ones first...
  PlannerInputs in = MakeInputs(4, 8, 80);  // 20 pages short
  in.blocks[0].calib_share = 4.0;
  for (size_t i = 1; i < 4; ++i) in.blocks[i].calib_share = 0.25 + 0.25 * static_cast<double>(i);
  auto d = Plan(in, Params());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(WidthOf(in, *d, 0), 8);
  EXPECT_EQ(WidthOf(in, *d, 1), 7) << "the least routed block goes first";
  // ... the same with the routing ablation on ...
  PlannerParams off = Params();
  off.use_routing = false;
  auto d_off = Plan(in, off);
  ASSERT_TRUE(d_off.ok());
  EXPECT_EQ(d_off->changes.size(), d->changes.size());
  EXPECT_EQ(WidthOf(in, *d_off, 0), 8);
  // ... and a live mass that says otherwise wins: expert 3 is now the hot one.
  in.routing_mass = {0.1, 0.1, 0.1, 0.7};
  auto live = Plan(in, Params());
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(WidthOf(in, *live, 3), 8);
  EXPECT_LT(WidthOf(in, *live, 0), 8);
  // Half live, half calibration: expert 0 (calibration 4, live 0.4: 2.2) is the hot one again.
  PlannerParams half = Params();
  half.live_mass_weight = 0.5;
  auto mixed = Plan(in, half);
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(WidthOf(in, *mixed, 0), 8);
  half.live_mass_weight = 1.5;
  EXPECT_FALSE(Plan(in, half).ok()) << "live_mass_weight outside [0, 1]";
  // A share of 4 (above hot_threshold) from the calibration is a weight, not a floor: a
  // shortfall larger than the others can give takes expert 0 below hot_floor_bits.
  in.routing_mass.clear();
  in.kv_demand_pages = 1000;
  auto all = Plan(in, Params());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(WidthOf(in, *all, 0), 3);
}

}  // namespace
}  // namespace pw::planner
