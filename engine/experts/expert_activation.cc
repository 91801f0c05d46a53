#include "engine/experts/expert_activation.h"

#include <string>

namespace pw::engine {

Result<ExpertActivationFn> ExpertActivationOp(ExpertActivation kind,
                                              const kernels::DenseKernels& k) {
  switch (kind) {
    case ExpertActivation::kSwiGlu:
      return k.silu_mul;
  }
  return Unsupported("expert activation kind " + std::to_string(static_cast<int>(kind)) +
                     " is not implemented by the CPU expert runners");
}

}  // namespace pw::engine
