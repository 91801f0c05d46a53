#include "policies/lynx/lynx_params.h"

#include <cmath>
#include <string>

#include "common/status.h"

namespace pw::lynx {

LynxParams DefaultLynxParams(int num_experts, int top_k) {
  PW_CHECK(top_k >= 1 && top_k <= num_experts);
  // The released per-model settings at x = log2(N / k) = 2, 3, 4 (see the header).
  struct Point {
    double x, alpha, beta;
  };
  static constexpr Point kPoints[] = {{2.0, 0.7, 1.0}, {3.0, 3.0, 4.0}, {4.0, 3.0, 2.0}};
  constexpr int kCount = sizeof(kPoints) / sizeof(kPoints[0]);
  const double x = std::log2(static_cast<double>(num_experts) / static_cast<double>(top_k));
  double alpha, beta;
  if (x <= kPoints[0].x) {
    alpha = kPoints[0].alpha;
    beta = kPoints[0].beta;
  } else if (x >= kPoints[kCount - 1].x) {
    alpha = kPoints[kCount - 1].alpha;
    beta = kPoints[kCount - 1].beta;
  } else {
    int i = 0;
    while (x > kPoints[i + 1].x) ++i;
    const double f = (x - kPoints[i].x) / (kPoints[i + 1].x - kPoints[i].x);
    alpha = kPoints[i].alpha + f * (kPoints[i + 1].alpha - kPoints[i].alpha);
    beta = kPoints[i].beta + f * (kPoints[i + 1].beta - kPoints[i].beta);
  }
  LynxParams p;
  p.alpha = static_cast<float>(alpha);
  p.beta = static_cast<int>(std::floor(beta + 0.5));
  if (p.beta < 1) p.beta = 1;
  return p;
}

Status ValidateLynxParams(const LynxParams& p) {
  if (!std::isfinite(p.alpha) || p.alpha <= 0.f) {
    return InvalidArgument("LYNX alpha must be finite and > 0, got " + std::to_string(p.alpha));
  }
  if (p.beta < 0 || p.beta > 64) {
    return InvalidArgument("LYNX beta must be in [0, 64], got " + std::to_string(p.beta));
  }
  return Status::Ok();
}

}  // namespace pw::lynx
