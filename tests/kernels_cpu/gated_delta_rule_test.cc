// The Gated DeltaNet step kernels (kernels/cpu/gated_delta_rule.h) against hand-computed values.
#include "kernels/cpu/gated_delta_rule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace pw::cpu {
namespace {

// weight [0.5, -1, 2] over the window (1, 3 | x = 2): 0.5 - 3 + 4 = 1.5, silu(1.5); the window
// slides to (3, 2).
TEST(GatedDeltaRule, CausalConvStepSlidesTheWindow) {
  const float weight[] = {0.5f, -1.f, 2.f, 1.f, 1.f, 1.f};
  float state[] = {1.f, 3.f, 0.f, 0.f};
  const float x[] = {2.f, -1.f};
  float out[2];
  CausalConv1dSiluStep(x, weight, 2, 3, state, out);
  EXPECT_NEAR(out[0], 1.5f / (1.f + std::exp(-1.5f)), 1e-6f);
  EXPECT_NEAR(out[1], -1.f / (1.f + std::exp(1.f)), 1e-6f);
  EXPECT_EQ(state[0], 3.f);
  EXPECT_EQ(state[1], 2.f);
  EXPECT_EQ(state[2], 0.f);
  EXPECT_EQ(state[3], -1.f);
}

// S = [[1, 0], [0, 2]] decayed by exp(g) = 0.5: [[0.5, 0], [0, 1]]; k = (1, 0) reads (0.5, 0);
// delta = 0.5 ((3, 4) - (0.5, 0)) = (1.25, 2); S += k delta^T: [[1.75, 2], [0, 1]];
// o = S^T (1, 1) = (1.75, 3).
TEST(GatedDeltaRule, StepDecaysCorrectsAndReads) {
  float s[] = {1.f, 0.f, 0.f, 2.f};
  const float q[] = {1.f, 1.f}, k[] = {1.f, 0.f}, v[] = {3.f, 4.f};
  float o[2];
  GatedDeltaRuleStep(q, k, v, std::log(0.5f), 0.5f, 2, 2, s, o);
  EXPECT_NEAR(s[0], 1.75f, 1e-6f);
  EXPECT_NEAR(s[1], 2.f, 1e-6f);
  EXPECT_NEAR(s[2], 0.f, 1e-6f);
  EXPECT_NEAR(s[3], 1.f, 1e-6f);
  EXPECT_NEAR(o[0], 1.75f, 1e-6f);
  EXPECT_NEAR(o[1], 3.f, 1e-6f);
}

// From a zero state one step stores beta k v^T: o = beta (k . q) v, with dk != dv.
TEST(GatedDeltaRule, FirstStepFromZeroIsBetaKqV) {
  std::vector<float> s(3 * 2, 0.f);
  const float q[] = {0.5f, -1.f, 2.f}, k[] = {1.f, 2.f, 0.5f}, v[] = {-2.f, 3.f};
  float o[2];
  GatedDeltaRuleStep(q, k, v, -0.3f, 0.25f, 3, 2, s.data(), o);
  const float kq = 0.5f - 2.f + 1.f;
  EXPECT_NEAR(o[0], 0.25f * kq * -2.f, 1e-6f);
  EXPECT_NEAR(o[1], 0.25f * kq * 3.f, 1e-6f);
  EXPECT_NEAR(s[2 * 2 + 1], 0.25f * 0.5f * 3.f, 1e-6f);  // S[2][1] = beta k2 v1
}

TEST(GatedDeltaRule, L2Normalize) {
  float x[] = {3.f, 4.f};
  L2NormalizeInPlace(x, 2, 0.f);
  EXPECT_NEAR(x[0], 0.6f, 1e-7f);
  EXPECT_NEAR(x[1], 0.8f, 1e-7f);
}

}  // namespace
}  // namespace pw::cpu
