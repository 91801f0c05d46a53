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

Result<ExpertActivationFn> ExpertActivationOp(ExpertActivation kind,
                                              const kernels::DenseKernels& k) {
  switch (kind) {
    case ExpertActivation::kSwiGlu:
      return k.silu_mul;
    case ExpertActivation::kClampedSwiGlu:
      return &ClampedSwiGlu;
  }
  return Unsupported("expert activation kind " + std::to_string(static_cast<int>(kind)) +
                     " is not implemented by the CPU expert runners");
}

}  // namespace pw::engine
