// The rows of a one-token GEMV walked as a few long sequential streams (the AVX2 and AVX-512
// backends' GEMVs, dense_avx2.cc and dense_avx512.cc): a thread's rows [n_begin, n_end) are cut
// into kGemvStreams contiguous parts walked in lockstep, one row of each part per pass, so the
// thread keeps that many long streams open (the way the bandwidth probe reads fastest) instead
// of short runs of adjacent rows that end every few KiB. The rows left over go one at a time.
// No SIMD here: each backend's translation unit instantiates it with its own kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace pw::cpu {

inline constexpr int kGemvStreams = 4;

// Calls gemv(std::integral_constant<int, R>{}, rows, outs) with R row pointers (w + n * K) and
// their outputs (y + n): R = S for a row of each part, R = 1 for each row left over.
template <int S, typename Gemv>
inline void WalkRowStreams(const uint16_t* w, size_t K, size_t n_begin, size_t n_end, float* y,
                           Gemv&& gemv) {
  const size_t part = (n_end - n_begin) / S;
  const uint16_t* rows[S];
  float* outs[S];
  for (size_t i = 0; i < part; ++i) {
    for (int s = 0; s < S; ++s) {
      const size_t n = n_begin + s * part + i;
      rows[s] = w + n * K;
      outs[s] = y + n;
    }
    gemv(std::integral_constant<int, S>{}, rows, outs);
  }
  for (size_t n = n_begin + S * part; n < n_end; ++n) {
    rows[0] = w + n * K;
    outs[0] = y + n;
    gemv(std::integral_constant<int, 1>{}, rows, outs);
  }
}

}  // namespace pw::cpu
