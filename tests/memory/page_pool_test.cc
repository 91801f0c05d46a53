// PagePool: tenants share one set of pages; allocation is all or nothing; accounting balances
// to the page under concurrent use.
#include "memory/page_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

namespace pw::memory {
namespace {

TEST(PagePool, RejectsBadSizes) {
  EXPECT_FALSE(PagePool::Create(0, 4).ok());
  EXPECT_FALSE(PagePool::Create(100, 4).ok());  // not a multiple of 64
  EXPECT_FALSE(PagePool::Create(4096, 0).ok());
}

TEST(PagePool, TenantsShareThePagesAllOrNothing) {
  auto pool = PagePool::Create(256, 10).value();
  EXPECT_EQ(pool->total_bytes(), 2560u);
  auto kv = pool->Allocate(6, Tenant::kKv);
  ASSERT_TRUE(kv.ok());
  auto w = pool->Allocate(5, Tenant::kWeights);
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->num_free(), 4);  // nothing taken by the refused call
  w = pool->Allocate(4, Tenant::kWeights);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(pool->Count(Tenant::kKv), 6);
  EXPECT_EQ(pool->Count(Tenant::kWeights), 4);
  EXPECT_EQ(pool->Count(Tenant::kFree), 0);
  // Pages are distinct and their memory is disjoint.
  std::vector<int> seen(10, 0);
  for (PageId p : *kv) seen[p]++;
  for (PageId p : *w) seen[p]++;
  for (int s : seen) EXPECT_EQ(s, 1);
  EXPECT_EQ(pool->Page((*w)[0]) - pool->base(), static_cast<ptrdiff_t>(pool->Offset((*w)[0])));
  // Freed weight pages are usable by KV at once.
  ASSERT_TRUE(pool->Free(*w, Tenant::kWeights).ok());
  EXPECT_TRUE(pool->Allocate(4, Tenant::kKv).ok());
  EXPECT_TRUE(pool->Balanced());
}

TEST(PagePool, FreeChecksOwnershipAndRepeats) {
  auto pool = PagePool::Create(64, 4).value();
  auto kv = pool->Allocate(2, Tenant::kKv).value();
  EXPECT_FALSE(pool->Free(kv, Tenant::kWeights).ok());  // wrong tenant
  const std::vector<PageId> twice = {kv[0], kv[0]};
  EXPECT_FALSE(pool->Free(twice, Tenant::kKv).ok());
  const std::vector<PageId> out_of_range = {7};
  EXPECT_FALSE(pool->Free(out_of_range, Tenant::kKv).ok());
  EXPECT_EQ(pool->Count(Tenant::kKv), 2);  // nothing freed by the refused calls
  EXPECT_TRUE(pool->Free(kv, Tenant::kKv).ok());
  EXPECT_FALSE(pool->Free(kv, Tenant::kKv).ok());  // already free
  EXPECT_TRUE(pool->Balanced());
}

TEST(PagePool, ConcurrentTenantsBalanceToThePage) {
  auto pool = PagePool::Create(64, 512).value();
  auto worker = [&](Tenant t, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<std::vector<PageId>> held;
    for (int i = 0; i < 3000; ++i) {
      if (held.empty() || rng() % 2 == 0) {
        auto p = pool->Allocate(1 + static_cast<int>(rng() % 8), t);
        if (p.ok()) held.push_back(std::move(*p));
      } else {
        const size_t k = rng() % held.size();
        ASSERT_TRUE(pool->Free(held[k], t).ok());
        held.erase(held.begin() + static_cast<ptrdiff_t>(k));
      }
    }
    for (auto& h : held) ASSERT_TRUE(pool->Free(h, t).ok());
  };
  std::thread a(worker, Tenant::kKv, 1), b(worker, Tenant::kWeights, 2);
  a.join();
  b.join();
  EXPECT_EQ(pool->num_free(), 512);
  EXPECT_TRUE(pool->Balanced());
}

}  // namespace
}  // namespace pw::memory
