// AVX2 helpers shared by the AVX2 and AVX-512 kernel files. Include only from translation units
// compiled with -mavx2 -mfma (pw_simd_sources); never from code that runs before dispatch.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/dense.h"

namespace pw::cpu::avx2 {

inline float ToF32(float v) { return v; }
inline float ToF32(uint16_t v) { return Bf16Bits(v); }

// Loads 8 consecutive weights as fp32 (bf16 widened by a 16-bit shift).
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float HSum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline float HMax(__m256 v) {
  __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// exp(x) for 8 lanes: range reduction x = n*ln2 + r, |r| <= ln2/2, degree-6 polynomial for
// exp(r), scale by 2^n through the exponent bits. Relative error ~2 ulp over the normal range.
// Inputs below -87.3 (including -inf) give 0; inputs above 88.3 saturate at ~2.2e38.
inline __m256 Exp(__m256 x) {
  const __m256 lo_bound = _mm256_set1_ps(-87.3f);
  const __m256 keep = _mm256_cmp_ps(x, lo_bound, _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo_bound), _mm256_set1_ps(88.3f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i n = _mm256_cvtps_epi32(fx);
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}

}  // namespace pw::cpu::avx2
