// How far ahead the dense bf16 kernels (kernels/cpu: the few-token GEMV and the AVX-512 tiles)
// prefetch each weight row's stream with software prefetches, chosen once per process at run
// time. The right distance depends on the core's hardware prefetchers, not on the instruction
// set:
//   - Intel (the Xeon of docs/benchmarks.md): 2 KiB ahead, as every streaming kernel there;
//   - AMD (measured on Zen 4): none. The hardware prefetchers alone read faster: the bf16 GEMV
//     at 1024x2048 and 2048x1024, one token, 1.25x and 1.32x faster without (three alternated
//     runs; 14336x4096 and 4096x14336 equal within noise), at 28-29 GB/s, the one-stream read
//     (docs/benchmarks.md, "Software prefetch on AMD Zen 4").
// The any-precision fast path keeps its 2 KiB on every CPU (q8_avx512_decode.inc): its b plane
// streams measured mixed without prefetches on Zen 4 (1.04-1.12x at 6-8 bits, 0.71x at 3 bits
// on 14336-column rows).
// PW_PREFETCH_BYTES=N (0..65536) overrides the choice, for tuning on another CPU.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/kernel_settings.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace pw::cpu {

inline constexpr size_t kMaxPrefetchBytes = 65536;

// The distance for this CPU, or PW_PREFETCH_BYTES's (a bad value is reported on stderr and
// ignored). PrefetchBytes() asks once per process.
inline size_t DefaultPrefetchBytes() {
  bool amd = false;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    char vendor[13];
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    vendor[12] = '\0';
    amd = std::strcmp(vendor, "AuthenticAMD") == 0;
  }
#endif
  const size_t chosen = amd ? 0 : 2048;
  const char* env = KernelKnob("PW_PREFETCH_BYTES");
  if (env == nullptr || *env == '\0') return chosen;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (env[0] < '0' || env[0] > '9' || *end != '\0' || v > kMaxPrefetchBytes) {
    std::fprintf(stderr, "PW_PREFETCH_BYTES=%s is not a byte count in [0, %zu]; using %zu\n", env,
                 kMaxPrefetchBytes, chosen);
    return chosen;
  }
  return static_cast<size_t>(v);
}

inline size_t PrefetchBytes() {
  static const size_t bytes = DefaultPrefetchBytes();
  return bytes;
}

}  // namespace pw::cpu
