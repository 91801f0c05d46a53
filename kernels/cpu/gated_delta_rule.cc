#include "kernels/cpu/gated_delta_rule.h"

#include <cmath>
#include <memory>

namespace pw::cpu {

void CausalConv1dSiluStep(const float* x, const float* weight, size_t channels, size_t kernel,
                          float* state, float* out) {
  const size_t keep = kernel - 1;
  for (size_t c = 0; c < channels; ++c) {
    const float* w = weight + c * kernel;
    float* s = state + c * keep;
    float acc = w[keep] * x[c];
    for (size_t j = 0; j < keep; ++j) acc += w[j] * s[j];
    for (size_t j = 0; j + 1 < keep; ++j) s[j] = s[j + 1];
    if (keep > 0) s[keep - 1] = x[c];
    out[c] = acc / (1.f + std::exp(-acc));
  }
}

void GatedDeltaRuleStep(const float* q, const float* k, const float* v, float g, float beta,
                        size_t dk, size_t dv, float* state, float* out) {
  const float decay = std::exp(g);
  // delta[j] = beta * (v[j] - sum_i decay * S[i][j] k[i]); the decay is applied while reading.
  for (size_t j = 0; j < dv; ++j) out[j] = 0.f;
  for (size_t i = 0; i < dk; ++i) {
    float* row = state + i * dv;
    for (size_t j = 0; j < dv; ++j) {
      row[j] *= decay;
      out[j] += row[j] * k[i];
    }
  }
  for (size_t j = 0; j < dv; ++j) out[j] = beta * (v[j] - out[j]);
  // S += k delta^T, and o = S^T q over the updated S. `out` holds delta until the last row.
  float delta_local[512];
  float* delta = dv <= 512 ? delta_local : nullptr;
  std::unique_ptr<float[]> heap;
  if (delta == nullptr) {
    heap.reset(new float[dv]);
    delta = heap.get();
  }
  for (size_t j = 0; j < dv; ++j) {
    delta[j] = out[j];
    out[j] = 0.f;
  }
  for (size_t i = 0; i < dk; ++i) {
    float* row = state + i * dv;
    const float ki = k[i], qi = q[i];
    for (size_t j = 0; j < dv; ++j) {
      row[j] += ki * delta[j];
      out[j] += row[j] * qi;
    }
  }
}

void L2NormalizeInPlace(float* x, size_t n, float eps) {
  float ss = 0.f;
  for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss + eps);
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace pw::cpu
