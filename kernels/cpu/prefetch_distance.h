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
// on 14336-column rows). Into which cache level it prefetches is chosen per CPU too
// (StreamPrefetchLevel below).
// PW_PREFETCH_BYTES=N (0..65536) overrides the distance, PW_PREFETCH_LEVEL=l1|l2 the level, for
// tuning on another CPU.
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

// Whether the CPU's vendor string is AMD's.
inline bool IsAmdCpu() {
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
  return amd;
}

// The distance for this CPU, or PW_PREFETCH_BYTES's (a bad value is reported on stderr and
// ignored). PrefetchBytes() asks once per process.
inline size_t DefaultPrefetchBytes() {
  const size_t chosen = IsAmdCpu() ? 0 : 2048;
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

// The cache level the any-precision fast path's plane and LUT streams are prefetched into
// (q8_avx512_decode.inc, q8_avx2.cc):
//   - AMD (measured on Zen 4): L2 (PREFETCHT1). One token, two threads, rows read from DRAM:
//     4, 6 and 8 bits at 14336x4096 0.86x, 0.91x and 0.90x the time of L1 prefetches
//     (PREFETCHT0) at the same 2 KiB, 16 tokens unchanged (docs/benchmarks.md, "The plane
//     streams prefetched into L2 on AMD"). Hypothesis, not measured (no PMU here): an L1
//     prefetch holds one of the core's few L1 miss buffers until its line arrives, and 4-8
//     streams 2 KiB ahead ask for more lines than there are buffers; an L2 prefetch does not.
//   - elsewhere: L1, as tuned on the Xeon (an L2 prefetch there is not measured).
enum class PrefetchLevel { kL1, kL2 };

// The level for this CPU, or PW_PREFETCH_LEVEL's ("l1" or "l2"; anything else is reported on
// stderr and ignored). StreamPrefetchLevel() asks once per process.
inline PrefetchLevel DefaultStreamPrefetchLevel() {
  const PrefetchLevel chosen = IsAmdCpu() ? PrefetchLevel::kL2 : PrefetchLevel::kL1;
  const char* env = KernelKnob("PW_PREFETCH_LEVEL");
  if (env == nullptr || *env == '\0') return chosen;
  if (std::strcmp(env, "l1") == 0) return PrefetchLevel::kL1;
  if (std::strcmp(env, "l2") == 0) return PrefetchLevel::kL2;
  std::fprintf(stderr, "PW_PREFETCH_LEVEL=%s is not l1 or l2; using %s\n", env,
               chosen == PrefetchLevel::kL2 ? "l2" : "l1");
  return chosen;
}

inline PrefetchLevel StreamPrefetchLevel() {
  static const PrefetchLevel level = DefaultStreamPrefetchLevel();
  return level;
}

// Prefetches the line at p into level L (PREFETCHT0 or PREFETCHT1 on x86). The level is a
// template argument: the kernels are instantiated per level and one is picked per call, since
// a test of a run-time level at every prefetch cost 7-17 % of the one-token 4-bit rows.
template <PrefetchLevel L>
inline void PrefetchLine(const void* p) {
  __builtin_prefetch(p, 0, L == PrefetchLevel::kL2 ? 2 : 3);
}

}  // namespace pw::cpu
