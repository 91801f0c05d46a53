// The backends of the kernels layer: one enum for every kernel family (the dense op table,
// paged attention, the any-precision and int8 kernels) and every device (CPU, CUDA).
//
// A family implements the ops it has on the backends it has: the dense op table
// (kernels/dense_ops.h) on all five, the any-precision and int8 kernels (kernels/anyprec) on the
// CPU ones only, and each family says which it has (anyprec::BackendAvailable,
// anyprec::Q8BackendAvailable). BackendSupported() below is the machine's side: whether this
// binary and the hardware running it can execute the backend at all.
#pragma once

namespace pw::kernels {

// kScalar is the reference that defines correct (plain C++, no ISA flags). kAvx2 (AVX2 + FMA)
// and kAvx512 are the x86 SIMD backends. kAmx is the AVX-512 backend with its matmuls on AMX
// tiles (AMX-BF16 for the dense table, AMX-INT8 for the int8 fast path). kCuda runs on an
// NVIDIA GPU (kernels/cuda); its ops read and write device memory.
// The values are ordered from the most portable CPU level up (BestIsa's override may only lower
// a level); kCuda comes last and is never a CPU level.
enum class Backend : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3, kCuda = 4 };

// Every backend, in enum order: what a test or a report iterates over.
inline constexpr Backend kAllBackends[] = {Backend::kScalar, Backend::kAvx2, Backend::kAvx512,
                                           Backend::kAmx, Backend::kCuda};

// The backend's name as flags (PW_CPU_ISA, PW_ANYPREC_BACKEND), logs and benchmarks spell it:
// "scalar", "avx2", "avx512", "amx", "cuda".
constexpr const char* BackendName(Backend backend) {
  switch (backend) {
    case Backend::kScalar:
      return "scalar";
    case Backend::kAvx2:
      return "avx2";
    case Backend::kAvx512:
      return "avx512";
    case Backend::kAmx:
      return "amx";
    case Backend::kCuda:
      return "cuda";
  }
  return "unknown";
}

// True when this binary has the backend and the machine running it can execute it: for the CPU
// levels, the CPU's features as the dense op table needs them (kAmx: AMX-TILE, AMX-BF16,
// AVX512-BF16 and the kernel's leave to use the tile state); for kCuda, the CUDA kernels linked
// into this binary (kernels/cuda, built with PW_CUDA) and at least one CUDA device present.
// Defined in kernels/cpu/dispatch.cc (pw_kernels_cpu); the kCuda answer comes from
// cuda::DevicePresent() (kernels/cuda/dense.cuh) when that library is linked in, and is false
// otherwise, so CPU-only binaries carry no CUDA dependency.
bool BackendSupported(Backend backend);

// True for the backends whose ops take host pointers (every one but kCuda).
constexpr bool IsCpuBackend(Backend backend) { return backend != Backend::kCuda; }

}  // namespace pw::kernels
