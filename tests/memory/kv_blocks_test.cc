#include "memory/kv_blocks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <tuple>

namespace pw::memory {
namespace {

KvLayout Layout() { return {.num_layers = 3, .num_kv_heads = 2, .head_dim = 8, .block_size = 4}; }

TEST(KvBlockPool, LayoutIsTheDocumentedOne) {
  auto pool = KvBlockPool::Create(Layout(), 5);
  ASSERT_TRUE(pool.ok());
  auto& p = **pool;
  EXPECT_EQ(p.bytes_per_block(), size_t{3 * 2 * 2 * 4 * 8 * 4});
  // One page per (block, layer): [kv c][kv head h][slot s][head_dim d], fp32.
  EXPECT_EQ(p.pages().page_bytes(), size_t{2 * 2 * 4 * 8 * 4});
  EXPECT_EQ(p.pages().num_pages(), 5 * 3);
  auto b = p.Allocate(3);
  ASSERT_TRUE(b.ok());
  const int32_t blk = (*b)[2];
  for (int l = 0; l < 3; ++l) {
    const float* page = reinterpret_cast<const float*>(p.LayerPage(blk, l));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(page) % 64, 0u);
    EXPECT_EQ(p.Slab(blk, l, 0, 0), page);
    // element offset = ((c * kv_heads + h) * block_size + s) * head_dim + d
    EXPECT_EQ(p.Slab(blk, l, 1, 1), page + (1 * 2 + 1) * 4 * 8);
  }
  // Distinct pages for distinct (block, layer).
  std::set<PageId> pages;
  for (int32_t id : *b) {
    for (int l = 0; l < 3; ++l) pages.insert(p.PageOf(id, l));
  }
  EXPECT_EQ(pages.size(), 9u);
}

TEST(KvBlockPool, Bf16HalvesThePage) {
  KvLayout l = Layout();
  l.dtype = KvDtype::kBf16;
  auto pool = KvBlockPool::Create(l, 2);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->pages().page_bytes(), size_t{2 * 2 * 4 * 8 * 2});
  auto b = (*pool)->Allocate(1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*pool)->SlabBf16((*b)[0], 2, 1, 0),
            reinterpret_cast<uint16_t*>((*pool)->LayerPage((*b)[0], 2)) + 2 * 4 * 8);
  EXPECT_EQ(ParseKvDtype("bf16").value(), KvDtype::kBf16);
  EXPECT_FALSE(ParseKvDtype("fp16").ok());
}

// On a shared page pool KV takes pages as tenant kKv; what another tenant holds is not free
// for KV, and what it gives back is usable by KV at once.
TEST(KvBlockPool, SharesAPagePoolWithAnotherTenant) {
  auto pages = PagePool::Create(512, 30).value();
  auto pool = KvBlockPool::CreateOn(Layout(), pages.get(), 100);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  auto& p = **pool;
  EXPECT_EQ(p.num_free(), 10);  // 30 pages / 3 layers
  auto weights = pages->Allocate(12, Tenant::kWeights).value();
  EXPECT_EQ(p.num_free(), 6);
  auto kv = p.Allocate(6);
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(pages->Count(Tenant::kKv), 18);
  EXPECT_EQ(p.Allocate(1).status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(pages->Free(std::span<const PageId>(weights).first(3), Tenant::kWeights).ok());
  EXPECT_TRUE(p.Allocate(1).ok());
  ASSERT_TRUE(p.Free(*kv).ok());
  EXPECT_TRUE(pages->Balanced());
  // Pages too small for one layer of a block.
  auto tiny = PagePool::Create(64, 4).value();
  EXPECT_FALSE(KvBlockPool::CreateOn(Layout(), tiny.get(), 4).ok());
}

TEST(KvBlockPool, AllocateFreeExhaustion) {
  auto pool = KvBlockPool::Create(Layout(), 6);
  ASSERT_TRUE(pool.ok());
  auto& p = **pool;
  auto a = p.Allocate(4);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(p.num_free(), 2);
  std::set<int32_t> distinct(a->begin(), a->end());
  EXPECT_EQ(distinct.size(), 4u);
  auto b = p.Allocate(3);
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(p.num_free(), 2);  // all or nothing
  for (int32_t id : *a) EXPECT_TRUE(p.IsAllocated(id));
  ASSERT_TRUE(p.Free(std::vector<int32_t>{(*a)[0], (*a)[1]}).ok());
  EXPECT_EQ(p.num_free(), 4);
  // Double free, repeated id, out of range: refused, nothing freed.
  EXPECT_EQ(p.Free(std::vector<int32_t>{(*a)[0]}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Free(std::vector<int32_t>{(*a)[2], (*a)[2]}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Free(std::vector<int32_t>{(*a)[3], 99}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Free(std::vector<int32_t>{-1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.num_free(), 4);
  ASSERT_TRUE(p.Free(std::vector<int32_t>{(*a)[2], (*a)[3]}).ok());
  EXPECT_EQ(p.num_free(), 6);
  EXPECT_FALSE(p.IsAllocated(99));
}

TEST(KvBlockPool, BadSizesAreInvalidArgument) {
  EXPECT_EQ(KvBlockPool::Create(Layout(), 0).status().code(), StatusCode::kInvalidArgument);
  KvLayout l = Layout();
  l.block_size = 0;
  EXPECT_EQ(KvBlockPool::Create(l, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BlocksForTokens(0, 4), 0);
  EXPECT_EQ(BlocksForTokens(1, 4), 1);
  EXPECT_EQ(BlocksForTokens(8, 4), 2);
  EXPECT_EQ(BlocksForTokens(9, 4), 3);
}

// The page layout follows the per-layer specs: a block takes the sum of its layers' pages and
// each layer's view strides over a block's pages. Full attention, sliding window
// (kv_window_release_test.cc), latent (below) and recurrent state are served; a spec list that
// does not match the layers, or a kind's impossible size, is refused.
TEST(KvBlockPool, LayerSpecsDecideThePages) {
  const KvLayout l = Layout();
  auto pool = KvBlockPool::Create(l, 4, std::vector<KvLayerSpec>(3));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ((*pool)->pages_per_block(), 3);
  EXPECT_EQ((*pool)->specs(), FullAttentionSpecs(l));
  auto b = (*pool)->Allocate(2);
  ASSERT_TRUE(b.ok());
  for (int layer = 0; layer < 3; ++layer) {
    const cpu::PagedKvView v = (*pool)->LayerView(layer);
    EXPECT_EQ(v.page_stride, 3u);
    for (int32_t id : *b) EXPECT_EQ(v.pages[id * 3], (*pool)->LayerPage(id, layer));
  }
  EXPECT_EQ(PagesPerBlock(KvLayerSpec{}, l, l.min_page_bytes(), 0).value(), 1);
  EXPECT_EQ(PagesPerBlock(KvLayerSpec{}, l, l.bytes_per_layer() - 1, 0).status().code(),
            StatusCode::kInvalidArgument);

  auto pages = PagePool::Create(l.min_page_bytes(), 30).value();
  EXPECT_EQ(KvBlockPool::Create(l, 4, std::vector<KvLayerSpec>(2)).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<KvLayerSpec> empty_state(3);
  empty_state[1] = {.kind = KvKind::kRecurrentState, .state_bytes = 0};
  auto none = KvBlockPool::Create(l, 4, empty_state);
  ASSERT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("KV layer 1"), std::string::npos);
  EXPECT_TRUE(pages->Balanced());
}

// A latent layer (MLA) keeps one row of latent_dim values per position, [slot][latent_dim] in
// one page per block: an own pool's pages are as large as its largest per-token layer (here the
// latent's block_size * latent_dim fp32 values, larger than a full-attention layer's), the
// latent view strides over a block's pages, and a row written through the page reads back
// through the view. A borrowed pool whose pages cannot hold a latent block is refused
// naming the layer; a latent of no values too.
TEST(KvBlockPool, LatentLayersKeepOneRowPerPositionInTheirOwnPage) {
  const KvLayout l = Layout();  // full attention: 2 * 2 heads * 4 slots * 8 dims * 4 = 512 bytes
  std::vector<KvLayerSpec> specs(3);
  specs[0] = {.kind = KvKind::kLatent, .latent_dim = 40};
  specs[2] = {.kind = KvKind::kLatent, .latent_dim = 40};
  EXPECT_EQ(LayerBlockBytes(specs[0], l), size_t{4 * 40 * 4});
  EXPECT_EQ(MinPageBytes(l, specs), size_t{640});
  auto pool = KvBlockPool::Create(l, 4, specs);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  KvBlockPool& p = **pool;
  EXPECT_EQ(p.pages().page_bytes(), size_t{640});
  EXPECT_EQ(p.pages_per_block(), 3);
  EXPECT_EQ(p.bytes_per_block(), size_t{640 + 512 + 640});
  // Only latent layers: pages of exactly the latent block (bf16: 4 * 40 * 2 = 320 bytes).
  KvLayout lb = l;
  lb.dtype = KvDtype::kBf16;
  std::vector<KvLayerSpec> all(3, KvLayerSpec{.kind = KvKind::kLatent, .latent_dim = 40});
  EXPECT_EQ(KvBlockPool::Create(lb, 2, all).value()->pages().page_bytes(), size_t{320});

  auto b = p.Allocate(2);
  ASSERT_TRUE(b.ok());
  const cpu::LatentKvView v = p.LatentView(2, 8);
  EXPECT_EQ(v.page_stride, 3u);
  EXPECT_EQ(v.latent_dim, 40);
  EXPECT_EQ(v.rope_dim, 8);
  EXPECT_EQ(v.block_size, 4);
  const int32_t b1 = (*b)[1];
  EXPECT_EQ(v.pages[b1 * 3], p.LayerPage(b1, 2));
  float* page = reinterpret_cast<float*>(p.LayerPage(b1, 2));
  for (int i = 0; i < 4 * 40; ++i) page[i] = static_cast<float>(i);
  // Slot 2, value 5 of the block, as the kernel addresses it (kernels/cpu/latent_attention.h).
  const float* rows = reinterpret_cast<const float*>(v.pages[b1 * v.page_stride]);
  EXPECT_EQ(rows[2 * v.latent_dim + 5], 85.f);

  auto small = PagePool::Create(512, 12).value();
  auto refused = KvBlockPool::CreateOn(l, small.get(), 4, specs);
  ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("layer 0, latent"), std::string::npos)
      << refused.status().ToString();
  std::vector<KvLayerSpec> empty(3);
  empty[1] = {.kind = KvKind::kLatent, .latent_dim = 0};
  EXPECT_EQ(KvBlockPool::Create(l, 4, empty).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(p.Free(*b).ok());
}

// An attention layer of its own kv heads and head size (gemma4's full layers: global_head_dim,
// num_global_key_value_heads) lays its page out with them: its slabs, its view and its bytes;
// the pages hold the widest layer, narrower or wider than the layout's. ModelKvSpecs gives a
// layer its own shape only where it differs from the model's.
TEST(KvBlockPool, AttentionLayersOfTheirOwnShape) {
  const KvLayout l = Layout();  // 2 kv heads x 8 dims: 2 * 2 * 4 * 8 * 4 = 512 bytes a layer
  for (const auto& [heads, dim, page] : std::vector<std::tuple<int, int, size_t>>{
           {1, 16, 512},  // another shape of as many values as the layout's 2 x 8
           {1, 8, 512},   // narrower (Gemma-4-26B-A4B's full layers: 2 x 512 beside 8 x 256)
           {3, 16, 2 * 3 * 4 * 16 * 4}}) {  // wider: pages of this one
    SCOPED_TRACE(std::to_string(heads) + " x " + std::to_string(dim));
    std::vector<KvLayerSpec> specs(3);
    specs[0] = {.kind = KvKind::kSlidingWindow, .window = 8};
    specs[1] = {.num_kv_heads = heads, .head_dim = dim};
    const size_t own = size_t{2} * heads * 4 * dim * 4;
    EXPECT_EQ(LayerBlockBytes(specs[1], l), own);
    EXPECT_EQ(LayerBlockBytes(specs[0], l), size_t{512});
    EXPECT_EQ(LayerKvHeads(specs[1], l), heads);
    EXPECT_EQ(LayerHeadDim(specs[1], l), dim);
    EXPECT_EQ(LayerKvHeads(specs[2], l), 2);
    EXPECT_EQ(LayerHeadDim(specs[2], l), 8);
    EXPECT_EQ(MinPageBytes(l, specs), page);
    auto pool = KvBlockPool::Create(l, 3, specs);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    KvBlockPool& p = **pool;
    EXPECT_EQ(p.pages().page_bytes(), page);
    EXPECT_EQ(p.pages_per_block(), 3);
    EXPECT_EQ(p.bytes_per_block(), 512 + own + 512);
    auto b = p.Allocate(2);
    ASSERT_TRUE(b.ok());
    const int32_t blk = (*b)[1];
    const float* page1 = reinterpret_cast<const float*>(p.LayerPage(blk, 1));
    // element offset = ((c * kv_heads + h) * block_size + s) * head_dim + d, the layer's own.
    EXPECT_EQ(p.Slab(blk, 1, 1, heads - 1), page1 + (1 * heads + heads - 1) * 4 * dim);
    const float* page2 = reinterpret_cast<const float*>(p.LayerPage(blk, 2));
    EXPECT_EQ(p.Slab(blk, 2, 1, 1), page2 + (1 * 2 + 1) * 4 * 8);
    const cpu::PagedKvView v1 = p.LayerView(1), v2 = p.LayerView(2);
    EXPECT_EQ(v1.num_kv_heads, heads);
    EXPECT_EQ(v1.head_dim, dim);
    EXPECT_EQ(v2.num_kv_heads, 2);
    EXPECT_EQ(v2.head_dim, 8);
    ASSERT_TRUE(p.Free(*b).ok());
  }
  // Only attention layers take a shape of their own, of sizes >= 0.
  std::vector<KvLayerSpec> bad(3);
  bad[2] = {.kind = KvKind::kLatent, .latent_dim = 40, .num_kv_heads = 1};
  EXPECT_EQ(KvBlockPool::Create(l, 2, bad).status().code(), StatusCode::kInvalidArgument);
  bad[2] = {.head_dim = -8};
  EXPECT_EQ(KvBlockPool::Create(l, 2, bad).status().code(), StatusCode::kInvalidArgument);

  ModelConfig c;
  c.type = ModelType::kGemma4;
  c.num_layers = 3;
  c.num_kv_heads = 4;
  c.head_dim = 16;
  c.sliding_window = 8;
  c.layer_sliding = {true, false, false};
  c.full_head_dim = 32;
  c.full_num_kv_heads = 1;
  const std::vector<KvLayerSpec> specs = ModelKvSpecs(c);
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0], (KvLayerSpec{.kind = KvKind::kSlidingWindow, .window = 8}));
  EXPECT_EQ(specs[1], (KvLayerSpec{.num_kv_heads = 1, .head_dim = 32}));
  EXPECT_EQ(specs[2], specs[1]);
  c.full_head_dim = 16;  // the full layers' shape is the model's: no own shape
  c.full_num_kv_heads = 4;
  EXPECT_EQ(ModelKvSpecs(c)[1], KvLayerSpec{});
}

// A recurrent-state layer (a hybrid's linear attention) takes ceil(state_bytes / page) pages of
// every block, so its bytes count in the pool; a block's state is written and read whole across
// those pages, in order, apart from other blocks' states and the attention layers' pages.
TEST(KvBlockPool, RecurrentStateSpansItsPagesAndCountsInThePool) {
  const KvLayout l = Layout();
  const size_t page = l.min_page_bytes();  // 512
  const size_t state = 2 * page + 276;     // 3 pages
  std::vector<KvLayerSpec> specs(3);
  specs[1] = {.kind = KvKind::kRecurrentState, .state_bytes = state};
  auto pages = PagePool::Create(page, 20).value();
  auto pool = KvBlockPool::CreateOn(l, pages.get(), 8, specs);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  KvBlockPool& p = **pool;
  EXPECT_EQ(PagesPerBlock(specs[1], l, page, 1).value(), 3);
  EXPECT_EQ(p.pages_per_block(), 5);
  EXPECT_EQ(p.LayerPages(0), 1);
  EXPECT_EQ(p.LayerPages(1), 3);
  EXPECT_EQ(p.LayerPages(2), 1);
  EXPECT_EQ(p.num_free(), 4);  // 20 pages / 5 per block, though 8 ids exist
  auto b = p.Allocate(2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pages->num_free(), 10);
  const int32_t b0 = (*b)[0], b1 = (*b)[1];
  std::memset(p.LayerPage(b0, 2), 0x5a, page);
  std::vector<uint8_t> s0(state), s1(state, 0xee), back(state);
  for (size_t i = 0; i < state; ++i) s0[i] = static_cast<uint8_t>(i * 7 + 1);
  p.WriteState(b0, 1, s0.data());
  p.WriteState(b1, 1, s1.data());
  p.ReadState(b0, 1, back.data());
  EXPECT_EQ(back, s0);
  for (int k = 0; k < 3; ++k) {
    const size_t n = std::min(page, state - k * page);
    EXPECT_EQ(std::memcmp(p.LayerPage(b0, 1, k), s0.data() + k * page, n), 0) << k;
  }
  p.ReadState(b1, 1, back.data());
  EXPECT_EQ(back, s1);
  for (size_t i = 0; i < page; ++i) ASSERT_EQ(p.LayerPage(b0, 2)[i], 0x5a);
  ASSERT_TRUE(p.Free(*b).ok());
  EXPECT_EQ(pages->num_free(), 20);
}

}  // namespace
}  // namespace pw::memory
