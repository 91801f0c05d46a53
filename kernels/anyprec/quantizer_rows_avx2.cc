// AVX2 backends of the quantizer's per-row steps (quantizer_rows.h): the same operations per
// lane as the scalar references, in the same order per accumulator, so the same bits. Built
// with -ffp-contract=off: a multiply feeding an add must not become an FMA here.
#include <immintrin.h>

#include "kernels/anyprec/quantizer_rows.h"

namespace pw::anyprec::internal {

int BestCutAvx2(const double* sv, const double* s0, const double* s1, int a, int b) {
  if (b - a - 1 < 4) return BestCutScalar(sv, s0, s1, a, b);
  const double m = s0[b] - s0[a], mu = (s1[b] - s1[a]) / m;
  const __m256d vm = _mm256_set1_pd(m), vmu = _mm256_set1_pd(mu);
  const __m256d base0 = _mm256_set1_pd(s0[a]), base1 = _mm256_set1_pd(s1[a]);
  const __m256d zero = _mm256_setzero_pd(), minus_one = _mm256_set1_pd(-1.0);
  // Per lane: the best score so far and the first index reaching it (as a double: exact). The
  // best follows by vmaxpd, so the loop's chain is one max; the index by a blend beside it.
  __m256d best = minus_one;
  __m256d cut = _mm256_set1_pd(static_cast<double>(b));
  auto step = [&](int i, __m256d idx) {
    const __m256d x = _mm256_loadu_pd(sv + i), prev = _mm256_loadu_pd(sv + i - 1);
    const __m256d ml = _mm256_sub_pd(_mm256_loadu_pd(s0 + i), base0);
    const __m256d ql = _mm256_sub_pd(_mm256_loadu_pd(s1 + i), base1);
    const __m256d mr = _mm256_sub_pd(vm, ml), cl = _mm256_sub_pd(ql, _mm256_mul_pd(ml, vmu));
    const __m256d valid = _mm256_and_pd(_mm256_cmp_pd(x, prev, _CMP_NEQ_UQ),
                                        _mm256_and_pd(_mm256_cmp_pd(ml, zero, _CMP_NLE_UQ),
                                                      _mm256_cmp_pd(mr, zero, _CMP_NLE_UQ)));
    // An invalid candidate scores -1: never above a lane's best.
    const __m256d score =
        _mm256_blendv_pd(minus_one, _mm256_div_pd(_mm256_mul_pd(cl, cl), _mm256_mul_pd(ml, mr)), valid);
    cut = _mm256_blendv_pd(cut, idx, _mm256_cmp_pd(score, best, _CMP_GT_OQ));
    best = _mm256_max_pd(best, score);
  };
  int i = a + 1;
  const __m256d four = _mm256_set1_pd(4.0);
  __m256d idx = _mm256_add_pd(_mm256_set1_pd(static_cast<double>(i)), _mm256_setr_pd(0, 1, 2, 3));
  for (; i + 4 <= b; i += 4, idx = _mm256_add_pd(idx, four)) step(i, idx);
  // The last candidates as the four ending at b, overlapping ones already seen: a candidate
  // seen twice has the same score, and a lane keeps its index unless strictly beaten.
  if (i < b) step(b - 4, _mm256_add_pd(_mm256_set1_pd(static_cast<double>(b - 4)), _mm256_setr_pd(0, 1, 2, 3)));
  // The first index of the largest score over the lanes: the largest score, then the least
  // index among the lanes holding it (b when every lane holds -1, so no candidate was valid).
  __m256d top = _mm256_max_pd(best, _mm256_permute2f128_pd(best, best, 1));
  top = _mm256_max_pd(top, _mm256_permute_pd(top, 0b0101));
  const __m256d none = _mm256_set1_pd(static_cast<double>(b));
  __m256d at = _mm256_blendv_pd(none, cut, _mm256_cmp_pd(best, top, _CMP_EQ_OQ));
  at = _mm256_min_pd(at, _mm256_permute2f128_pd(at, at, 1));
  at = _mm256_min_pd(at, _mm256_permute_pd(at, 0b0101));
  return static_cast<int>(_mm256_cvtsd_f64(at));
}

void RowDamageAvx2(const double* sv, const double* sh, const uint8_t* leaf, int n, const RowLuts& luts,
                   double* d, double* d64) {
  // Per leaf code, the centroid of each width in three vectors: widths 3..6 (fp16), then
  // 7, 8 (fp16) and 7, 8 (fp64), then 3..6 (fp64). Each lane accumulates one width's sum in
  // order of i, as the scalar loops do.
  alignas(32) double table[256][12];
  for (int c = 0; c < 256; ++c) {
    double* t = table[c];
    for (int b = 3; b <= 6; ++b) {
      t[b - 3] = luts.lut[b][c >> (kMaxBits - b)];
      t[8 + b - 3] = luts.lut64[b][c >> (kMaxBits - b)];
    }
    t[4] = luts.lut[7][c >> 1];
    t[5] = luts.lut[8][c];
    t[6] = luts.lut64[7][c >> 1];
    t[7] = luts.lut64[8][c];
  }
  __m256d acc_a = _mm256_setzero_pd(), acc_b = _mm256_setzero_pd(), acc_c = _mm256_setzero_pd();
  double d0 = 0;
  for (int i = 0; i < n; ++i) {
    const double* t = table[leaf[i]];
    const __m256d v = _mm256_set1_pd(sv[i]), h = _mm256_set1_pd(sh[i]);
    const __m256d ea = _mm256_sub_pd(v, _mm256_load_pd(t));
    const __m256d eb = _mm256_sub_pd(v, _mm256_load_pd(t + 4));
    const __m256d ec = _mm256_sub_pd(v, _mm256_load_pd(t + 8));
    acc_a = _mm256_add_pd(acc_a, _mm256_mul_pd(_mm256_mul_pd(h, ea), ea));
    acc_b = _mm256_add_pd(acc_b, _mm256_mul_pd(_mm256_mul_pd(h, eb), eb));
    acc_c = _mm256_add_pd(acc_c, _mm256_mul_pd(_mm256_mul_pd(h, ec), ec));
    d0 += sh[i] * sv[i] * sv[i];
  }
  alignas(32) double a[4], bb[4], c[4];
  _mm256_store_pd(a, acc_a);
  _mm256_store_pd(bb, acc_b);
  _mm256_store_pd(c, acc_c);
  for (int b = 3; b <= 6; ++b) {
    d[b] = a[b - 3];
    d64[b] = c[b - 3];
  }
  d[7] = bb[0];
  d[8] = bb[1];
  d64[7] = bb[2];
  d64[8] = bb[3];
  d[0] = d0;
  d64[0] = d0;
}

void HalfLutAvx2(const double* mu, int count, uint16_t* half, double* back) {
  for (int c = 0; c < count; c += 8) {
    // double -> float rounds to nearest even (MXCSR's default, as static_cast), then F16C.
    const __m256 f = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(mu + c + 4)),
                                     _mm256_cvtpd_ps(_mm256_loadu_pd(mu + c)));
    const __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(half + c), h);
    const __m256 g = _mm256_cvtph_ps(h);
    _mm256_storeu_pd(back + c, _mm256_cvtps_pd(_mm256_castps256_ps128(g)));
    _mm256_storeu_pd(back + c + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(g, 1)));
  }
}

}  // namespace pw::anyprec::internal
