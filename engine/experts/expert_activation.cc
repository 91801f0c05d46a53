#include "engine/experts/expert_activation.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace pw::engine {

void ClampedSwiGlu(const float* gate, const float* up, size_t n, float* out) {
  constexpr float kAlpha = 1.702f, kLimit = 7.f;
  for (size_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], kLimit);
    const float u = std::clamp(up[i], -kLimit, kLimit);
    out[i] = (u + 1.f) * (g / (1.f + std::exp(-kAlpha * g)));
  }
}

void GeluTanhMul(const float* gate, const float* up, size_t n, float* out) {
  const float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.f + std::tanh(kC * (g + 0.044715f * g * g * g))) * up[i];
  }
}

Result<ExpertActivationFn> ExpertActivationOp(ExpertActivation kind,
                                              const kernels::DenseKernels& k) {
  switch (kind) {
    case ExpertActivation::kSwiGlu:
      return k.silu_mul;
    case ExpertActivation::kClampedSwiGlu:
      return &ClampedSwiGlu;
    case ExpertActivation::kGeluTanh:
      return &GeluTanhMul;
  }
  return Unsupported("expert activation kind " + std::to_string(static_cast<int>(kind)) +
                     " is not implemented by the CPU expert runners");
}

}  // namespace pw::engine
