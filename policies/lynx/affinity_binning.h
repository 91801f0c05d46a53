// AffinityBinning: each token's confidence in every expert, as a small integer bin.
//
// For token t and expert e (all N experts, not only the top-k), with
//   delta[t, e] = L[t, e] - max_e' L[t, e']                      (<= 0, logits)
//   q[t, e]     = max(ceil(alpha * delta[t, e]), -beta)          (in {-beta, ..., 0})
// bin 0 holds the experts within 1/alpha logits of the token's best; -beta the far tail.
// A non-finite logit goes to -beta.
#pragma once

#include <cmath>
#include <cstdint>

#include "policies/lynx/lynx_params.h"

namespace pw::lynx {

// The bin of one logit gap `delta` (<= 0).
inline int AffinityBin(float delta, const LynxParams& p) {
  const float x = p.alpha * delta;  // <= 0
  // Also catches NaN (the comparison is false) and -inf.
  if (!(x > static_cast<float>(-p.beta))) return -p.beta;
  // ceil(x) for -beta < x <= 0: -floor(-x), and truncation is floor for -x >= 0.
  return -static_cast<int>(-x);
}

// bins[t * N + e] = q[t, e] for t < T, e < N. logits: [T, N] row-major. Does not allocate.
void AffinityBins(const float* logits, int num_tokens, int num_experts, const LynxParams& p,
                  int8_t* bins);

}  // namespace pw::lynx
