// Prompt features: the prefill worker's per-sequence routing counts over one pass, and the
// decode worker's per-layer routing histogram of recent prefills.
#include "services/workers/common/prompt_features.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace pw::workers {
namespace {

engine::RoutingContext Ctx(int layer, const std::vector<uint64_t>& seqs, bool pure_decode = false) {
  engine::RoutingContext c;
  c.layer = layer;
  c.num_tokens = static_cast<int>(seqs.size());
  c.num_experts = 3;
  c.top_k = 2;
  c.pure_decode = pure_decode;
  c.seq_ids = seqs.data();
  return c;
}

TEST(PromptRoutingRecorder, CountsEachSequencesAssignmentsPerLayerInPassOrder) {
  PromptRoutingRecorder rec(2, 3);
  rec.BeginPass();
  // Tokens 0-1 of sequence 90, token 2 of sequence 17 (the engine's ids, in job order).
  const std::vector<uint64_t> seqs = {90, 90, 17};
  rec.Record(Ctx(0, seqs), {{0, 0, 0.6f, 0}, {0, 1, 0.4f, 1}, {1, 0, 0.5f, 0}, {1, 2, 0.5f, 1},
                            {2, 2, 0.7f, 0}, {2, 1, 0.3f, 1}});
  rec.Record(Ctx(1, seqs), {{0, 1, 1.f, 0}, {1, 1, 1.f, 0}, {2, 0, 1.f, 0}, {5, 0, 1.f, 0}});  // token 5: ignored
  rec.Record(Ctx(1, seqs, /*pure_decode=*/true), {{0, 2, 1.f, 0}});                          // decode: ignored
  ASSERT_EQ(rec.num_sequences(), 2u);
  EXPECT_EQ(rec.counts(0), (std::vector<uint32_t>{2, 1, 1, 0, 2, 0}));
  EXPECT_EQ(rec.counts(1), (std::vector<uint32_t>{0, 1, 1, 1, 0, 0}));
  std::vector<uint32_t> sum;
  AddRoutingCounts(rec.counts(0), &sum);
  AddRoutingCounts(rec.counts(1), &sum);
  EXPECT_EQ(sum, (std::vector<uint32_t>{2, 2, 2, 1, 2, 0}));
  rec.BeginPass();
  EXPECT_EQ(rec.num_sequences(), 0u);
}

TEST(PromptFeatures, HistogramOfRecentPrefillsPerLayer) {
  PromptFeatures f(2, 2, /*alpha=*/0.5);
  EXPECT_EQ(f.features(), (std::vector<float>{0, 0, 0, 0}));
  f.Add(std::vector<uint32_t>{3, 1, 0, 0});  // layer 1 not routed: stays unknown
  EXPECT_EQ(f.requests(), 1u);
  EXPECT_EQ(f.features(), (std::vector<float>{0.75f, 0.25f, 0, 0}));
  f.Add(std::vector<uint32_t>{1, 3, 2, 2});  // layer 0: EMA; layer 1: first request sets it
  EXPECT_EQ(f.features(), (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}));
  f.Add(std::vector<uint32_t>{1, 2, 3});      // wrong size: ignored
  f.Add(std::vector<uint32_t>{0, 0, 0, 0});   // nothing routed: ignored
  EXPECT_EQ(f.requests(), 2u);
  EXPECT_EQ(f.features(), (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}));
}

}  // namespace
}  // namespace pw::workers
