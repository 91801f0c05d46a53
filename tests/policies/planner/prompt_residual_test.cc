// The planner's prompt residual hook: exp(log_residual) multiplies a block's step damage, so
// a residual changes which block is lowered (and which is raised first).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "policies/planner/planner.h"
#include "policies/planner/step_damage.h"

namespace pw::planner {
namespace {

// 10 pages a bit; D[b] = scale * 2^(8 - b).
BlockInput Block(int layer, double scale, double log_residual) {
  BlockInput b;
  b.layer = layer;
  b.committed = 8;
  for (int w = 3; w <= 8; ++w) {
    b.pages[w] = 10 * w;
    b.damage[w] = scale * std::pow(2.0, 8 - w);
  }
  b.damage[0] = scale * 1000;
  b.log_residual = log_residual;
  return b;
}

// Two layers, one expert each; the pool is 10 pages short of the low watermark, so exactly one
// 8 -> 7 step (10 pages) is taken.
PlannerInputs Inputs(double residual0, double residual1) {
  PlannerInputs in;
  in.num_layers = 2;
  in.num_experts = 1;
  in.blocks = {Block(0, 1.0, residual0), Block(1, 1.5, residual1)};
  in.pool.page_bytes = 4096;
  in.pool.weights = 160;
  in.pool.free = 90;
  in.pool.kv = 1000 - 160 - 90;
  return in;
}

PlannerParams Params() {
  PlannerParams p;
  p.enabled = true;
  p.low_watermark = 0.10;
  p.high_watermark = 0.30;
  p.headroom = 0.0;
  p.min_interval_ms = 0;
  return p;
}

TEST(PromptResidual, IsTheExponentOfTheBlocksResidual) {
  BlockInput b = Block(0, 1.0, 0.0);
  EXPECT_EQ(PromptResidual(b), 1.0);
  b.log_residual = std::log(3.0);
  EXPECT_DOUBLE_EQ(PromptResidual(b), 3.0);
  EXPECT_DOUBLE_EQ(StepDamage(b, 8, 7, 2.0), 1.0 * 2.0 * 3.0);  // (2 - 1) * hot * residual
  b.log_residual = 1e6;
  EXPECT_DOUBLE_EQ(PromptResidual(b), std::exp(kMaxLogResidual));
  b.log_residual = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(PromptResidual(b), 1.0);
}

TEST(PromptResidual, ChangesWhichBlockIsLowered) {
  // Without residuals layer 0 (less damage) is lowered.
  auto d = Plan(Inputs(0.0, 0.0), Params()).value();
  ASSERT_EQ(d.changes.size(), 1u);
  EXPECT_EQ(d.changes[0].layer, 0);
  EXPECT_DOUBLE_EQ(d.damage, 1.0);
  // The batch's prompts make layer 0 twice as fragile as the table says: layer 1 goes instead.
  d = Plan(Inputs(std::log(2.0), 0.0), Params()).value();
  ASSERT_EQ(d.changes.size(), 1u);
  EXPECT_EQ(d.changes[0].layer, 1);
  EXPECT_DOUBLE_EQ(d.damage, 1.5);
  // A negative residual on layer 1 also favours it.
  d = Plan(Inputs(0.0, std::log(0.5)), Params()).value();
  ASSERT_EQ(d.changes.size(), 1u);
  EXPECT_EQ(d.changes[0].layer, 1);
  EXPECT_DOUBLE_EQ(d.damage, 0.75);
}

TEST(PromptResidual, ChangesWhichBlockIsRaisedFirst) {
  PlannerInputs in = Inputs(0.0, 0.0);
  for (auto& b : in.blocks) b.committed = 3;
  in.pool.weights = 60;
  in.pool.free = 310;  // 10 pages above the high watermark: one 3 -> 4 raise
  in.pool.kv = 1000 - 60 - 310;
  auto d = Plan(in, Params()).value();
  ASSERT_EQ(d.changes.size(), 1u);
  EXPECT_EQ(d.changes[0].layer, 1);  // more damage avoided
  in.blocks[0].log_residual = std::log(2.0);
  d = Plan(in, Params()).value();
  ASSERT_EQ(d.changes.size(), 1u);
  EXPECT_EQ(d.changes[0].layer, 0);
}

}  // namespace
}  // namespace pw::planner
