#include "policies/misses/gate_ranks.h"

namespace pw::misses {

GateRanks GateWeightsByRank(const RouterTrace& trace, float threshold) {
  const size_t k = trace.header.top_k;
  GateRanks g;
  g.mean.assign(k, 0.0);
  g.share_at_least.assign(k, 0.0);
  for (const TraceLayer& rec : trace.layers) {
    const size_t T = rec.num_tokens();
    for (size_t t = 0; t < T; ++t) {
      for (size_t r = 0; r < k; ++r) {
        const float w = rec.weights[t * k + r];
        g.mean[r] += w;
        if (w >= threshold) g.share_at_least[r] += 1;
      }
    }
    g.selections += T;
  }
  if (g.selections > 0) {
    for (size_t r = 0; r < k; ++r) {
      g.mean[r] /= static_cast<double>(g.selections);
      g.share_at_least[r] /= static_cast<double>(g.selections);
    }
  }
  return g;
}

}  // namespace pw::misses
