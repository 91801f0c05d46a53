#include "policies/misses/synthetic_trace.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace pw::misses {

Status WriteSyntheticTrace(const std::string& path, const TraceHeader& header, int steps,
                           int tokens_per_step, uint32_t seed) {
  if (steps < 0 || tokens_per_step < 1) return InvalidArgument("synthetic trace: bad size");
  auto w = RouterTraceWriter::Create(path, header);
  if (!w.ok()) return w.status();
  const size_t L = header.num_layers, E = header.num_experts, k = header.top_k;
  const size_t T = static_cast<size_t>(tokens_per_step);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> state(L * E);
  for (float& v : state) v = 2.f * nd(rng);
  std::vector<float> logits(T * E), weights(T * k);
  std::vector<int32_t> experts(T * k), idx(E);
  for (int s = 0; s < steps; ++s) {
    for (size_t l = 0; l < L; ++l) {
      for (size_t t = 0; t < T; ++t) {
        float* row = logits.data() + t * E;
        for (size_t e = 0; e < E; ++e) {
          float& v = state[l * E + e];
          v = 0.9f * v + 0.6f * nd(rng);
          row[e] = v;
        }
        for (size_t e = 0; e < E; ++e) idx[e] = static_cast<int32_t>(e);
        std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                          [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
        double sum = 0;
        for (size_t j = 0; j < k; ++j) sum += std::exp(row[idx[j]] - row[idx[0]]);
        for (size_t j = 0; j < k; ++j) {
          experts[t * k + j] = idx[j];
          weights[t * k + j] = static_cast<float>(std::exp(row[idx[j]] - row[idx[0]]) / sum);
        }
      }
      PW_RETURN_IF_ERROR((*w)->Append(static_cast<uint32_t>(l), static_cast<uint64_t>(s), T, nullptr,
                                      nullptr, logits.data(), experts.data(), weights.data()));
    }
  }
  return (*w)->Close();
}

}  // namespace pw::misses
