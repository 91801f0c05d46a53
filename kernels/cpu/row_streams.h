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

// Calls rows_fn(std::integral_constant<int, R>{}, n) with R row indices n[0..R-1]: R = S for a
// row of each part, R = 1 for each row left over.
template <int S, typename RowsFn>
inline void ForRowStreams(size_t n_begin, size_t n_end, RowsFn&& rows_fn) {
  const size_t part = (n_end - n_begin) / S;
  size_t n[S];
  for (size_t i = 0; i < part; ++i) {
    for (int s = 0; s < S; ++s) n[s] = n_begin + s * part + i;
    rows_fn(std::integral_constant<int, S>{}, n);
  }
  for (size_t r = n_begin + S * part; r < n_end; ++r) {
    n[0] = r;
    rows_fn(std::integral_constant<int, 1>{}, n);
  }
}

// Calls gemv(std::integral_constant<int, R>{}, rows, outs) with R row pointers (w + n * K) and
// their outputs (y + n), rows as ForRowStreams walks them.
template <int S, typename Gemv>
inline void WalkRowStreams(const uint16_t* w, size_t K, size_t n_begin, size_t n_end, float* y,
                           Gemv&& gemv) {
  ForRowStreams<S>(n_begin, n_end, [&](auto r, const size_t* n) {
    constexpr int R = decltype(r)::value;
    const uint16_t* rows[R];
    float* outs[R];
    for (int s = 0; s < R; ++s) {
      rows[s] = w + n[s] * K;
      outs[s] = y + n[s];
    }
    gemv(r, rows, outs);
  });
}

}  // namespace pw::cpu
