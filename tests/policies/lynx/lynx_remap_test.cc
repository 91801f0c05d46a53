#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <random>
#include <set>
#include <vector>

#include "policies/lynx/affinity_binning.h"
#include "policies/lynx/lynx_params.h"
#include "policies/lynx/lynx_remap.h"
#include "policies/lynx/piggyback_remap.h"

// GCC pairs the std::allocator's inlined ::operator new with the free() below and warns; the
// pair is the replacement's own, so it matches.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

// Counts heap allocations of this test binary (the remap must not allocate once reserved).
static std::atomic<long> g_allocations{0};
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace pw::lynx {
namespace {

RemapInput Input(const std::vector<float>& logits, int T, int N, int k, bool decode = true) {
  RemapInput in;
  in.num_tokens = T;
  in.num_experts = N;
  in.top_k = k;
  in.norm_topk_prob = true;
  in.pure_decode = decode;
  in.logits = logits.data();
  return in;
}

std::vector<int32_t> Experts(const RemapOutput& out, int t, int k) {
  std::vector<int32_t> e;
  for (int j = 0; j < k; ++j) e.push_back(out.slots[t * k + j].expert);
  return e;
}

TEST(LynxParams, DefaultsReproduceThePublishedPairs) {
  const struct {
    int n, k;
    float alpha;
    int beta;
  } cases[] = {{64, 8, 3.f, 4}, {128, 8, 3.f, 2}, {8, 2, 0.7f, 1},
               {32, 4, 3.f, 4},    // the embedded model: same k/N as 64/8
               {256, 8, 3.f, 2},   // clamped beyond 1/16
               {8, 4, 0.7f, 1},    // clamped beyond 1/4
               {96, 8, 3.f, 3}};   // x = log2(12): beta = round(4 - 0.585 * 2) = 3
  for (const auto& c : cases) {
    const LynxParams p = DefaultLynxParams(c.n, c.k);
    EXPECT_NEAR(p.alpha, c.alpha, 1e-6) << c.n << "/" << c.k;
    EXPECT_EQ(p.beta, c.beta) << c.n << "/" << c.k;
    EXPECT_TRUE(ValidateLynxParams(p).ok());
  }
  EXPECT_FALSE(ValidateLynxParams({0.f, 2}).ok());
  EXPECT_FALSE(ValidateLynxParams({1.f, -1}).ok());
}

TEST(AffinityBinning, BinsAreCeilOfScaledGapClampedAtMinusBeta) {
  const LynxParams p{3.f, 4};
  EXPECT_EQ(AffinityBin(0.f, p), 0);
  EXPECT_EQ(AffinityBin(-0.2f, p), 0);    // ceil(-0.6)
  EXPECT_EQ(AffinityBin(-0.34f, p), -1);  // ceil(-1.02)
  EXPECT_EQ(AffinityBin(-1.f, p), -3);
  EXPECT_EQ(AffinityBin(-10.f, p), -4);
  EXPECT_EQ(AffinityBin(-INFINITY, p), -4);
  const LynxParams mixtral{0.7f, 1};
  EXPECT_EQ(AffinityBin(-1.f, mixtral), 0);   // ceil(-0.7)
  EXPECT_EQ(AffinityBin(-1.5f, mixtral), -1); // ceil(-1.05)
  const std::vector<float> logits = {1.f, 0.9f, 0.f, -5.f};
  int8_t bins[4];
  AffinityBins(logits.data(), 1, 4, p, bins);
  EXPECT_EQ(bins[0], 0);
  EXPECT_EQ(bins[1], 0);
  EXPECT_EQ(bins[2], -3);
  EXPECT_EQ(bins[3], -4);
}

// N = 8, k = 2, default (0.7, 1): bin 0 = within 1.43 logits of the best.
// t0 is confident (experts 0, 1 far above the rest); t1 and t2 have their own favourites but
// also hold experts 5 and 6 in bin 0; t3 wants 5 and 6. The batch agrees on {5, 6}.
std::vector<float> HandMade() {
  std::vector<float> L(4 * 8, -3.f);
  auto row = [&](int t) { return L.data() + t * 8; };
  std::fill(row(0), row(0) + 8, -4.f);
  row(0)[0] = 4.f, row(0)[1] = 4.f;
  row(1)[2] = 1.f, row(1)[3] = 0.95f, row(1)[5] = 0.2f, row(1)[6] = 0.1f;
  row(2)[4] = 1.f, row(2)[7] = 0.95f, row(2)[5] = 0.2f, row(2)[6] = 0.1f;
  row(3)[5] = 1.f, row(3)[6] = 0.9f;
  return L;
}

TEST(LynxRemap, HandMadeBatchConsolidatesOnSharedExperts) {
  const std::vector<float> L = HandMade();
  LynxRemapper r({});
  r.Reserve(4, 8, 2);
  const RemapOutput& out = r.Remap(Input(L, 4, 8, 2));
  ASSERT_TRUE(out.stats.applied);
  EXPECT_EQ(Experts(out, 0, 2), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(Experts(out, 1, 2), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(Experts(out, 2, 2), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(Experts(out, 3, 2), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(out.changed[0], 0);
  EXPECT_EQ(out.changed[1], 1);
  EXPECT_EQ(out.changed[2], 1);
  EXPECT_EQ(out.changed[3], 0);
  EXPECT_EQ(out.stats.distinct_before, 8);
  EXPECT_EQ(out.stats.distinct_after, 4);
  EXPECT_EQ(out.stats.tokens_changed, 2);
  EXPECT_EQ(out.stats.pairs_replaced, 4);
  // The confident token keeps the router's weights exactly: p0 / (p0 + p1) = 0.5.
  EXPECT_EQ(out.slots[0].weight, 0.5f);
  EXPECT_EQ(out.slots[0].orig_rank, 0);
  EXPECT_EQ(out.slots[1].orig_rank, 1);
  // Renormalised over {5, 6} for t1: softmax ratio exp(0.2) : exp(0.1).
  const float w5 = 1.f / (1.f + std::exp(-0.1f));
  EXPECT_NEAR(out.slots[2].weight, w5, 1e-6);
  EXPECT_NEAR(out.slots[2].weight + out.slots[3].weight, 1.f, 1e-6);
  EXPECT_EQ(out.slots[2].orig_rank, -1);
}

TEST(LynxRemap, OriginalMassOptionKeepsTheTokensTopKMass) {
  std::vector<float> L = HandMade();
  RemapInput in = Input(L, 4, 8, 2);
  in.norm_topk_prob = false;  // raw softmax weights (OLMoE-style)
  LynxRemapper renorm({});
  LynxOptions o;
  o.gate_weights = GateWeights::kOriginalMass;
  LynxRemapper mass(o);
  const RemapOutput& a = renorm.Remap(in);
  const RemapOutput& b = mass.Remap(in);
  // t1's softmax over its 8 logits.
  const float* row = L.data() + 8;
  double z = 0;
  for (int e = 0; e < 8; ++e) z += std::exp(row[e]);
  auto p = [&](int e) { return static_cast<float>(std::exp(row[e]) / z); };
  EXPECT_NEAR(a.slots[2].weight, p(5), 1e-6);  // raw p, no renormalisation
  EXPECT_NEAR(a.slots[3].weight, p(6), 1e-6);
  const float m0 = p(2) + p(3);
  EXPECT_NEAR(b.slots[2].weight + b.slots[3].weight, m0, 1e-6);
  EXPECT_NEAR(b.slots[2].weight / b.slots[3].weight, p(5) / p(6), 1e-5);
  // An unchanged token gets the router's raw weights under both options.
  EXPECT_EQ(b.slots[0].weight, a.slots[0].weight);
}

TEST(LynxRemap, PhaseGateAndExemptLayerKeepTheRouterChoice) {
  const std::vector<float> L = HandMade();
  LynxRemapper r({});
  const RemapOutput& prefill = r.Remap(Input(L, 4, 8, 2, /*decode=*/false));
  EXPECT_FALSE(prefill.stats.applied);
  EXPECT_EQ(Experts(prefill, 1, 2), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(Experts(prefill, 2, 2), (std::vector<int32_t>{4, 7}));
  for (int t = 0; t < 4; ++t) EXPECT_EQ(prefill.changed[t], 0);
  EXPECT_EQ(prefill.stats.distinct_after, 8);

  LynxOptions o;
  o.exempt_layers = {3};
  LynxRemapper ex(o);
  RemapInput in = Input(L, 4, 8, 2);
  in.layer = 3;
  EXPECT_FALSE(ex.Remap(in).stats.applied);
  in.layer = 2;
  EXPECT_TRUE(ex.Remap(in).stats.applied);
}

TEST(LynxRemap, KeepsKDistinctExpertsPerTokenOnRandomBatches) {
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int T : {1, 2, 8, 33, 64}) {
    for (auto [N, k] : {std::pair{32, 4}, std::pair{64, 8}, std::pair{8, 2}}) {
      std::vector<float> L(static_cast<size_t>(T * N));
      for (float& v : L) v = g(rng);
      LynxRemapper r({});
      r.Reserve(T, N, k);
      const RemapOutput& out = r.Remap(Input(L, T, N, k));
      int changed = 0;
      for (int t = 0; t < T; ++t) {
        std::set<int32_t> s;
        float sum = 0;
        for (int j = 0; j < k; ++j) {
          const RemapSlot& sl = out.slots[t * k + j];
          ASSERT_GE(sl.expert, 0);
          ASSERT_LT(sl.expert, N);
          s.insert(sl.expert);
          sum += sl.weight;
          if (j > 0) {  // sorted by the token's own logits
            EXPECT_LE(L[t * N + sl.expert], L[t * N + out.slots[t * k + j - 1].expert]);
          }
        }
        EXPECT_EQ(static_cast<int>(s.size()), k) << "T=" << T << " N=" << N;
        EXPECT_NEAR(sum, 1.f, 1e-5);
        changed += out.changed[t];
      }
      EXPECT_EQ(changed, out.stats.tokens_changed);
      if (T == 1) {
        EXPECT_EQ(changed, 0);  // a batch of one is the identity
      }
      if (T >= 8) {
        EXPECT_LE(out.stats.distinct_after, out.stats.distinct_before);
      }
    }
  }
}

TEST(LynxRemap, TiesAreDeterministic) {
  // Every logit equal: every token's top-k and the critical set are the lowest ids.
  std::vector<float> L(3 * 8, 0.f);
  LynxRemapper r({});
  const RemapOutput& out = r.Remap(Input(L, 3, 8, 2));
  for (int t = 0; t < 3; ++t) EXPECT_EQ(Experts(out, t, 2), (std::vector<int32_t>{0, 1}));
  // Two experts equal in bin, batch score and logit: the lower id wins, run after run.
  std::vector<float> M = {1.f, 0.f, 0.5f, 0.5f, -4.f, -4.f, -4.f, -4.f,
                          1.f, 0.f, 0.5f, 0.5f, -4.f, -4.f, -4.f, -4.f};
  std::vector<int32_t> first;
  for (int rep = 0; rep < 3; ++rep) {
    LynxRemapper q({});
    const RemapOutput& o = q.Remap(Input(M, 2, 8, 2));
    std::vector<int32_t> e = Experts(o, 0, 2);
    EXPECT_EQ(e, (std::vector<int32_t>{0, 2}));
    if (rep == 0) first = e;
    EXPECT_EQ(e, first);
  }
}

TEST(PiggybackRemap, FillsFromTheBatchsFirstChoices) {
  // k = 3, k' = 1. Router top-3: t0 {0, 2, 3}, t1 {1, 4, 5}, t2 {0, 6, 7}; P = {0, 1}.
  std::vector<float> L(3 * 8, -5.f);
  auto set = [&](int t, int e, float v) { L[t * 8 + e] = v; };
  set(0, 0, 3.f), set(0, 2, 2.f), set(0, 3, 1.f), set(0, 1, -1.f);
  set(1, 1, 3.f), set(1, 4, 2.f), set(1, 5, 1.f), set(1, 0, -2.f);
  set(2, 0, 3.f), set(2, 6, 2.f), set(2, 7, 1.f), set(2, 1, -3.f);
  PiggybackOptions o;
  o.keep = 1;
  PiggybackRemapper r(o);
  const RemapOutput& out = r.Remap(Input(L, 3, 8, 3));
  ASSERT_TRUE(out.stats.applied);
  // Each keeps its first choice, takes the other member of P, and fills the last slot with its
  // own next router choice (P has only two experts); slots sorted by the token's logits.
  EXPECT_EQ(Experts(out, 0, 3), (std::vector<int32_t>{0, 2, 1}));
  EXPECT_EQ(Experts(out, 1, 3), (std::vector<int32_t>{1, 4, 0}));
  EXPECT_EQ(Experts(out, 2, 3), (std::vector<int32_t>{0, 6, 1}));
  EXPECT_EQ(out.stats.distinct_before, 8);
  EXPECT_EQ(out.stats.distinct_after, 5);  // {0, 1, 2, 4, 6}
  EXPECT_EQ(out.stats.pairs_replaced, 3);
  EXPECT_EQ(out.slots[2].orig_rank, -1);
  EXPECT_EQ(out.slots[1].orig_rank, 1);

  EXPECT_FALSE(r.Remap(Input(L, 3, 8, 3, /*decode=*/false)).stats.applied);
  PiggybackOptions all;
  all.keep = 3;  // k' >= k: identity
  PiggybackRemapper id(all);
  EXPECT_FALSE(id.Remap(Input(L, 3, 8, 3)).stats.applied);
}

TEST(LynxRemap, DoesNotAllocateOnceReserved) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> L(64 * 64);
  for (float& v : L) v = g(rng);
  LynxRemapper lynx({});
  PiggybackOptions po;
  po.keep = 2;
  PiggybackRemapper pig(po);
  lynx.Reserve(64, 64, 8);
  pig.Reserve(64, 64, 8);
  const long before = g_allocations.load();
  for (int T : {64, 1, 17, 64}) {
    RemapInput in = Input(L, T, 64, 8);
    EXPECT_TRUE(lynx.Remap(in).stats.applied || T == 1);
    EXPECT_TRUE(pig.Remap(in).stats.applied || T == 1);
    in.pure_decode = false;
    (void)lynx.Remap(in);
  }
  EXPECT_EQ(g_allocations.load() - before, 0);
}

}  // namespace
}  // namespace pw::lynx
