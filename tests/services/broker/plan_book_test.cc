// PlanBook's pending changes for a worker with a residency budget: its non-resident blocks
// (committed 0 by design) are pending only until it has been sent their desired width once;
// its resident blocks, and every block of a worker without a budget, while committed differs
// from desired.
#include <gtest/gtest.h>

#include "services/broker/plan_book.h"

namespace pw::broker {
namespace {

constexpr int kLayers = 2, kExperts = 4;

// Every block committed at 0 except expert 1 of layer 0 (both blocks) at `bits`.
std::vector<BlockWidth> OneResident(int bits) {
  std::vector<BlockWidth> out;
  for (int l = 0; l < kLayers; ++l) {
    for (int e = 0; e < kExperts; ++e) {
      for (ExpertProj p : {ExpertProj::kGateUp, ExpertProj::kDown}) {
        out.push_back({l, e, p, l == 0 && e == 1 ? bits : 0});
      }
    }
  }
  return out;
}

TEST(PlanBook, ABudgetedWorkerIsToldNonResidentWidthsOnce) {
  PlanBook book(kLayers, kExperts, 4, 3, 8);
  ASSERT_TRUE(book.Mirror("w", OneResident(4)).ok());
  book.Residency("w", 1);
  // Never told: every non-resident block is pending once; the resident one is done.
  auto pending = book.PendingFor("w");
  EXPECT_EQ(pending.size(), static_cast<size_t>(kLayers * kExperts * 2 - 2));
  book.Sent("w", pending);
  EXPECT_TRUE(book.PendingFor("w").empty());
  // A new width: every block once more, the resident ones until committed.
  ASSERT_TRUE(book.SetBits(5, -1, -1, -1).ok());
  pending = book.PendingFor("w");
  EXPECT_EQ(pending.size(), static_cast<size_t>(kLayers * kExperts * 2));
  book.Sent("w", pending);
  pending = book.PendingFor("w");
  ASSERT_EQ(pending.size(), 2u);
  EXPECT_EQ(pending[0].layer, 0);
  EXPECT_EQ(pending[0].expert, 1);
  EXPECT_EQ(pending[0].bits, 5);
  ASSERT_TRUE(book.Acked("w", book.epoch(), {{0, 1, ExpertProj::kGateUp, 5}, {0, 1, ExpertProj::kDown, 5}}, true).ok());
  EXPECT_TRUE(book.PendingFor("w").empty());
  // An eviction (committed back to 0) is not a change to make.
  ASSERT_TRUE(book.Acked("w", book.epoch(), {{0, 1, ExpertProj::kGateUp, 0}, {0, 1, ExpertProj::kDown, 0}}, true).ok());
  EXPECT_TRUE(book.PendingFor("w").empty());
  EXPECT_NE(book.Show(false, -1).find("residency budget 1 experts per layer"), std::string::npos);
  // A re-registration starts over: it is told again.
  ASSERT_TRUE(book.Mirror("w", OneResident(5)).ok());
  EXPECT_EQ(book.PendingFor("w").size(), static_cast<size_t>(kLayers * kExperts * 2 - 2));
}

TEST(PlanBook, AWorkerWithoutABudgetStaysPendingUntilCommitted) {
  PlanBook book(kLayers, kExperts, 4, 3, 8);
  ASSERT_TRUE(book.Mirror("w", OneResident(4)).ok());
  auto pending = book.PendingFor("w");
  EXPECT_EQ(pending.size(), static_cast<size_t>(kLayers * kExperts * 2 - 2));
  book.Sent("w", pending);
  EXPECT_EQ(book.PendingFor("w").size(), pending.size());  // resent until its acks say done
  // Telemetry without a budget keeps the rule; with one it changes.
  WorkerPool p;
  book.Telemetry("w", p);
  EXPECT_EQ(book.PendingFor("w").size(), pending.size());
  p.residency_capacity = 1;
  book.Telemetry("w", p);
  EXPECT_TRUE(book.PendingFor("w").empty());
}

}  // namespace
}  // namespace pw::broker
