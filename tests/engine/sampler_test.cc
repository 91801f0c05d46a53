#include "engine/sampler/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <map>
#include <set>
#include <vector>

namespace pw::engine {
namespace {

// `vocab` logits, value(r) of successive 24-bit draws r of a linear congruential sequence.
template <typename F>
std::vector<float> LcgLogits(int vocab, uint32_t seed, F value) {
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& v : l) {
    seed = seed * 1664525u + 1013904223u;
    v = value(static_cast<int>(seed >> 8));
  }
  return l;
}

// (logit - top) / t as the sampler scales them (float), with their ids, in the comparison
// sort's order: value descending, equal values by id.
std::vector<std::pair<float, int32_t>> ReferenceOrder(const std::vector<float>& l, float top, float t) {
  std::vector<std::pair<float, int32_t>> c(l.size());
  for (size_t i = 0; i < l.size(); ++i) c[i] = {(l[i] - top) * (1.f / t), static_cast<int32_t>(i)};
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  return c;
}

// logits = log(p) for p = {0.05, 0.4, 0.1, 0.3, 0.15}: sorted ids by probability 1, 3, 4, 2, 0.
std::vector<float> Known() {
  std::vector<float> p = {0.05f, 0.4f, 0.1f, 0.3f, 0.15f};
  std::vector<float> l;
  for (float x : p) l.push_back(std::log(x));
  return l;
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  std::vector<float> l = {0.f, 2.f, 1.f, 2.f};
  SamplingParams p;
  std::vector<std::pair<float, int32_t>> scratch;
  EXPECT_EQ(SampleToken(l.data(), 4, p, 0, &scratch), 1);
  p.temperature = 1.f;
  p.top_k = 1;
  EXPECT_EQ(SampleToken(l.data(), 4, p, 5, &scratch), 1);
}

TEST(Sampler, TopKAndTopPKeepTheRightSet) {
  auto l = Known();
  SamplingParams p;
  p.temperature = 1.f;
  auto all = SamplingDistribution(l.data(), 5, p);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all[0].first, 1);
  EXPECT_NEAR(all[0].second, 0.4, 1e-6);
  p.top_k = 3;  // {1: .4, 3: .3, 4: .15} renormalised by .85
  auto k3 = SamplingDistribution(l.data(), 5, p);
  ASSERT_EQ(k3.size(), 3u);
  EXPECT_EQ(k3[0].first, 1);
  EXPECT_EQ(k3[1].first, 3);
  EXPECT_EQ(k3[2].first, 4);
  EXPECT_NEAR(k3[2].second, 0.15 / 0.85, 1e-6);
  p.top_k = 0;
  p.top_p = 0.7f;  // .4 + .3 = .7 reaches p: {1, 3}
  auto p7 = SamplingDistribution(l.data(), 5, p);
  ASSERT_EQ(p7.size(), 2u);
  EXPECT_NEAR(p7[0].second, 0.4 / 0.7, 1e-5);
  p.top_p = 0.71f;  // needs the third
  EXPECT_EQ(SamplingDistribution(l.data(), 5, p).size(), 3u);
  p.top_p = 0.01f;  // at least one token
  EXPECT_EQ(SamplingDistribution(l.data(), 5, p).size(), 1u);
  p.top_p = 0.9f;
  p.top_k = 2;  // top-k first, then top-p over the renormalised pair
  auto both = SamplingDistribution(l.data(), 5, p);
  ASSERT_EQ(both.size(), 2u);
  // Temperature 2 flattens: p ~ sqrt(p).
  SamplingParams t2;
  t2.temperature = 2.f;
  auto flat = SamplingDistribution(l.data(), 5, t2);
  double z = 0;
  for (float x : {0.05f, 0.4f, 0.1f, 0.3f, 0.15f}) z += std::sqrt(x);
  EXPECT_NEAR(flat[0].second, std::sqrt(0.4) / z, 1e-6);
}

// Without top-k the whole vocabulary is ordered (by a radix sort): the order of the
// comparison sort (probability descending, equal logits by id), with many ties, -inf logits,
// values of both signs around the largest, and a vocabulary of 50 304 ids; the probabilities
// summed in that order. Top-p then cuts that same order.
TEST(Sampler, TheWholeVocabularyIsOrderedAsTheComparisonSortOrdersIt) {
  const int vocab = 50304;
  const std::vector<float> l = LcgLogits(vocab, 12345, [](int r) {
    return r % 97 == 0 ? -INFINITY : (r % 3 == 0 ? static_cast<float>(r % 41) * 0.25f - 5.f
                                                 : static_cast<float>(r % 100003) * 1e-4f - 7.f);
  });
  for (float t : {1.f, 0.7f, 3.f}) {
    for (float top_p : {1.f, 0.5f}) {
      SamplingParams p;
      p.temperature = t;
      p.top_p = top_p;
      const auto got = SamplingDistribution(l.data(), vocab, p);
      const auto c = ReferenceOrder(l, *std::max_element(l.begin(), l.end()), t);
      ASSERT_LE(got.size(), c.size());
      if (top_p == 1.f) ASSERT_EQ(got.size(), c.size());
      double sum = 0;
      for (const auto& e : c) sum += std::exp(double(e.first) - c[0].first);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].first, c[i].second) << "position " << i << " temperature " << t;
        if (top_p == 1.f) {  // float probabilities (the kernels' softmax)
          const double want = std::exp(double(c[i].first) - c[0].first) / sum;
          ASSERT_NEAR(got[i].second, want, 1e-5 * want + 1e-30) << "position " << i;
        }
      }
    }
  }
}

// Top-p over a vocabulary of 151,936 whose nucleus is one token, about 4,900 (sorted on its
// own) or most of the vocabulary (the radix sort over all): the kept set is the comparison
// sort's prefix that first reaches top_p, and every draw falls in it. Without top-p the draw
// walks the vocabulary in id order and follows the distribution.
TEST(Sampler, TopPFindsNucleiOfEverySizeAndDrawsFollowTheDistribution) {
  const int vocab = 151936;
  std::vector<float> l = LcgLogits(vocab, 777, [](int r) {
    return static_cast<float>(r) * (1.f / 16777216.f);  // nearly flat: large nuclei
  });
  l[5] = 12.f;  // about 0.38 of the mass at temperature 1, nearly all at 0.5
  l[7] = -INFINITY;
  for (auto [t, top_p] : {std::pair{1.f, 0.3f}, {1.f, 0.4f}, {1.f, 0.9f}, {0.5f, 0.9f}}) {
    SamplingParams p;
    p.temperature = t;
    p.top_p = top_p;
    const auto got = SamplingDistribution(l.data(), vocab, p);
    const auto c = ReferenceOrder(l, 12.f, t);
    double sum = 0;
    for (const auto& e : c) sum += std::exp(double(e.first));
    size_t n = 0;
    for (double cum = 0; n < c.size() && cum < top_p;) cum += std::exp(double(c[n++].first)) / sum;
    // The float sums may end the nucleus a token either side of the double reference.
    ASSERT_NEAR(static_cast<double>(got.size()), static_cast<double>(n), 1.0) << t << " " << top_p;
    for (size_t i = 0; i < std::min(got.size(), n); ++i) ASSERT_EQ(got[i].first, c[i].second) << i;
    std::vector<std::pair<float, int32_t>> scratch;
    std::set<int32_t> kept;
    for (const auto& e : got) kept.insert(e.first);
    for (int d = 0; d < 20; ++d) ASSERT_EQ(kept.count(SampleToken(l.data(), vocab, p, d, &scratch)), 1u);
  }
  // No top-p: token 5's share of the draws is its probability, and the -inf token never comes.
  SamplingParams p;
  p.temperature = 1.f;
  p.seed = 9;
  const auto dist = SamplingDistribution(l.data(), vocab, p);
  ASSERT_EQ(dist[0].first, 5);
  ASSERT_GT(dist[0].second, 0.3);
  std::vector<std::pair<float, int32_t>> scratch;
  int hits = 0;
  const int n = 2000;
  for (int d = 0; d < n; ++d) {
    const int32_t tok = SampleToken(l.data(), vocab, p, d, &scratch);
    ASSERT_NE(tok, 7);
    hits += tok == 5;
  }
  EXPECT_NEAR(hits / double(n), dist[0].second, 0.04);
}

TEST(Sampler, SeededDrawsAreDeterministicAndFollowTheDistribution) {
  auto l = Known();
  SamplingParams p;
  p.temperature = 1.f;
  p.top_k = 3;
  p.seed = 1234;
  std::vector<std::pair<float, int32_t>> scratch;
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t a = SampleToken(l.data(), 5, p, i, &scratch);
    const int32_t b = SampleToken(l.data(), 5, p, i, &scratch);
    ASSERT_EQ(a, b);
    counts[a]++;
  }
  EXPECT_EQ(counts.count(0) + counts.count(2), 0u);  // outside the top 3
  EXPECT_NEAR(counts[1] / double(n), 0.4 / 0.85, 0.015);
  EXPECT_NEAR(counts[3] / double(n), 0.3 / 0.85, 0.015);
  EXPECT_NEAR(counts[4] / double(n), 0.15 / 0.85, 0.015);
  // Another seed gives another stream.
  int differ = 0;
  SamplingParams q = p;
  q.seed = 4321;
  for (int i = 0; i < 200; ++i) {
    differ += SampleToken(l.data(), 5, p, i, &scratch) != SampleToken(l.data(), 5, q, i, &scratch);
  }
  EXPECT_GT(differ, 20);
  for (int i = 0; i < 1000; ++i) {
    const double u = UniformDraw(7, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(Sampler, ValidateNamesTheField) {
  SamplingParams p;
  EXPECT_TRUE(ValidateSamplingParams(p, 10).ok());
  p.top_k = -1;
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("top_k"), std::string::npos);
  p = {};
  p.top_p = 1.5f;
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("top_p"), std::string::npos);
  p = {};
  p.temperature = -1;
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("temperature"), std::string::npos);
  p = {};
  p.stop_token_ids = {10};
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("stop token"), std::string::npos);
  p = {};
  p.max_tokens = 0;
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("max_tokens"), std::string::npos);
}

TEST(Sampler, ValidateRefusesWhatFloatCannotComputeWith) {
  // The worker's check is CheckSampling (common/sampling_check.h), the router's too.
  SamplingParams p;
  p.temperature = 1e-40f;  // subnormal: 1 / temperature overflows float
  ASSERT_EQ(std::fpclassify(p.temperature), FP_SUBNORMAL);
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("temperature"), std::string::npos);
  p = {};
  p.top_p = 1e-40f;
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("top_p"), std::string::npos);
  p = {};
  p.top_p = 0.f;
  EXPECT_NE(ValidateSamplingParams(p, 10).message().find("top_p"), std::string::npos);
  p = {};
  p.temperature = FLT_MIN;
  p.top_p = FLT_MIN;
  EXPECT_TRUE(ValidateSamplingParams(p, 10).ok());
}

TEST(Sampler, TheSmallestTemperatureAcceptedSamplesTheArgmax) {
  // logits / FLT_MIN overflow float; scaled relative to the largest logit they do not.
  const std::vector<float> l = {1.f, 5.f, 3.f, 4.5f};
  SamplingParams p;
  p.temperature = FLT_MIN;
  ASSERT_TRUE(ValidateSamplingParams(p, 4).ok());
  auto dist = SamplingDistribution(l.data(), 4, p);
  ASSERT_FALSE(dist.empty());
  EXPECT_EQ(dist[0].first, 1);
  EXPECT_EQ(dist[0].second, 1.0);
  for (size_t i = 1; i < dist.size(); ++i) EXPECT_EQ(dist[i].second, 0.0) << dist[i].first;
  std::vector<std::pair<float, int32_t>> scratch;
  for (uint64_t i = 0; i < 64; ++i) {
    p.seed = i;
    EXPECT_EQ(SampleToken(l.data(), 4, p, i, &scratch), 1) << "draw " << i;
  }
}

TEST(Sampler, LogprobsAreTheRawLogSoftmaxWithTheTopAlternatives) {
  std::vector<float> l = Known();
  for (float& x : l) x += 3.f;  // a shift changes nothing
  const double p[] = {0.05, 0.4, 0.1, 0.3, 0.15};
  TokenLogprobs lp = ComputeLogprobs(l.data(), 5, 2, 3);
  EXPECT_EQ(lp.token, 2);
  EXPECT_NEAR(lp.logprob, std::log(0.1), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  const int32_t order[] = {1, 3, 4};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(lp.top[i].first, order[i]);
    EXPECT_NEAR(lp.top[i].second, std::log(p[order[i]]), 1e-6);
  }
  EXPECT_TRUE(ComputeLogprobs(l.data(), 5, 1, 0).top.empty());
  EXPECT_EQ(ComputeLogprobs(l.data(), 5, 1, 99).top.size(), 5u);  // clamped to the vocabulary
  // Ties: the lower id first.
  std::vector<float> flat(4, 0.f);
  TokenLogprobs t = ComputeLogprobs(flat.data(), 4, 3, 2);
  EXPECT_EQ(t.top[0].first, 0);
  EXPECT_EQ(t.top[1].first, 1);
  EXPECT_NEAR(t.logprob, std::log(0.25), 1e-6);
  // Independent of the sampling parameters: the model's distribution, not the sampler's.
  SamplingParams hot;
  hot.temperature = 1.7f;
  hot.top_k = 2;
  EXPECT_EQ(SamplingDistribution(l.data(), 5, hot).size(), 2u);
  EXPECT_NEAR(ComputeLogprobs(l.data(), 5, 0, 1).logprob, std::log(0.05), 1e-6);
}

TEST(Sampler, LogprobsRangeIsValidated) {
  SamplingParams sp;
  sp.logprobs = kMaxLogprobs;
  EXPECT_TRUE(ValidateSamplingParams(sp, 10).ok());
  sp.logprobs = kMaxLogprobs + 1;
  EXPECT_NE(ValidateSamplingParams(sp, 10).message().find("logprobs"), std::string::npos);
  sp.logprobs = -2;
  EXPECT_FALSE(ValidateSamplingParams(sp, 10).ok());
}

}  // namespace
}  // namespace pw::engine
