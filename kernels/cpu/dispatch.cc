// Run-time choice of the dense kernel backend.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/backend.h"
#include "kernels/cpu/amx_permission.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/kernel_settings.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace pw::cpu {
namespace {

#if defined(__x86_64__)
// AVX512-BF16: CPUID.7.1:EAX bit 5.
bool CpuHasAvx512Bf16() {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1) != 0;
}

// AMX-TILE + AMX-BF16 (CPUID.7.0:EDX bits 24, 22), AVX512-BF16, the OS saving the tile state
// (XCR0 bits 17, 18), and the kernel's leave for this process to use it (Linux asks for it
// once: arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
bool AmxUsable() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (((d >> 24) & 1) == 0 || ((d >> 22) & 1) == 0) return false;
  if (!CpuHasAvx512Bf16()) return false;
  return AmxTileStatePermitted();
}
#endif

// The AVX-512 backend and AVX512-BF16 (the bf16-activation table's vdpbf16ps).
bool Avx512Bf16Usable() {
#if defined(__x86_64__)
  static const bool usable =
      kernels::BackendSupported(kernels::Backend::kAvx512) && CpuHasAvx512Bf16();
  return usable;
#else
  return false;
#endif
}

// True when the knob `name` (kernel_settings.h: the environment variable, else the setting) is "1".
bool EnvFlag(const char* name) {
  const char* env = KernelKnob(name);
  return env != nullptr && std::strcmp(env, "1") == 0;
}

}  // namespace

bool UsesAvx512Bf16(const kernels::DenseKernels& k) { return &k == &kAvx512Bf16ActsKernels; }

}  // namespace pw::cpu

// The CUDA library's answer (kernels/cuda/dense.cuh), weak so that this CPU library links alone:
// without the CUDA kernels in the binary the symbol stays null and kCuda is unsupported.
namespace pw::cuda {
[[gnu::weak]] bool DevicePresent();
}  // namespace pw::cuda

namespace pw::kernels {

bool BackendSupported(Backend backend) {
  switch (backend) {
    case Backend::kScalar:
      return true;
    case Backend::kAvx2:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
    case Backend::kAvx512:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
    case Backend::kAmx: {
#if defined(__x86_64__)
      static const bool usable = BackendSupported(Backend::kAvx512) && cpu::AmxUsable();
      return usable;
#else
      return false;
#endif
    }
    case Backend::kCuda:
      return &cuda::DevicePresent != nullptr && cuda::DevicePresent();
  }
  return false;
}

}  // namespace pw::kernels

namespace pw::cpu {

using kernels::Backend;

Backend BestIsa() {
  Backend best = Backend::kScalar;
  if (kernels::BackendSupported(Backend::kAmx)) {
    best = Backend::kAmx;
  } else if (kernels::BackendSupported(Backend::kAvx512)) {
    best = Backend::kAvx512;
  } else if (kernels::BackendSupported(Backend::kAvx2)) {
    best = Backend::kAvx2;
  }
  if (const char* env = KernelKnob("PW_CPU_ISA")) {
    Backend want = best;
    if (std::strcmp(env, "scalar") == 0) want = Backend::kScalar;
    if (std::strcmp(env, "avx2") == 0) want = Backend::kAvx2;
    if (std::strcmp(env, "avx512") == 0) want = Backend::kAvx512;
    if (std::strcmp(env, "amx") == 0) want = Backend::kAmx;
    if (static_cast<int>(want) < static_cast<int>(best) && kernels::BackendSupported(want)) {
      best = want;
    }
  }
  return best;
}

const kernels::DenseKernels& KernelsFor(Backend isa, bool batch_invariant, bool bf16_activations) {
  if (!kernels::IsCpuBackend(isa) || !kernels::BackendSupported(isa)) {
    std::fprintf(stderr, "%s:%d: CPU kernel backend %s requested but not supported here\n",
                 __FILE__, __LINE__, kernels::BackendName(isa));
    std::abort();
  }
  if (bf16_activations) {
    switch (isa) {
      case Backend::kAmx:
      case Backend::kAvx512:
        if (Avx512Bf16Usable()) return kAvx512Bf16ActsKernels;
        return batch_invariant ? kAvx2Bf16ActsInvariantKernels : kAvx2Bf16ActsKernels;
      case Backend::kAvx2:
        return batch_invariant ? kAvx2Bf16ActsInvariantKernels : kAvx2Bf16ActsKernels;
      case Backend::kScalar:
      case Backend::kCuda:  // refused above
        break;
    }
    return kScalarBf16ActsKernels;
  }
  switch (isa) {
    case Backend::kAmx:
      return batch_invariant ? kAmxInvariantKernels : kAmxKernels;
    case Backend::kAvx512:
      return batch_invariant ? kAvx512InvariantKernels : kAvx512Kernels;
    case Backend::kAvx2:
      return batch_invariant ? kAvx2InvariantKernels : kAvx2Kernels;
    case Backend::kScalar:
    case Backend::kCuda:  // refused above
      break;
  }
  return kScalarKernels;
}

bool BatchInvariantRequested() { return EnvFlag("PW_BATCH_INVARIANT"); }

bool Bf16ActivationsRequested() { return EnvFlag("PW_BF16_ACTIVATIONS"); }

const kernels::DenseKernels& Kernels() {
  static const kernels::DenseKernels& table =
      KernelsFor(BestIsa(), BatchInvariantRequested(), Bf16ActivationsRequested());
  return table;
}

}  // namespace pw::cpu
