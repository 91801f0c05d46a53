// KvDemand with sliding-window layers (kv_demand.h): those layers count a request's growth only
// up to the blocks its window spans (window / block_size + 2), the full layers the whole growth;
// a waiting reservation's prompt counts whole on every layer (leased before any release).
#include <gtest/gtest.h>

#include "services/workers/decode/kv_demand.h"

namespace pw::workers {
namespace {

TEST(KvDemandWindow, SlidingLayersCountGrowthUpToTheWindowOnly) {
  // 16 tokens a block, 4 layers of which 2 slide over 32 tokens (cap 32 / 16 + 2 = 4 blocks).
  KvDemand d(16, 4, 1024);
  d.SetSlidingLayers(2, 32);
  // 20 tokens now (2 blocks), 500 at the end (32 blocks): full layers 30 + 1 blocks, sliding
  // layers from 2 to the cap of 4.
  d.AddRunning(20, 500, true);
  EXPECT_EQ(d.running_blocks(), 31);
  EXPECT_EQ(d.pages(), 31 * 2 + 2 * 2);
  // Already past the window (300 tokens, 19 blocks): nothing more on the sliding layers.
  d.AddRunning(300, 500, true);
  EXPECT_EQ(d.pages(), (31 + 14) * 2 + 2 * 2);
  // Preempted: holds nothing, needs the whole cap again on the sliding layers.
  d.AddRunning(20, 500, false);
  EXPECT_EQ(d.pages(), (31 + 14 + 33) * 2 + (2 + 4) * 2);
  EXPECT_EQ(d.reserve_pages(), d.pages());
  // A lease of 2 blocks for 40 tokens more: 5 blocks at the end, 3 + 1 more on full layers,
  // 4 - 2 on sliding ones.
  d.AddLease(2, 40);
  EXPECT_EQ(d.pages(), (31 + 14 + 33 + 4) * 2 + (2 + 4 + 2) * 2);
  // Waiting: 100 prompt tokens (7 blocks, leased whole) + 1 + 400 = 32 blocks.
  const int64_t before = d.pages();
  d.AddWaiting(100, 400);
  EXPECT_EQ(d.pages() - before, 32 * 2 + 7 * 2);
  EXPECT_EQ(d.reserve_pages(), before);

  // Without sliding layers every layer counts the whole growth, as before.
  KvDemand all(16, 4, 1024);
  all.AddRunning(20, 500, true);
  EXPECT_EQ(all.pages(), 31 * 4);
}

}  // namespace
}  // namespace pw::workers
