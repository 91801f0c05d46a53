// WeightPageTable: raising and lowering through Begin/Commit/Abort keeps the pool's accounting
// exact, frees what a lower width does not use, refuses to take pages that are not free, and
// never changes under a step but for a synchronous fetch (a raise from 0).
#include "memory/weight_page_table.h"

#include <gtest/gtest.h>

#include <random>

namespace pw::memory {
namespace {

// The embedded model's shapes: hidden 128, ffn 128 (gate_up 256 x 128, down 128 x 128).
constexpr int kHidden = 128, kFfn = 128;

TEST(WeightPageTable, PagesFollowTheWidth) {
  auto pool = PagePool::Create(4096, 1000).value();
  auto t = WeightPageTable::Create(pool.get(), 2, 4, kHidden, kFfn).value();
  const size_t g = t->Index(1, 2, ExpertProj::kGateUp);
  // A plane row of 128 columns is 32 bytes: 128 rows per page; gate_up has 256 rows.
  EXPECT_EQ(t->PlaneTileRows(kHidden), 128);
  EXPECT_EQ(t->LutTileRows(4), 256);
  EXPECT_EQ(t->PagesAt(g, 4), 4 * 2 + 1);
  EXPECT_EQ(t->PagesAt(g, 8), 8 * 2 + 16);

  auto fills = t->Begin(g, 4);
  ASSERT_TRUE(fills.ok()) << fills.status().ToString();
  ASSERT_EQ(fills->size(), 5u);  // planes 0..3 and LUT_4
  EXPECT_EQ((*fills)[4].lut_bits, 4);
  EXPECT_EQ(t->entry(g).planes[0].state, PartState::kLoading);
  EXPECT_EQ(t->entry(g).committed, 0);  // readers still see the old width
  ASSERT_TRUE(t->Commit(g).ok());
  EXPECT_EQ(t->entry(g).committed, 4);
  EXPECT_EQ(t->entry(g).planes[3].state, PartState::kResident);
  EXPECT_EQ(pool->Count(Tenant::kWeights), 9);

  // Raise 4 -> 8: planes 4..7 and LUT_8 are new; LUT_4 goes at the commit.
  fills = t->Begin(g, 8);
  ASSERT_TRUE(fills.ok());
  EXPECT_EQ(fills->size(), 5u);
  EXPECT_EQ(pool->Count(Tenant::kWeights), 9 + 4 * 2 + 16);
  ASSERT_TRUE(t->Commit(g).ok());
  EXPECT_EQ(pool->Count(Tenant::kWeights), t->PagesAt(g, 8));

  // Lower 8 -> 3: only LUT_3 is fetched; planes 3..7 and LUT_8 are free at the commit.
  fills = t->Begin(g, 3);
  ASSERT_TRUE(fills.ok());
  ASSERT_EQ(fills->size(), 1u);
  ASSERT_TRUE(t->Commit(g).ok());
  EXPECT_EQ(pool->Count(Tenant::kWeights), t->PagesAt(g, 3));
  EXPECT_EQ(t->entry(g).planes[3].state, PartState::kAbsent);

  // Lower to 0: nothing to fetch, everything back.
  fills = t->Begin(g, 0);
  ASSERT_TRUE(fills.ok());
  EXPECT_TRUE(fills->empty());
  ASSERT_TRUE(t->Commit(g).ok());
  EXPECT_EQ(pool->Count(Tenant::kWeights), 0);
  EXPECT_TRUE(pool->Balanced());
}

TEST(WeightPageTable, RaiseNeverTakesPagesInUse) {
  auto pool = PagePool::Create(4096, 20).value();
  auto t = WeightPageTable::Create(pool.get(), 1, 2, kHidden, kFfn).value();
  auto kv = pool->Allocate(15, Tenant::kKv).value();  // running requests' KV
  const size_t g = t->Index(0, 0, ExpertProj::kGateUp);
  auto fills = t->Begin(g, 4);  // needs 9 pages, 5 free
  EXPECT_EQ(fills.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->Count(Tenant::kKv), 15);
  EXPECT_EQ(t->entry(g).target, -1);
  EXPECT_EQ(t->pages_held(), 0);
  ASSERT_TRUE(pool->Free(kv, Tenant::kKv).ok());
  EXPECT_TRUE(t->Begin(g, 4).ok());
}

TEST(WeightPageTable, AbortKeepsTheOldWidthAndFreesThePages) {
  auto pool = PagePool::Create(4096, 200).value();
  auto t = WeightPageTable::Create(pool.get(), 1, 2, kHidden, kFfn).value();
  const size_t d = t->Index(0, 1, ExpertProj::kDown);
  ASSERT_TRUE(t->Begin(d, 3).ok());
  ASSERT_TRUE(t->Commit(d).ok());
  const int held = pool->Count(Tenant::kWeights);
  ASSERT_TRUE(t->Begin(d, 6).ok());
  EXPECT_GT(pool->Count(Tenant::kWeights), held);
  ASSERT_TRUE(t->Abort(d).ok());
  EXPECT_EQ(t->entry(d).committed, 3);
  EXPECT_EQ(t->entry(d).lut.state, PartState::kResident);
  EXPECT_EQ(pool->Count(Tenant::kWeights), held);
  EXPECT_FALSE(t->Commit(d).ok());  // nothing in flight
}

TEST(WeightPageTable, RefusesBadWidthsAndChangesDuringAStep) {
  auto pool = PagePool::Create(4096, 200).value();
  auto t = WeightPageTable::Create(pool.get(), 1, 2, kHidden, kFfn).value();
  EXPECT_FALSE(t->Begin(0, 2).ok());
  EXPECT_FALSE(t->Begin(0, 9).ok());
  EXPECT_FALSE(t->Begin(0, 0).ok());   // already at 0
  EXPECT_FALSE(t->Begin(99, 4).ok());  // no such block
  ASSERT_TRUE(t->Begin(0, 4).ok());
  EXPECT_FALSE(t->Begin(0, 5).ok());   // one change at a time
  t->BeginStep();
  EXPECT_EQ(t->Commit(0).code(), StatusCode::kInternal);
  t->EndStep();
  EXPECT_TRUE(t->Commit(0).ok());
  EXPECT_FALSE(WeightPageTable::Create(PagePool::Create(128, 4).value().get(), 1, 1, 128, 128).ok());
}

TEST(WeightPageTable, AFetchRaisesABlockFromZeroDuringAStep) {
  auto pool = PagePool::Create(4096, 200).value();
  auto t = WeightPageTable::Create(pool.get(), 1, 2, kHidden, kFfn).value();
  t->BeginStep();
  EXPECT_EQ(t->Begin(0, 4).status().code(), StatusCode::kInternal);  // the ordinary path waits
  auto fills = t->FetchBegin(0, 4);
  ASSERT_TRUE(fills.ok()) << fills.status().ToString();
  EXPECT_EQ(fills->size(), 5u);
  EXPECT_EQ(t->Commit(0).code(), StatusCode::kInternal);
  ASSERT_TRUE(t->FetchCommit(0).ok());
  EXPECT_EQ(t->entry(0).committed, 4);
  EXPECT_EQ(pool->Count(Tenant::kWeights), t->PagesAt(0, 4));
  // Only raises from 0: not a block that is resident, not to 0 or a bad width.
  EXPECT_FALSE(t->FetchBegin(0, 6).ok());
  EXPECT_FALSE(t->FetchBegin(1, 0).ok());
  EXPECT_FALSE(t->FetchBegin(1, 9).ok());
  EXPECT_FALSE(t->FetchBegin(7, 4).ok());
  EXPECT_FALSE(t->FetchCommit(1).ok());  // nothing in flight
  ASSERT_TRUE(t->FetchBegin(1, 3).ok());
  ASSERT_TRUE(t->FetchAbort(1).ok());  // a failed fetch: the pages go back
  EXPECT_EQ(t->entry(1).committed, 0);
  EXPECT_EQ(pool->Count(Tenant::kWeights), t->PagesAt(0, 4));
  t->EndStep();
  // A lowering is never a fetch, even between steps.
  ASSERT_TRUE(t->Begin(0, 0).ok());
  EXPECT_FALSE(t->FetchCommit(0).ok());
  ASSERT_TRUE(t->Commit(0).ok());
  EXPECT_EQ(pool->Count(Tenant::kWeights), 0);
  EXPECT_TRUE(pool->Balanced());
}

TEST(WeightPageTable, RandomTransitionsBalanceToThePage) {
  auto pool = PagePool::Create(4096, 400).value();
  auto t = WeightPageTable::Create(pool.get(), 2, 8, kHidden, kFfn).value();
  std::mt19937 rng(3);
  const int widths[] = {0, 3, 4, 5, 6, 7, 8};
  for (int it = 0; it < 5000; ++it) {
    const size_t i = rng() % static_cast<size_t>(t->num_blocks());
    if (t->entry(i).target >= 0) {
      ASSERT_TRUE((rng() % 3 == 0 ? t->Abort(i) : t->Commit(i)).ok());
      continue;
    }
    const int w = widths[rng() % 7];
    if (w == t->entry(i).committed) continue;
    auto f = t->Begin(i, w);
    ASSERT_TRUE(f.ok() || f.status().code() == StatusCode::kResourceExhausted);
    int expect = 0;
    for (int k = 0; k < t->num_blocks(); ++k) {
      const auto& e = t->entry(static_cast<size_t>(k));
      for (const auto& p : e.planes) expect += static_cast<int>(p.pages.size());
      expect += static_cast<int>(e.lut.pages.size() + e.next_lut.pages.size());
    }
    ASSERT_EQ(expect, pool->Count(Tenant::kWeights));
    ASSERT_EQ(t->pages_held(), pool->Count(Tenant::kWeights));
  }
  EXPECT_TRUE(pool->Balanced());
}

}  // namespace
}  // namespace pw::memory
