#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace pw::cpu {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnceWithAlignedPieces) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (size_t n : {0, 1, 7, 16, 100, 1001}) {
      for (size_t align : {1, 4, 16}) {
        for (size_t min_per : {1, 3}) {
          std::vector<std::atomic<int>> hits(n);
          std::atomic<int> calls{0};
          pool.ParallelFor(n, align, min_per, [&](size_t b, size_t e) {
            EXPECT_EQ(b % align, 0u);
            EXPECT_TRUE(e % align == 0 || e == n) << b << ".." << e;
            EXPECT_LE(e, n);
            if (e != n) {
              EXPECT_GE(e - b, min_per) << b << ".." << e;
            }
            for (size_t i = b; i < e; ++i) hits[i]++;
            calls++;
          });
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
          EXPECT_LE(calls.load(), static_cast<int>(ThreadPool::kChunksPerThread) * threads);
          if (threads == 1 || n < 2 * min_per) {
            EXPECT_LE(calls.load(), 1) << "not inline";
          }
        }
      }
    }
  }
}

// The first chunk to start holds its thread until every other chunk has run: only a pool whose
// other threads claim the rest (instead of a fixed share per thread) finishes.
TEST(ThreadPool, OtherThreadsRunTheChunksOfABusyOne) {
  ThreadPool pool(2);
  const size_t chunks = ThreadPool::kChunksPerThread * 2;
  std::atomic<int> started{0};
  std::atomic<size_t> others_done{0};
  std::atomic<bool> timed_out{false};
  pool.ParallelFor(chunks, 1, 1, [&](size_t b, size_t e) {
    if (started.fetch_add(1) == 0) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      EXPECT_EQ(e - b, 1u);  // chunks of one item: 2 threads x kChunksPerThread of them
      while (others_done.load() < chunks - 1) {
        if (std::chrono::steady_clock::now() > deadline) {
          timed_out = true;
          break;
        }
        std::this_thread::yield();
      }
      return;
    }
    others_done += e - b;
  });
  EXPECT_FALSE(timed_out.load());
  EXPECT_EQ(started.load(), static_cast<int>(chunks));
}

TEST(ThreadPool, NestedCallRunsInline) {
  ThreadPool pool(2);
  std::atomic<int> outer_calls{0};
  std::atomic<int> total{0};
  pool.ParallelFor(4, 1, 1, [&](size_t b, size_t e) {
    outer_calls++;
    pool.ParallelFor(10, 1, 1, [&](size_t b2, size_t e2) {
      EXPECT_EQ(b2, 0u);  // inline: one call with the whole range
      total += int(e2 - b2);
    });
  });
  EXPECT_GE(outer_calls.load(), 2);
  EXPECT_EQ(total.load(), 10 * outer_calls.load());
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
