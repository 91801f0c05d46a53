// Run-time choice of the dense kernel backend.
#include <cstdio>
#include <cstdlib>
#include <cstring>

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
  static const bool usable = IsaSupported(Isa::kAvx512) && CpuHasAvx512Bf16();
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

bool UsesAvx512Bf16(const DenseKernels& k) { return &k == &kAvx512Bf16ActsKernels; }

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAmx:
      return "amx";
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
    case Isa::kAmx: {
#if defined(__x86_64__)
      static const bool usable = IsaSupported(Isa::kAvx512) && AmxUsable();
      return usable;
#else
      return false;
#endif
    }
  }
  return false;
}

Isa BestIsa() {
  Isa best = Isa::kScalar;
  if (IsaSupported(Isa::kAmx)) {
    best = Isa::kAmx;
  } else if (IsaSupported(Isa::kAvx512)) {
    best = Isa::kAvx512;
  } else if (IsaSupported(Isa::kAvx2)) {
    best = Isa::kAvx2;
  }
  if (const char* env = KernelKnob("PW_CPU_ISA")) {
    Isa want = best;
    if (std::strcmp(env, "scalar") == 0) want = Isa::kScalar;
    if (std::strcmp(env, "avx2") == 0) want = Isa::kAvx2;
    if (std::strcmp(env, "avx512") == 0) want = Isa::kAvx512;
    if (std::strcmp(env, "amx") == 0) want = Isa::kAmx;
    if (static_cast<int>(want) < static_cast<int>(best) && IsaSupported(want)) best = want;
  }
  return best;
}

const DenseKernels& KernelsFor(Isa isa, bool batch_invariant, bool bf16_activations) {
  if (!IsaSupported(isa)) {
    std::fprintf(stderr, "%s:%d: CPU kernel backend %s requested but not supported here\n",
                 __FILE__, __LINE__, IsaName(isa));
    std::abort();
  }
  if (bf16_activations) {
    switch (isa) {
      case Isa::kAmx:
      case Isa::kAvx512:
        return Avx512Bf16Usable() ? kAvx512Bf16ActsKernels : kAvx2Bf16ActsKernels;
      case Isa::kAvx2:
        return kAvx2Bf16ActsKernels;
      case Isa::kScalar:
        break;
    }
    return kScalarBf16ActsKernels;
  }
  switch (isa) {
    case Isa::kAmx:
      return batch_invariant ? kAmxInvariantKernels : kAmxKernels;
    case Isa::kAvx512:
      return batch_invariant ? kAvx512InvariantKernels : kAvx512Kernels;
    case Isa::kAvx2:
      return kAvx2Kernels;
    case Isa::kScalar:
      break;
  }
  return kScalarKernels;
}

bool BatchInvariantRequested() { return EnvFlag("PW_BATCH_INVARIANT"); }

bool Bf16ActivationsRequested() { return EnvFlag("PW_BF16_ACTIVATIONS"); }

const DenseKernels& Kernels() {
  static const DenseKernels& table =
      KernelsFor(BestIsa(), BatchInvariantRequested(), Bf16ActivationsRequested());
  return table;
}

}  // namespace pw::cpu
