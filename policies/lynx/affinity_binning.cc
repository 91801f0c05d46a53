#include "policies/lynx/affinity_binning.h"

#include <cstddef>

namespace pw::lynx {

void AffinityBins(const float* logits, int num_tokens, int num_experts, const LynxParams& p,
                  int8_t* bins) {
  const size_t N = static_cast<size_t>(num_experts);
  for (size_t t = 0; t < static_cast<size_t>(num_tokens); ++t) {
    const float* row = logits + t * N;
    float mx = -INFINITY;
    for (size_t e = 0; e < N; ++e) {
      if (std::isfinite(row[e]) && row[e] > mx) mx = row[e];
    }
    for (size_t e = 0; e < N; ++e) {
      bins[t * N + e] = static_cast<int8_t>(AffinityBin(row[e] - mx, p));
    }
  }
}

}  // namespace pw::lynx
