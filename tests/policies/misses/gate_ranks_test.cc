// policies/misses/gate_ranks.h: mean gate weight by rank and the share reaching a threshold,
// on a trace built in memory with weights chosen here.
#include "policies/misses/gate_ranks.h"

#include <gtest/gtest.h>

namespace pw::misses {
namespace {

TraceLayer Record(uint32_t layer, const std::vector<float>& weights, size_t k) {
  TraceLayer rec;
  rec.layer = layer;
  const size_t T = weights.size() / k;
  rec.seq_ids.assign(T, 1);
  rec.positions.assign(T, 0);
  rec.experts.assign(T * k, 0);
  rec.weights = weights;
  return rec;
}

TEST(GateRanks, MeanAndShareAtLeastThresholdPerRank) {
  RouterTrace trace;
  trace.header.top_k = 3;
  // Three tokens over two records: rank 0 weighs 0.6, 0.5, 0.7; rank 1 0.3, 0.3, 0.15;
  // rank 2 0.1, 0.2, 0.15.
  trace.layers.push_back(Record(0, {0.6f, 0.3f, 0.1f, 0.5f, 0.3f, 0.2f}, 3));
  trace.layers.push_back(Record(1, {0.7f, 0.15f, 0.15f}, 3));
  const GateRanks g = GateWeightsByRank(trace, 0.15f);
  EXPECT_EQ(g.selections, 3u);
  ASSERT_EQ(g.mean.size(), 3u);
  EXPECT_NEAR(g.mean[0], 0.6, 1e-6);
  EXPECT_NEAR(g.mean[1], 0.25, 1e-6);
  EXPECT_NEAR(g.mean[2], 0.15, 1e-6);
  EXPECT_DOUBLE_EQ(g.share_at_least[0], 1.0);
  EXPECT_DOUBLE_EQ(g.share_at_least[1], 1.0);     // 0.15 counts: weight >= threshold
  EXPECT_DOUBLE_EQ(g.share_at_least[2], 2.0 / 3);  // 0.2 and 0.15, not 0.1
  const GateRanks h = GateWeightsByRank(trace, 0.31f);
  EXPECT_DOUBLE_EQ(h.share_at_least[0], 1.0);
  EXPECT_DOUBLE_EQ(h.share_at_least[1], 0.0);
}

TEST(GateRanks, EmptyTraceGivesZeros) {
  RouterTrace trace;
  trace.header.top_k = 2;
  const GateRanks g = GateWeightsByRank(trace, 0.15f);
  EXPECT_EQ(g.selections, 0u);
  EXPECT_EQ(g.mean, std::vector<double>(2, 0.0));
}

}  // namespace
}  // namespace pw::misses
