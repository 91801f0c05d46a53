// BlockWriteQueue (quant/block_write_queue.h): writes run in push order on the queue's thread,
// the first failure stops the queue and is what Push and Drain report after it.
#include "quant/block_write_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace pw::anyprec {
namespace {

TEST(BlockWriteQueue, RunsWritesInPushOrderOffTheCallersThread) {
  std::vector<int> order;
  std::vector<std::thread::id> ran_on;
  {
    BlockWriteQueue q(2);
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE(q.Push([&order, &ran_on, i] {
        order.push_back(i);
        ran_on.push_back(std::this_thread::get_id());
        return Status::Ok();
      }).ok());
    }
    ASSERT_TRUE(q.Drain().ok());
    ASSERT_EQ(order.size(), 200u);
    for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
    for (const auto& id : ran_on) EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_GE(q.busy_seconds(), 0.0);
  }
}

TEST(BlockWriteQueue, TheFirstFailureStopsTheQueueAndIsReported) {
  BlockWriteQueue q(1);
  std::atomic<int> ran{0};
  ASSERT_TRUE(q.Push([&] { ++ran; return Status::Ok(); }).ok());
  ASSERT_TRUE(q.Push([&] { ++ran; return IoError("disk full"); }).ok());
  // Pushed before or after the failure runs: never run once the queue has failed.
  Status pushed = q.Push([&] { ++ran; return Status::Ok(); });
  const Status drained = q.Drain();
  EXPECT_EQ(drained.code(), StatusCode::kIoError);
  EXPECT_NE(drained.message().find("disk full"), std::string::npos);
  EXPECT_EQ(ran.load(), 2);
  if (!pushed.ok()) {
    EXPECT_EQ(pushed.code(), StatusCode::kIoError);
  }
  const Status later = q.Push([&] { ++ran; return Status::Ok(); });
  EXPECT_EQ(later.code(), StatusCode::kIoError);
  EXPECT_EQ(q.Drain().code(), StatusCode::kIoError);
  EXPECT_EQ(ran.load(), 2);
}

TEST(BlockWriteQueue, DestructionRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    BlockWriteQueue q(4);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(q.Push([&] { ++ran; return Status::Ok(); }).ok());
  }
  EXPECT_EQ(ran.load(), 4);
}

}  // namespace
}  // namespace pw::anyprec
