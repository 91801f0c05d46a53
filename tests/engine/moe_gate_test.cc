// The MoE gate seam (engine/layers/moe_gate.h) on hand-computed cases: softmax scores, the top-k
// in descending probability with the lower expert id first on ties, weights raw or renormalised
// over the k, token-major rank order; the sigmoid gate's bias used for selection only, its
// groups ranked by their two best scores, its weights unbiased and scaled; bad top-k, bad
// grouping, a missing bias and unknown kinds refused.
#include "engine/layers/moe_gate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/dense.h"

namespace pw::engine {
namespace {

// Logits whose softmax is exactly representable up to rounding: log(p) for p summing to 1.
std::vector<float> LogOf(const std::vector<float>& p) {
  std::vector<float> l;
  for (float x : p) l.push_back(std::log(x));
  return l;
}

struct Routed {
  Status status;
  std::vector<float> scores, selection;
  std::vector<ExpertAssignment> out;
};

Routed Route(const MoeGate& gate, const std::vector<float>& logits, size_t T,
             const kernels::DenseKernels& k = cpu::kScalarKernels) {
  const size_t E = logits.size() / T;
  Routed r;
  r.scores.assign(T * E, -1.f);
  std::vector<int32_t> order;
  r.selection.assign(T * E, -1.f);
  r.status = RunMoeGate(gate, logits.data(), T, E, k, r.scores.data(), r.selection.data(), &order,
                        &r.out);
  return r;
}

// Logits whose sigmoid is p: log(p / (1 - p)).
std::vector<float> LogitOf(const std::vector<float>& p) {
  std::vector<float> l;
  for (float x : p) l.push_back(std::log(x / (1.f - x)));
  return l;
}

MoeGate Sigmoid(int k, bool renormalize, int n_group, int topk_group, float scale,
                const std::vector<float>& bias) {
  MoeGate g{GateKind::kSigmoidGroupedTopK, k, renormalize};
  g.n_group = n_group;
  g.topk_group = topk_group;
  g.weight_scale = scale;
  g.bias = bias.data();
  return g;
}

void ExpectAssignment(const ExpertAssignment& a, int token, int expert, float weight, int rank) {
  EXPECT_EQ(a.token, token);
  EXPECT_EQ(a.expert, expert);
  EXPECT_NEAR(a.weight, weight, 1e-6f) << "token " << token << " expert " << expert;
  EXPECT_EQ(a.rank, rank);
}

TEST(MoeGate, SoftmaxTopKRawWeightsAreTheProbabilities) {
  // p = {.05, .4, .1, .3, .15}: the top 2 are expert 1 (.4) then 3 (.3).
  const auto logits = LogOf({0.05f, 0.4f, 0.1f, 0.3f, 0.15f});
  const Routed r = Route({GateKind::kSoftmaxTopK, 2, false}, logits, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  const std::vector<float> want = {0.05f, 0.4f, 0.1f, 0.3f, 0.15f};
  for (size_t e = 0; e < 5; ++e) EXPECT_NEAR(r.scores[e], want[e], 1e-6f) << e;
  ASSERT_EQ(r.out.size(), 2u);
  ExpectAssignment(r.out[0], 0, 1, 0.4f, 0);
  ExpectAssignment(r.out[1], 0, 3, 0.3f, 1);
}

TEST(MoeGate, SoftmaxTopKRenormalisedWeightsSumToOne) {
  // Top 3 of the same p: 1 (.4), 3 (.3), 4 (.15), divided by .85.
  const auto logits = LogOf({0.05f, 0.4f, 0.1f, 0.3f, 0.15f});
  const Routed r = Route({GateKind::kSoftmaxTopK, 3, true}, logits, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.out.size(), 3u);
  ExpectAssignment(r.out[0], 0, 1, 0.4f / 0.85f, 0);
  ExpectAssignment(r.out[1], 0, 3, 0.3f / 0.85f, 1);
  ExpectAssignment(r.out[2], 0, 4, 0.15f / 0.85f, 2);
}

TEST(MoeGate, TiesGoToTheLowerExpertAndTokensStayInOrder) {
  // Token 0: logits {0, ln 3, ln 3, 0} -> p = {1/8, 3/8, 3/8, 1/8}: experts 1 then 2.
  // Token 1: logits {0, 0, 0, ln 2} -> p = {.2, .2, .2, .4}: expert 3, then the tie 0.
  const float l3 = std::log(3.f), l2 = std::log(2.f);
  const std::vector<float> logits = {0.f, l3, l3, 0.f, 0.f, 0.f, 0.f, l2};
  for (const kernels::DenseKernels* k : {&cpu::kScalarKernels, &cpu::Kernels()}) {
    const Routed r = Route({GateKind::kSoftmaxTopK, 2, false}, logits, 2, *k);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_NEAR(r.scores[0], 0.125f, 1e-6f);
    EXPECT_NEAR(r.scores[7], 0.4f, 1e-6f);
    ASSERT_EQ(r.out.size(), 4u);
    ExpectAssignment(r.out[0], 0, 1, 0.375f, 0);
    ExpectAssignment(r.out[1], 0, 2, 0.375f, 1);
    ExpectAssignment(r.out[2], 1, 3, 0.4f, 0);
    ExpectAssignment(r.out[3], 1, 0, 0.2f, 1);
  }
}

TEST(MoeGate, AppendsToWhatIsThere) {
  const auto logits = LogOf({0.25f, 0.75f});
  std::vector<float> scores(2);
  std::vector<int32_t> order;
  std::vector<ExpertAssignment> out = {{9, 9, 9.f, 9}};
  ASSERT_TRUE(RunMoeGate({GateKind::kSoftmaxTopK, 1, true}, logits.data(), 1, 2,
                         cpu::kScalarKernels, scores.data(), nullptr, &order, &out)
                  .ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].token, 9);
  ExpectAssignment(out[1], 0, 1, 1.f, 0);
}

TEST(MoeGate, TopKOutsideTheExpertsIsRefused) {
  const auto logits = LogOf({0.25f, 0.75f});
  for (int k : {0, 3, -1}) {
    const Routed r = Route({GateKind::kSoftmaxTopK, k, false}, logits, 1);
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << k;
    EXPECT_NE(r.status.message().find("top-k"), std::string::npos) << r.status.ToString();
    EXPECT_TRUE(r.out.empty());
  }
}

TEST(MoeGate, SigmoidBiasSelectsButTheWeightsAreUnbiased) {
  // s = {.9, .6, .5, .2}, bias {-.5, 0, .2, 0}: selection {.4, .6, .7, .2}, so experts 2 then
  // 1 (without the bias it would be 0 and 1); weights s_2 = .5, s_1 = .6, not renormalised.
  const std::vector<float> bias = {-0.5f, 0.f, 0.2f, 0.f};
  const Routed r = Route(Sigmoid(2, false, 1, 1, 1.f, bias), LogitOf({0.9f, 0.6f, 0.5f, 0.2f}), 1);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  const std::vector<float> scores = {0.9f, 0.6f, 0.5f, 0.2f}, sel = {0.4f, 0.6f, 0.7f, 0.2f};
  for (size_t e = 0; e < 4; ++e) {
    EXPECT_NEAR(r.scores[e], scores[e], 1e-6f) << e;
    EXPECT_NEAR(r.selection[e], sel[e], 1e-6f) << e;
  }
  ASSERT_EQ(r.out.size(), 2u);
  ExpectAssignment(r.out[0], 0, 2, 0.5f, 0);
  ExpectAssignment(r.out[1], 0, 1, 0.6f, 1);
}

TEST(MoeGate, SigmoidGroupsRankByTheirTwoBestScoresThenTopKInsideThem) {
  // 8 experts in 4 groups of 2, keep 2 groups, top-3, renormalised, scaled by 2.5.
  // s    = {.9, .1 | .5, .5 | .6, .7 | .2, .3}
  // bias = {-.5, 0 | .3, .05 | 0, 0 | .6, 0}
  // sel  = {.4, .1 | .8, .55 | .6, .7 | .8, .3}; group sums .5, 1.35, 1.3, 1.1: groups 1 and 2.
  // Inside them: 2 (.8), 5 (.7), 4 (.6). Expert 6 (.8) is in a dropped group, expert 0 has the
  // best unbiased score. Weights .5, .7, .6 over 1.8, times 2.5.
  const std::vector<float> bias = {-0.5f, 0.f, 0.3f, 0.05f, 0.f, 0.f, 0.6f, 0.f};
  const auto logits = LogitOf({0.9f, 0.1f, 0.5f, 0.5f, 0.6f, 0.7f, 0.2f, 0.3f});
  const Routed r = Route(Sigmoid(3, true, 4, 2, 2.5f, bias), logits, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.out.size(), 3u);
  ExpectAssignment(r.out[0], 0, 2, 0.5f / 1.8f * 2.5f, 0);
  ExpectAssignment(r.out[1], 0, 5, 0.7f / 1.8f * 2.5f, 1);
  ExpectAssignment(r.out[2], 0, 4, 0.6f / 1.8f * 2.5f, 2);
  // What the hooks rank by: the dropped groups' experts at -inf, the kept ones biased.
  for (int e : {0, 1, 6, 7}) EXPECT_EQ(r.selection[e], -INFINITY) << e;
  EXPECT_NEAR(r.selection[3], 0.55f, 1e-6f);
}

TEST(MoeGate, SigmoidGroupScoreIsTheSumOfTwoNotTheBest) {
  // Groups {.9, .05} (best .9, sum .95) and {.6, .6} (sum 1.2): one group kept, top-1: the
  // second group's expert 2 (tie with 3 goes to the lower id), not expert 0.
  const std::vector<float> bias(4, 0.f);
  const Routed r = Route(Sigmoid(1, false, 2, 1, 1.f, bias), LogitOf({0.9f, 0.05f, 0.6f, 0.6f}), 1);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.out.size(), 1u);
  ExpectAssignment(r.out[0], 0, 2, 0.6f, 0);
}

TEST(MoeGate, SigmoidBadGroupingOrAMissingBiasIsRefused) {
  const std::vector<float> bias(8, 0.f);
  const auto logits = LogitOf({0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f});
  struct Case {
    int k, n_group, topk_group;
  };
  for (const Case& c : {Case{2, 3, 1}, Case{2, 2, 3}, Case{2, 8, 4}, Case{5, 4, 2}, Case{2, 0, 1}}) {
    const Routed r = Route(Sigmoid(c.k, true, c.n_group, c.topk_group, 1.f, bias), logits, 1);
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument)
        << c.k << " " << c.n_group << " " << c.topk_group;
    EXPECT_NE(r.status.message().find("n_group"), std::string::npos) << r.status.ToString();
    EXPECT_TRUE(r.out.empty());
  }
  MoeGate no_bias = Sigmoid(2, true, 1, 1, 1.f, bias);
  no_bias.bias = nullptr;
  const Routed r = Route(no_bias, logits, 1);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("e_score_correction_bias"), std::string::npos);
  EXPECT_TRUE(r.out.empty());
}

TEST(MoeGate, AnUnknownKindIsRefusedNotRoutedAsSoftmax) {
  const auto logits = LogOf({0.25f, 0.75f});
  const Routed r = Route({static_cast<GateKind>(7), 1, false}, logits, 1);
  EXPECT_EQ(r.status.code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status.message().find("kind 7"), std::string::npos) << r.status.ToString();
  EXPECT_TRUE(r.out.empty());
}

}  // namespace
}  // namespace pw::engine
