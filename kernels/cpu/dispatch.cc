// Run-time choice of the dense kernel backend.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/dense.h"

namespace pw::cpu {

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
    case Isa::kAvx512:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
  }
  return false;
}

Isa BestIsa() {
  Isa best = Isa::kScalar;
  if (IsaSupported(Isa::kAvx512)) {
    best = Isa::kAvx512;
  } else if (IsaSupported(Isa::kAvx2)) {
    best = Isa::kAvx2;
  }
  if (const char* env = std::getenv("PW_CPU_ISA")) {
    Isa want = best;
    if (std::strcmp(env, "scalar") == 0) want = Isa::kScalar;
    if (std::strcmp(env, "avx2") == 0) want = Isa::kAvx2;
    if (std::strcmp(env, "avx512") == 0) want = Isa::kAvx512;
    if (static_cast<int>(want) < static_cast<int>(best) && IsaSupported(want)) best = want;
  }
  return best;
}

const DenseKernels& KernelsFor(Isa isa) {
  if (!IsaSupported(isa)) {
    std::fprintf(stderr, "%s:%d: CPU kernel backend %s requested but not supported here\n",
                 __FILE__, __LINE__, IsaName(isa));
    std::abort();
  }
  switch (isa) {
    case Isa::kAvx512:
      return kAvx512Kernels;
    case Isa::kAvx2:
      return kAvx2Kernels;
    case Isa::kScalar:
      break;
  }
  return kScalarKernels;
}

const DenseKernels& Kernels() {
  static const DenseKernels& table = KernelsFor(BestIsa());
  return table;
}

}  // namespace pw::cpu
