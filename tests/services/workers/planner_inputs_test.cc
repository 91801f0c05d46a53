// The decode worker's side of the planner's inputs: routing mass (the engine's recorder seam),
// KV demand in pages, and the reservations held for a lowering (pool-aware admission).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "services/workers/decode/kv_demand.h"
#include "services/workers/common/request_boundary.h"
#include "services/workers/decode/reserve_wait.h"
#include "services/workers/decode/routing_stats.h"

namespace pw::workers {
namespace {

engine::RoutingContext Ctx(int layer, int tokens, bool pure_decode) {
  engine::RoutingContext c;
  c.layer = layer;
  c.num_tokens = tokens;
  c.num_experts = 4;
  c.top_k = 2;
  c.pure_decode = pure_decode;
  return c;
}

TEST(RoutingStats, FirstBatchSetsTheShareThenAnEmaOfGateWeight) {
  RoutingStats s(2, 4, 0.5);
  EXPECT_EQ(s.mass(), std::vector<float>(8, 0.f));
  // Two tokens: expert 0 gets 0.75 + 0.5, expert 1 0.25, expert 2 0.5 of 2.0 in all.
  s.Record(Ctx(1, 2, true), {{0, 0, 0.75f, 0}, {0, 1, 0.25f, 1}, {1, 0, 0.5f, 0}, {1, 2, 0.5f, 1}});
  EXPECT_EQ(s.batches(1), 1u);
  EXPECT_EQ(s.batches(0), 0u);
  EXPECT_FLOAT_EQ(s.mass()[4 + 0], 0.625f);
  EXPECT_FLOAT_EQ(s.mass()[4 + 1], 0.125f);
  EXPECT_FLOAT_EQ(s.mass()[4 + 2], 0.25f);
  EXPECT_FLOAT_EQ(s.mass()[4 + 3], 0.f);
  for (int e = 0; e < 4; ++e) EXPECT_EQ(s.mass()[e], 0.f) << "layer 0 untouched";
  // Everything to expert 3 next: halfway there with alpha 0.5; the row still sums to 1.
  s.Record(Ctx(1, 1, true), {{0, 3, 1.f, 0}});
  EXPECT_FLOAT_EQ(s.mass()[4 + 3], 0.5f);
  EXPECT_FLOAT_EQ(s.mass()[4 + 0], 0.3125f);
  EXPECT_NEAR(std::accumulate(s.mass().begin() + 4, s.mass().end(), 0.0), 1.0, 1e-6);
}

TEST(RoutingStats, SkipsPromptBatchesAndForeignShapes) {
  RoutingStats s(1, 4, 0.5);
  s.Record(Ctx(0, 1, /*pure_decode=*/false), {{0, 1, 1.f, 0}});
  EXPECT_EQ(s.batches(0), 0u);
  s.Record(Ctx(3, 1, true), {{0, 1, 1.f, 0}});  // no layer 3
  auto wrong = Ctx(0, 1, true);
  wrong.num_experts = 8;
  s.Record(wrong, {{0, 1, 1.f, 0}});
  s.Record(Ctx(0, 1, true), {});  // nothing routed
  EXPECT_EQ(s.batches(0), 0u);
  EXPECT_EQ(s.mass(), std::vector<float>(4, 0.f));
}

TEST(KvDemand, RunningGrowthLeasesAndWaitingInPages) {
  // 16 tokens a block, 4 layers (pages per block), context 256.
  KvDemand d(16, 4, 256);
  // 20 tokens now, 20 + 1 + 30 at the end: blocks 4 - 2 = 2, plus one of slack.
  d.AddRunning(20, 51, true);
  EXPECT_EQ(d.running_blocks(), 3);
  // Preempted: holds nothing, needs all 4 of its blocks (+1).
  d.AddRunning(20, 51, false);
  EXPECT_EQ(d.running_blocks(), 3 + 5);
  // Capped by the context: 250 now, 1000 at the end -> 16 - 16 + 1.
  d.AddRunning(250, 1000, true);
  EXPECT_EQ(d.running_blocks(), 3 + 5 + 1);
  // A lease of 2 blocks for 40 tokens more: ends by 2 * 16 + 41 = 73 tokens, 5 blocks.
  d.AddLease(2, 40);
  EXPECT_EQ(d.lease_blocks(), 3 + 1);
  d.AddLease(2, 0);  // max_tokens unknown: one block
  EXPECT_EQ(d.lease_blocks(), 4 + 1);
  // Waiting: 33 prompt tokens + 1 + 14 = 48 -> 3 blocks.
  d.AddWaiting(33, 14);
  EXPECT_EQ(d.waiting_blocks(), 3);
  EXPECT_EQ(d.reserve_pages(), (9 + 5) * 4);
  EXPECT_EQ(d.pages(), (9 + 5 + 3) * 4);
}

TEST(KvDemand, AHorizonCountsOnlyTheNextTokensOfEveryRequest) {
  // 16 tokens a block, 4 layers, context 256, a horizon of 20 tokens.
  KvDemand d(16, 4, 256, 20);
  // 20 tokens now, 51 at the end: only to 40 -> 3 - 2 = 1 block (+1 slack); without the
  // horizon it is 2 (+1).
  d.AddRunning(20, 51, true);
  EXPECT_EQ(d.running_blocks(), 2);
  // Ends within the horizon: its whole growth, 21 -> 30 tokens: 2 - 2 (+1).
  d.AddRunning(21, 30, true);
  EXPECT_EQ(d.running_blocks(), 2 + 1);
  // Preempted: every block of its length plus the horizon, 40 tokens -> 3 (+1).
  d.AddRunning(20, 200, false);
  EXPECT_EQ(d.running_blocks(), 3 + 4);
  // A lease of 2 blocks for 100 tokens more: 2 * 16 + 1 + 20 = 53 -> 4 - 2 (+1).
  d.AddLease(2, 100);
  EXPECT_EQ(d.lease_blocks(), 3);
  // Waiting: 33 prompt tokens + 1 + min(100, 20) = 54 -> 4 blocks (7 without the horizon).
  d.AddWaiting(33, 100);
  EXPECT_EQ(d.waiting_blocks(), 4);
  EXPECT_EQ(d.pages(), (7 + 3 + 4) * 4);

  KvDemand whole(16, 4, 256, 0);
  whole.AddWaiting(33, 100);
  EXPECT_EQ(whole.waiting_blocks(), 9);  // 134 tokens
  whole.AddRunning(20, 51, true);
  EXPECT_EQ(whole.running_blocks(), 3);
}

TEST(RequestBoundary, CrossedWhenARequestJoinsOrLeavesTheBatch) {
  RequestBoundary b;
  auto crossed = [&b](std::initializer_list<uint64_t> ids) {
    b.Begin();
    for (uint64_t id : ids) b.Add(id);
    return b.Crossed();
  };
  EXPECT_TRUE(crossed({}));  // the first check
  EXPECT_FALSE(crossed({}));
  EXPECT_TRUE(crossed({7}));        // one joined
  EXPECT_FALSE(crossed({7}));       // same batch, another iteration
  EXPECT_TRUE(crossed({7, 9}));     // one joined
  EXPECT_FALSE(crossed({9, 7}));    // order does not matter
  EXPECT_TRUE(crossed({9, 11}));    // one left and one joined in the same iteration
  EXPECT_TRUE(crossed({9}));        // one left
  EXPECT_TRUE(crossed({}));         // the last left
}

TEST(ReserveWait, HoldsWhatALoweringCanMakeRoomForAndAnswersWithinTheWait) {
  ReserveWait off(0, 8);
  EXPECT_EQ(off.Decide(10, 0, 0, 1000), ReserveWait::Admit::kAnswer);

  ReserveWait w(500, 2);
  // Fits beside the reserve: now.
  EXPECT_EQ(w.Decide(10, 100, 90, 0), ReserveWait::Admit::kNow);
  // Does not fit beside the reserve, would after lowering: hold.
  EXPECT_EQ(w.Decide(11, 100, 90, 1), ReserveWait::Admit::kHold);
  // Would not fit even with every block at the lowest width: answer (grant or refuse) now.
  EXPECT_EQ(w.Decide(12, 100, 90, 1), ReserveWait::Admit::kAnswer);

  w.Hold({1, 100, 50, 30000, /*since_ms=*/1000, /*need_pages=*/40});
  // FIFO: something waits, so even a reservation that fits waits behind it.
  EXPECT_EQ(w.Decide(1, 100, 0, 0), ReserveWait::Admit::kHold);
  w.Hold({2, 10, 0, 30000, 1100, 5});
  EXPECT_EQ(w.Decide(1, 0, 0, 100), ReserveWait::Admit::kAnswer) << "max_waiting reached";
  EXPECT_EQ(w.size(), 2u);

  // Not due: the first does not fit and has not waited 500 ms; the second waits behind it.
  EXPECT_FALSE(w.Next(1400, 30, 0).has_value());
  // Room now (a lowering committed): granted in order.
  auto a = w.Next(1450, 45, 5);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->reserve.request_id, 1u);
  EXPECT_TRUE(a->fits);
  // The second has waited its 500 ms without room: answered as without waiting.
  EXPECT_FALSE(w.Next(1599, 0, 0).has_value());
  auto b = w.Next(1600, 0, 0);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->reserve.request_id, 2u);
  EXPECT_FALSE(b->fits);
  EXPECT_EQ(w.size(), 0u);

  // A cancelled one leaves the queue.
  w.Hold({7, 1, 0, 0, 0, 1});
  EXPECT_FALSE(w.Drop(8));
  EXPECT_TRUE(w.Drop(7));
  EXPECT_EQ(w.size(), 0u);
  w.Hold({9, 1, 0, 0, 0, 1});
  EXPECT_EQ(w.TakeAll().size(), 1u);
  EXPECT_EQ(w.size(), 0u);
}

// pages[w] = per_bit * w + 2 (planes plus a LUT), 0 when absent.
LowerableBlock Block(int committed, int per_bit) {
  LowerableBlock b;
  b.committed = committed;
  for (int w = 1; w <= anyprec::kMaxBits; ++w) b.pages[static_cast<size_t>(w)] = per_bit * w + 2;
  return b;
}

TEST(ReserveWait, WhatALoweringCanFreeRespectsThePlannersFloors) {
  const std::vector<LowerableBlock> four(4, Block(8, 10));
  // No floors but the lowest width: every block 8 -> 3 frees 50 pages.
  EXPECT_EQ(ReserveWait::LowerablePages(four, LowerFloors{}), 200);
  // min_bits 5: 8 -> 5 frees 30 each.
  EXPECT_EQ(ReserveWait::LowerablePages(four, LowerFloors{5, 8, 0}), 120);
  // A mean floor of 6.5 bits over four 8-bit blocks of equal size: six one-width steps in
  // all, 10 pages each, however the greedy spreads them.
  EXPECT_EQ(ReserveWait::LowerablePages(four, LowerFloors{3, 8, 6.5}), 60);
  // Both floors: the mean allows 8 steps (mean 6), min_bits 7 only 4 (one per block).
  EXPECT_EQ(ReserveWait::LowerablePages(four, LowerFloors{7, 8, 6.0}), 40);
  // A mean already at the floor frees nothing.
  EXPECT_EQ(ReserveWait::LowerablePages(four, LowerFloors{3, 8, 8.0}), 0);

  // Blocks of two sizes (gate_up twice down), mean floor 7: size 162 and 82, budget
  // 244 * (8 - 7) = 244. The big block's step frees more per unit of the mean (20/162 >
  // 10/82): taken (82 left); its next step (162) is over what is left, the small block's
  // (82) is not: 20 + 10 pages, mean exactly 7.
  const std::vector<LowerableBlock> two{Block(8, 20), Block(8, 10)};
  EXPECT_EQ(ReserveWait::LowerablePages(two, LowerFloors{3, 8, 7.0}), 30);

  // Blocks outside [min_bits, max_bits] do not move (as in the planner), and absent ones count
  // nothing; they still weigh in the mean (an absent block at 0 bits pulls it down).
  const std::vector<LowerableBlock> mixed{Block(8, 10), Block(4, 10), Block(0, 10)};
  EXPECT_EQ(ReserveWait::LowerablePages(mixed, LowerFloors{5, 8, 0}), 30);
  EXPECT_EQ(ReserveWait::LowerablePages(mixed, LowerFloors{3, 7, 0}), 10) << "only the 4-bit block moves";
  // Mean (8 + 4 + 0) / 3 = 4 at size 82 each; floor 3: three one-width steps of 10 pages.
  EXPECT_EQ(ReserveWait::LowerablePages(mixed, LowerFloors{3, 8, 3.0}), 30);
}

}  // namespace
}  // namespace pw::workers
