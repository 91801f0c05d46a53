// LynxParams: the AffinityBinning parameters (alpha, beta) and the default derived from k/N.
//
// A token's confidence in expert e is delta = L[e] - max L (router logits, <= 0). Its bin is
//   q = max(ceil(alpha * delta), -beta)                         in {-beta, ..., 0}
// so bins are 1/alpha logits wide and there are beta + 1 of them (affinity_binning.h).
//
// Default rule (DefaultLynxParams). The LYNX paper states that the bins follow from the
// sparsity ratio k/N alone but our copy of it gives no formula; the authors' released settings
// are three points, N=8,k=2 -> (0.7, 1); N=64,k=8 -> (3, 4); N=128,k=8 -> (3, 2). Their beta is
// not monotone in k/N, so no smooth monotone law of k/N fits all three. The rule we use is
// the piecewise-linear interpolation of those points in x = log2(N / k):
//   x <= 2: (0.7, 1)        x = 3: (3, 4)        x >= 4: (3, 2)
//   alpha = linear between neighbouring points; beta = round-half-up(linear), at least 1.
// It reproduces the three published pairs (tests/policies/lynx checks it) and is a function of k/N only;
// it is clamped, not extrapolated, outside [1/16, 1/4]. The embedded model (N=32, k=4) has the
// same k/N as N=64,k=8 and gets (3, 4). A per-model override replaces it (LynxOptions).
#pragma once

#include "common/status.h"

namespace pw::lynx {

struct LynxParams {
  float alpha = 3.f;  // bins per logit (bin width 1/alpha logits), > 0
  int beta = 4;       // lowest bin is -beta, >= 0 (beta + 1 bins)
};

// The default (alpha, beta) for a router choosing `top_k` of `num_experts` (rule above).
// Requires 1 <= top_k <= num_experts.
LynxParams DefaultLynxParams(int num_experts, int top_k);

// kInvalidArgument unless alpha is finite and > 0 and 0 <= beta <= 64.
Status ValidateLynxParams(const LynxParams& p);

}  // namespace pw::lynx
