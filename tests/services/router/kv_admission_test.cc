// KvAdmission (services/router/kv_admission.h): the arithmetic of admission by decode KV.
#include "services/router/kv_admission.h"

#include <gtest/gtest.h>

namespace pw::router {
namespace {

using Verdict = KvAdmission::Verdict;

TEST(KvAdmission, BlocksForCountsThePromptAndEveryTokenItMayGenerate) {
  EXPECT_EQ(KvAdmission::BlocksFor(400, 1500, 16), 119);   // 1900 tokens
  EXPECT_EQ(KvAdmission::BlocksFor(2040, 1, 16), 128);     // 2041 tokens: one more block
  EXPECT_EQ(KvAdmission::BlocksFor(16, 16, 16), 2);        // exactly two blocks
  EXPECT_EQ(KvAdmission::BlocksFor(1, 0, 16), 1);
  EXPECT_EQ(KvAdmission::BlocksFor(5, -3, 4), 2);          // no negative growth
  EXPECT_EQ(KvAdmission::BlocksFor(400, 1500, 0), 0);      // block size not known
}

TEST(KvAdmission, ArrivalsQueueWhileTheQueueHoldsLessThanItsBound) {
  KvAdmission kv(1.0);
  kv.SetPool(/*capacity=*/1000, /*largest=*/1000);
  EXPECT_EQ(kv.queue_bound(), 1000);
  // An empty queue takes a call bigger than the bound (each candidate fits a worker).
  EXPECT_EQ(kv.Arrive(16, 119), Verdict::kQueue);  // 1904 blocks
  kv.Queue(16 * 119);
  EXPECT_EQ(kv.Arrive(1, 1), Verdict::kBusy);
  kv.Unqueue(16 * 119);
  kv.Queue(600);
  EXPECT_EQ(kv.Arrive(4, 100), Verdict::kQueue);   // 1000: at the bound
  EXPECT_EQ(kv.Arrive(4, 101), Verdict::kBusy);    // 1004: past it
  EXPECT_EQ(kv.Arrive(1, 401), Verdict::kBusy);
  // A sequence bigger than any one worker can hold never runs, however empty the queue.
  KvAdmission empty(1.0);
  empty.SetPool(1000, 600);
  EXPECT_EQ(empty.Arrive(1, 601), Verdict::kTooLarge);
  EXPECT_EQ(empty.Arrive(1, 600), Verdict::kQueue);
}

TEST(KvAdmission, QueueFactorScalesTheBound) {
  KvAdmission kv(2.5);
  kv.SetPool(400, 200);
  EXPECT_EQ(kv.queue_bound(), 1000);
  kv.Queue(1);
  EXPECT_EQ(kv.Arrive(9, 111), Verdict::kQueue);   // 1 + 999
  EXPECT_EQ(kv.Arrive(10, 100), Verdict::kBusy);   // 1 + 1000
}

TEST(KvAdmission, CandidatesStartWhileTheirKvFitsBesideWhatIsCommitted) {
  KvAdmission kv(1.0);
  kv.SetPool(300, 300);
  ASSERT_TRUE(kv.CanStart(119));
  kv.Start(119);
  ASSERT_TRUE(kv.CanStart(119));
  kv.Start(119);
  EXPECT_EQ(kv.committed(), 238);
  EXPECT_FALSE(kv.CanStart(119));  // 357 > 300
  EXPECT_TRUE(kv.CanStart(62));    // 300: fits exactly
  kv.End(119);
  EXPECT_TRUE(kv.CanStart(119));
  // The pool shrank below a candidate already admitted (a worker left): with nothing
  // committed it starts alone rather than block the queue for good.
  kv.End(119);
  kv.SetPool(100, 100);
  EXPECT_EQ(kv.committed(), 0);
  EXPECT_TRUE(kv.CanStart(119));
}

TEST(KvAdmission, WithoutACapacityEverythingQueuesAndStarts) {
  // No decode worker reports KV (none live, or an older one): admission by count only.
  KvAdmission kv(1.0);
  kv.Queue(5000);
  EXPECT_EQ(kv.Arrive(16, 128), Verdict::kQueue);
  kv.Start(5000);
  EXPECT_TRUE(kv.CanStart(5000));
  // Blocks not known (block size 0): the call is not counted against the pool.
  kv.SetPool(100, 100);
  EXPECT_EQ(kv.Arrive(16, 0), Verdict::kQueue);
}

}  // namespace
}  // namespace pw::router
