#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace pw::cpu {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnceWithAlignedPieces) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (size_t n : {0, 1, 7, 16, 100, 1001}) {
      for (size_t align : {1, 4, 16}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> calls{0};
        pool.ParallelFor(n, align, 1, [&](size_t b, size_t e) {
          EXPECT_EQ(b % align, 0u);
          EXPECT_LE(e, n);
          for (size_t i = b; i < e; ++i) hits[i]++;
          calls++;
        });
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
        EXPECT_LE(calls.load(), threads);
      }
    }
  }
}

TEST(ThreadPool, NestedCallRunsInline) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.ParallelFor(4, 1, 1, [&](size_t b, size_t e) {
    pool.ParallelFor(10, 1, 1, [&](size_t b2, size_t e2) { total += int(e2 - b2); });
  });
  EXPECT_EQ(total.load(), 20);
}

TEST(ThreadPool, SmallWorkRunsInline) {
  ThreadPool pool(4);
  int calls = 0;
  pool.ParallelFor(10, 1, 100, [&](size_t b, size_t e) {
    EXPECT_EQ(b, 0u);
    EXPECT_EQ(e, 10u);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace pw::cpu
