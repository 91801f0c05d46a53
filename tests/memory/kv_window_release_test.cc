// Sliding-window KV layers (memory/kv_spec.h): a block's pages of those layers go back to the
// page pool when the block falls behind the window (KvBlockPool::ReleaseWindowPages), its other
// pages stay until Free, and nothing is freed twice or leaked.
#include <gtest/gtest.h>

#include <vector>

#include "memory/kv_blocks.h"
#include "memory/kv_spec.h"
#include "memory/page_pool.h"

namespace pw::memory {
namespace {

KvLayout Layout() {
  KvLayout l;
  l.num_layers = 3;
  l.num_kv_heads = 2;
  l.head_dim = 8;
  l.block_size = 4;
  l.dtype = KvDtype::kF32;
  return l;
}

// Layers 0 and 2 slide (gpt_oss's alternation), layer 1 attends to everything.
std::vector<KvLayerSpec> Specs() {
  std::vector<KvLayerSpec> s(3);
  s[0] = {.kind = KvKind::kSlidingWindow, .window = 8};
  s[2] = {.kind = KvKind::kSlidingWindow, .window = 8};
  return s;
}

TEST(KvWindowRelease, SlidingLayersPagesGoBackAndTheRestStayUntilFree) {
  auto pages = PagePool::Create(Layout().min_page_bytes(), 30).value();
  auto pool = KvBlockPool::CreateOn(Layout(), pages.get(), 10, Specs());
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  KvBlockPool& p = **pool;
  EXPECT_EQ(p.pages_per_block(), 3);
  auto ids = p.Allocate(4);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(pages->num_free(), 30 - 12);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(p.LayerPagesInUse(l), 4);

  ASSERT_TRUE(p.ReleaseWindowPages((*ids)[0]).ok());
  ASSERT_TRUE(p.ReleaseWindowPages((*ids)[1]).ok());
  ASSERT_TRUE(p.ReleaseWindowPages((*ids)[1]).ok());  // twice: nothing more
  EXPECT_EQ(pages->num_free(), 30 - 12 + 4);
  EXPECT_EQ(p.LayerPagesInUse(0), 2);
  EXPECT_EQ(p.LayerPagesInUse(1), 4);
  EXPECT_EQ(p.LayerPagesInUse(2), 2);
  // The full-attention layer of a released block is still there; its sliding pages are not.
  EXPECT_NE(p.LayerView(1).pages[(*ids)[0] * 3], nullptr);
  EXPECT_EQ(p.LayerView(0).pages[(*ids)[0] * 3], nullptr);
  EXPECT_EQ(p.LayerPage((*ids)[0], 1), pages->Page(p.PageOf((*ids)[0], 1)));

  // The released pages serve new blocks.
  auto more = p.Allocate(5);
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  EXPECT_EQ(pages->num_free(), 30 - 12 + 4 - 15);

  ASSERT_TRUE(p.Free(*ids).ok());
  ASSERT_TRUE(p.Free(*more).ok());
  EXPECT_EQ(pages->num_free(), 30);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(p.LayerPagesInUse(l), 0);
  EXPECT_TRUE(pages->Balanced());

  EXPECT_EQ(p.ReleaseWindowPages((*ids)[0]).code(), StatusCode::kInvalidArgument);
}

// A pool destroyed with released blocks still allocated gives back exactly the pages they hold.
TEST(KvWindowRelease, DestroyingThePoolReturnsOnlyThePagesStillHeld) {
  auto pages = PagePool::Create(Layout().min_page_bytes(), 12).value();
  {
    auto pool = KvBlockPool::CreateOn(Layout(), pages.get(), 4, Specs());
    ASSERT_TRUE(pool.ok());
    auto ids = (*pool)->Allocate(3);
    ASSERT_TRUE(ids.ok());
    ASSERT_TRUE((*pool)->ReleaseWindowPages((*ids)[2]).ok());
  }
  EXPECT_EQ(pages->num_free(), 12);
  EXPECT_TRUE(pages->Balanced());
}

TEST(KvWindowRelease, AWindowBelowOneIsRefused) {
  std::vector<KvLayerSpec> s = Specs();
  s[2].window = 0;
  auto pool = KvBlockPool::Create(Layout(), 4, s);
  ASSERT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("layer 2"), std::string::npos);
}

// A recurrent-state layer takes several pages in every block (its state over pages of the
// pool's size): what it holds is counted in pages, as the decode worker's
// pagedweight_kv_pages{kind="recurrent_state"} reports it (it counted one per block before).
TEST(KvWindowRelease, PagesInUseCountEveryPageOfARecurrentState) {
  std::vector<KvLayerSpec> specs(3);
  specs[0] = {.kind = KvKind::kRecurrentState, .state_bytes = 2 * Layout().min_page_bytes() + 1};
  specs[1] = {.kind = KvKind::kSlidingWindow, .window = 8};
  auto pages = PagePool::Create(Layout().min_page_bytes(), 60).value();
  auto pool = KvBlockPool::CreateOn(Layout(), pages.get(), 10, specs);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  KvBlockPool& p = **pool;
  ASSERT_EQ(p.LayerPages(0), 3);
  EXPECT_EQ(p.pages_per_block(), 5);
  auto ids = p.Allocate(4);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(p.LayerPagesInUse(0), 12);
  EXPECT_EQ(p.LayerPagesInUse(1), 4);
  EXPECT_EQ(p.LayerPagesInUse(2), 4);
  ASSERT_TRUE(p.ReleaseWindowPages((*ids)[0]).ok());
  EXPECT_EQ(p.LayerPagesInUse(0), 12);
  EXPECT_EQ(p.LayerPagesInUse(1), 3);
  int held = 0;
  for (int l = 0; l < 3; ++l) held += p.LayerPagesInUse(l);
  EXPECT_EQ(held, pages->Count(Tenant::kKv));
  ASSERT_TRUE(p.Free(*ids).ok());
  for (int l = 0; l < 3; ++l) EXPECT_EQ(p.LayerPagesInUse(l), 0);
}

}  // namespace
}  // namespace pw::memory
