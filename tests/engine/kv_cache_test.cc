#include "services/engine/kv_cache.h"

#include <gtest/gtest.h>

#include <set>

namespace pw::engine {
namespace {

KvLayout Layout() { return {.num_layers = 3, .num_kv_heads = 2, .head_dim = 8, .block_size = 4}; }

TEST(KvBlockPool, LayoutIsTheDocumentedOne) {
  auto pool = KvBlockPool::Create(Layout(), 5);
  ASSERT_TRUE(pool.ok());
  auto& p = **pool;
  EXPECT_EQ(p.bytes_per_block(), size_t{3 * 2 * 2 * 4 * 8 * 4});
  EXPECT_EQ(p.total_bytes(), 5 * p.bytes_per_block());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.base()) % 64, 0u);
  EXPECT_EQ(p.BlockAddress(3), p.base() + 3 * p.bytes_per_block());
  // float offset = (((l * 2 + c) * kv_heads + h) * block_size + s) * head_dim + d
  const float* block2 = reinterpret_cast<const float*>(p.BlockAddress(2));
  EXPECT_EQ(p.Slab(2, 1, 1, 1), block2 + ((1 * 2 + 1) * 2 + 1) * 4 * 8);
  EXPECT_EQ(p.Slab(2, 0, 0, 0), block2);
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

}  // namespace
}  // namespace pw::engine
