// AVX2/FMA backend of the dense CPU kernels (compiled with -mavx2 -mfma; selected at run time).
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/dense.h"
#include "kernels/cpu/prefetch_distance.h"
#include "kernels/cpu/row_streams.h"
#include "kernels/cpu/simd_avx2.h"

namespace pw::cpu {
namespace {

// Each lane of x rounded to bf16 (nearest, ties to even) and widened back, as ToBf16Bits: a NaN
// stays a NaN (its top half with the quiet bit set), where the rounding add could carry it into
// an infinity or a zero.
inline __m256 RoundToBf16(__m256 x) {
  const __m256i top = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
  const __m256 rounded = _mm256_castsi256_ps(_mm256_and_si256(r, top));
  const __m256 nan =
      _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(u, top), _mm256_set1_epi32(0x00400000)));
  return _mm256_blendv_ps(rounded, nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// Computes a tile of RR weight rows x TT tokens: y[t*ldy + r] for r < RR, t < TT.
// w points at the first row of the tile; x at the first token.
template <int RR, int TT, typename W>
inline void TileAvx2(const float* x, size_t ldx, const W* w, size_t K, float* y, size_t ldy) {
  __m256 acc[RR][TT];
  for (int r = 0; r < RR; ++r)
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_setzero_ps();
  size_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[RR];
    for (int r = 0; r < RR; ++r) wv[r] = avx2::Load8(w + r * K + k);
    for (int t = 0; t < TT; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * ldx + k);
      for (int r = 0; r < RR; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < RR; ++r) {
    for (int t = 0; t < TT; ++t) {
      float s = avx2::HSum(acc[r][t]);
      for (size_t kk = k; kk < K; ++kk) {
        s += x[t * ldx + kk] * avx2::ToF32(w[r * K + kk]);
      }
      y[t * ldy + r] = s;
    }
  }
}

template <int RR, typename W>
inline void TileTokens(const float* x, size_t ldx, size_t T, const W* w, size_t K, float* y,
                       size_t ldy) {
  size_t t = 0;
  for (; t + 4 <= T; t += 4) TileAvx2<RR, 4, W>(x + t * ldx, ldx, w, K, y + t * ldy, ldy);
  switch (T - t) {
    case 3:
      TileAvx2<RR, 3, W>(x + t * ldx, ldx, w, K, y + t * ldy, ldy);
      break;
    case 2:
      TileAvx2<RR, 2, W>(x + t * ldx, ldx, w, K, y + t * ldy, ldy);
      break;
    case 1:
      TileAvx2<RR, 1, W>(x + t * ldx, ldx, w, K, y + t * ldy, ldy);
      break;
    default:
      break;
  }
}

// Rows are walked in blocks small enough to stay in L1/L2 while every token group reuses them,
// so a batch reads each weight byte from memory once. Each (row, token) sums in the same order
// whatever T is (8 lanes over K, then the tail).
template <typename W>
void MatmulAvx2(const float* x, size_t ldx, size_t T, const W* w, size_t K, size_t n_begin,
                size_t n_end, float* y, size_t ldy) {
  constexpr size_t kRowBlock = 16;
  for (size_t n0 = n_begin; n0 < n_end; n0 += kRowBlock) {
    const size_t n1 = n0 + kRowBlock < n_end ? n0 + kRowBlock : n_end;
    size_t n = n0;
    if (T == 1) {
      for (; n + 4 <= n1; n += 4) TileAvx2<4, 1, W>(x, ldx, w + n * K, K, y + n, ldy);
    } else {
      // 3 rows x 4 tokens: 12 accumulators + 3 weight vectors + 1 activation = 16 registers.
      for (; n + 3 <= n1; n += 3) TileTokens<3, W>(x, ldx, T, w + n * K, K, y + n, ldy);
    }
    for (; n < n1; ++n) TileTokens<1, W>(x, ldx, T, w + n * K, K, y + n, ldy);
  }
}

// One-token bf16 GEMV over R rows read side by side (the AVX-512 backend's GemvBf16 on 32-byte
// registers): 16 weights per row per step in one load, the even and odd weights widened in place
// by a shift and a mask (no cross-lane shuffle on the weights), against the activations split
// once per step into their even and odd columns (an in-lane shuffle and a 64-bit permute, shared
// by the R rows); two accumulators per row. Each row's stream is prefetched PrefetchBytes()
// ahead (none on AMD by default: prefetch_distance.h). A K tail of 8 goes through one widened
// load against the contiguous activations, the rest scalar. Its summation order differs from the
// tiles', so the batch-invariant tables do not use it.
template <int R>
inline void GemvBf16Avx2(const float* x, const uint16_t* const* w, size_t K, float* const* y) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const size_t ahead = PrefetchBytes();
  size_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
    // In each 128-bit lane (x0's half, x1's half): the even columns, then the odd ones; the
    // 64-bit pairs put back in column order.
    const __m256 e = _mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
    const __m256 o = _mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
    const __m256 xe =
        _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
    const __m256 xo =
        _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
    for (int r = 0; r < R; ++r) {
      if (ahead != 0 && k % 32 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + ahead, _MM_HINT_T0);
      }
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k));
      const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
      acc[r][0] = _mm256_fmadd_ps(we, xe, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(wo, xo, acc[r][1]);
    }
  }
  if (k + 8 <= K) {
    const __m256 xv = _mm256_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) acc[r][0] = _mm256_fmadd_ps(avx2::Load8(w[r] + k), xv, acc[r][0]);
    k += 8;
  }
  for (int r = 0; r < R; ++r) {
    float s = avx2::HSum(_mm256_add_ps(acc[r][0], acc[r][1]));
    for (size_t kk = k; kk < K; ++kk) s += x[kk] * avx2::ToF32(w[r][kk]);
    *y[r] = s;
  }
}

// One token, the rows walked as kGemvStreams long streams (row_streams.h).
void GemvBf16RowsAvx2(const float* x, const uint16_t* w, size_t K, size_t n_begin, size_t n_end,
                      float* y) {
  WalkRowStreams<kGemvStreams>(
      w, K, n_begin, n_end, y, [&](auto r, const uint16_t* const* rows, float* const* outs) {
        GemvBf16Avx2<decltype(r)::value>(x, rows, K, outs);
      });
}

// kInvariant: the tiles at every token count, each (row, token) summed in the same order
// whatever T is (batch-invariant); else one token goes through the GEMV.
template <bool kInvariant>
void MatmulBf16Avx2(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                    size_t n_begin, size_t n_end, float* y, size_t ldy) {
  if (!kInvariant && T == 1) return GemvBf16RowsAvx2(x, w, K, n_begin, n_end, y);
  MatmulAvx2(x, ldx, T, w, K, n_begin, n_end, y, ldy);
}

// The activations are rounded once per call into a per-thread copy, kTokenGroup tokens at a
// time, and the fp32 tiles run on the copy: rounding inside the tiles redid it for every group
// of rows and spilled the 3x4 tile's registers, 1.6-1.9x slower at 8-32 tokens on AVX2
// (docs/benchmarks.md, "Serving on one machine"). The copy grows once per thread to
// kTokenGroup x the longest K (a scratch buffer, as ggml's work buffer); each group re-reads
// the row block's weights, which 64 tokens of products per weight pay for.
// kInvariant: the tiles at every token count (batch-invariant); else one token goes through the
// GEMV.
template <bool kInvariant>
void MatmulBf16ActsBf16Avx2(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                            size_t n_begin, size_t n_end, float* y, size_t ldy) {
  constexpr size_t kTokenGroup = 64;
  thread_local std::vector<float> rounded;
  const size_t group = T < kTokenGroup ? T : kTokenGroup;
  if (rounded.size() < group * K) rounded.resize(group * K);
  for (size_t t0 = 0; t0 < T; t0 += kTokenGroup) {
    const size_t tn = T - t0 < kTokenGroup ? T - t0 : kTokenGroup;
    for (size_t t = 0; t < tn; ++t) {
      const float* src = x + (t0 + t) * ldx;
      float* dst = rounded.data() + t * K;
      size_t k = 0;
      for (; k + 8 <= K; k += 8) _mm256_storeu_ps(dst + k, RoundToBf16(_mm256_loadu_ps(src + k)));
      for (; k < K; ++k) dst[k] = Bf16Bits(ToBf16Bits(src[k]));
    }
    if (!kInvariant && tn == 1) {
      GemvBf16RowsAvx2(rounded.data(), w, K, n_begin, n_end, y + t0 * ldy);
    } else {
      MatmulAvx2<uint16_t>(rounded.data(), K, tn, w, K, n_begin, n_end, y + t0 * ldy, ldy);
    }
  }
}

void MatmulF32Avx2(const float* x, size_t ldx, size_t T, const float* w, size_t K, size_t n_begin,
                   size_t n_end, float* y, size_t ldy) {
  MatmulAvx2(x, ldx, T, w, K, n_begin, n_end, y, ldy);
}

}  // namespace

float DotAvx2(const float* a, const float* b, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8)
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = avx2::HSum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void AxpyAvx2(float alpha, const float* x, size_t n, float* y) {
  const __m256 a = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

namespace {

// QI queries x SJ keys of DotAvx2 at once: per pair its two accumulators (the low and high
// 8 of each 16 columns), the same FMAs in the same order, the same reduction. D % 16 == 0.
template <int QI, int SJ>
void DotTile(const float* q, size_t ldq, const float* keys, size_t D, float scale, float* scores,
             size_t lds) {
  __m256 lo[QI][SJ], hi[QI][SJ];
  for (int i = 0; i < QI; ++i)
    for (int j = 0; j < SJ; ++j) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
  for (size_t c = 0; c < D; c += 16) {
    for (int i = 0; i < QI; ++i) {
      const __m256 q0 = _mm256_loadu_ps(q + i * ldq + c), q1 = _mm256_loadu_ps(q + i * ldq + c + 8);
      for (int j = 0; j < SJ; ++j) {
        lo[i][j] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(keys + j * D + c), lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(keys + j * D + c + 8), hi[i][j]);
      }
    }
  }
  for (int i = 0; i < QI; ++i)
    for (int j = 0; j < SJ; ++j) scores[i * lds + j] = avx2::HSum(_mm256_add_ps(lo[i][j], hi[i][j])) * scale;
}

}  // namespace

void DotRowsAvx2(const float* q, size_t ldq, size_t nq, const float* keys, size_t ns, size_t D,
                 float scale, float* scores, size_t lds) {
  size_t i = 0;
  for (; i + 2 <= nq; i += 2) {
    size_t s = 0;
    for (; s + 3 <= ns; s += 3) DotTile<2, 3>(q + i * ldq, ldq, keys + s * D, D, scale, scores + i * lds + s, lds);
    for (; s < ns; ++s) DotTile<2, 1>(q + i * ldq, ldq, keys + s * D, D, scale, scores + i * lds + s, lds);
  }
  for (; i < nq; ++i) {
    size_t s = 0;
    for (; s + 3 <= ns; s += 3) DotTile<1, 3>(q + i * ldq, ldq, keys + s * D, D, scale, scores + i * lds + s, lds);
    for (; s < ns; ++s) DotTile<1, 1>(q + i * ldq, ldq, keys + s * D, D, scale, scores + i * lds + s, lds);
  }
}

// AxpyAvx2 over ns rows in order, the output held in registers (up to 64 columns at a time):
// each element sees the same FMAs in the same order. D % 16 == 0.
void AxpyRowsAvx2(const float* a, size_t ns, const float* values, size_t D, float* out) {
  constexpr size_t kRegs = 8;
  for (size_t c0 = 0; c0 < D; c0 += 8 * kRegs) {
    const size_t nr = (D - c0) / 8 < kRegs ? (D - c0) / 8 : kRegs;
    __m256 o[kRegs];
    for (size_t r = 0; r < nr; ++r) o[r] = _mm256_loadu_ps(out + c0 + 8 * r);
    for (size_t s = 0; s < ns; ++s) {
      const __m256 av = _mm256_set1_ps(a[s]);
      const float* v = values + s * D + c0;
      for (size_t r = 0; r < nr; ++r) o[r] = _mm256_fmadd_ps(av, _mm256_loadu_ps(v + 8 * r), o[r]);
    }
    for (size_t r = 0; r < nr; ++r) _mm256_storeu_ps(out + c0 + 8 * r, o[r]);
  }
}

void RmsNormAvx2(const float* x, const float* w, size_t dim, float eps, float* y) {
  const float ss = DotAvx2(x, x, dim);
  const float r = 1.f / std::sqrt(ss / static_cast<float>(dim) + eps);
  const __m256 rv = _mm256_set1_ps(r);
  size_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), rv);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), v));
  }
  for (; i < dim; ++i) y[i] = w[i] * (x[i] * r);
}

void SoftmaxAvx2(float* x, size_t n) {
  size_t i = 0;
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  float mx = avx2::HMax(mv);
  for (; i < n; ++i) mx = std::fmax(mx, x[i]);
  const __m256 mb = _mm256_set1_ps(mx);
  __m256 sv = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = avx2::Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), mb));
    _mm256_storeu_ps(x + i, e);
    sv = _mm256_add_ps(sv, e);
  }
  float sum = avx2::HSum(sv);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.f / sum;
  const __m256 iv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
  for (; i < n; ++i) x[i] *= inv;
}

void SiluMulAvx2(const float* gate, const float* up, size_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 zero = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = avx2::Exp(_mm256_sub_ps(zero, g));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

const kernels::DenseKernels kAvx2Kernels = {
    MatmulBf16Avx2<false>, MatmulF32Avx2, RmsNormAvx2, SoftmaxAvx2, SiluMulAvx2, DotAvx2, AxpyAvx2,
};

const kernels::DenseKernels kAvx2InvariantKernels = {
    MatmulBf16Avx2<true>, MatmulF32Avx2, RmsNormAvx2, SoftmaxAvx2, SiluMulAvx2, DotAvx2, AxpyAvx2,
};

const kernels::DenseKernels kAvx2Bf16ActsKernels = {
    MatmulBf16ActsBf16Avx2<false>, MatmulF32Avx2, RmsNormAvx2, SoftmaxAvx2, SiluMulAvx2, DotAvx2,
    AxpyAvx2,
};

const kernels::DenseKernels kAvx2Bf16ActsInvariantKernels = {
    MatmulBf16ActsBf16Avx2<true>, MatmulF32Avx2, RmsNormAvx2, SoftmaxAvx2, SiluMulAvx2, DotAvx2,
    AxpyAvx2,
};

}  // namespace pw::cpu
