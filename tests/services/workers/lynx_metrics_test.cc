// pagedweight_lynx_* counters follow the routing hook's running sums step by step.
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "services/workers/metrics/lynx_metrics.h"

namespace pw::workers {
namespace {

TEST(LynxMetrics, ExportAddsWhatTheHookGained) {
  prometheus::Registry registry;
  auto m = LynxMetrics::Register(registry, "decode-0");
  engine::LynxHookStats s;
  s.applied_calls = 4;
  s.distinct_before = 80;
  s.distinct_after = 60;
  s.tokens = 128;
  s.tokens_changed = 40;
  s.pairs_replaced = 50;
  s.seconds = 0.5;
  m->Export(s);
  s.applied_calls = 6;
  s.distinct_before = 120;
  s.distinct_after = 85;
  s.tokens = 192;
  s.tokens_changed = 55;
  s.pairs_replaced = 70;
  s.seconds = 0.75;
  m->Export(s);
  EXPECT_DOUBLE_EQ(m->layer_calls->Value(), 6);
  EXPECT_DOUBLE_EQ(m->distinct_before->Value(), 120);
  EXPECT_DOUBLE_EQ(m->distinct_after->Value(), 85);
  EXPECT_DOUBLE_EQ(m->tokens_seen->Value(), 192);
  EXPECT_DOUBLE_EQ(m->tokens_changed->Value(), 55);
  EXPECT_DOUBLE_EQ(m->assignments_remapped->Value(), 70);
  EXPECT_DOUBLE_EQ(m->remap_seconds->Value(), 0.75);
  bool found = false;
  for (const auto& family : registry.Collect()) {
    if (family.name == "pagedweight_lynx_distinct_experts_total") found = family.metric.size() == 2;
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace pw::workers
