// AVX-512 backend of the dense CPU kernels (compiled with -mavx512f/bw/vl...; selected at run
// time only when the CPU reports avx512f and avx512bw). The matmuls, dot, axpy and RMSNorm use
// 512-bit registers; softmax and SiLU*mul reuse the AVX2 code (they are not on the hot path).
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/dense.h"
#include "kernels/cpu/prefetch_distance.h"
#include "kernels/cpu/row_streams.h"
#include "kernels/cpu/simd_avx2.h"

namespace pw::cpu {

float DotAvx2(const float* a, const float* b, size_t n);
void SoftmaxAvx2(float* x, size_t n);
void SiluMulAvx2(const float* gate, const float* up, size_t n, float* out);

namespace {

inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// RR weight rows x TT tokens, 16 columns per iteration; the K tail goes through a mask.
template <int RR, int TT, typename W>
inline void Tile512(const float* x, size_t ldx, const W* w, size_t K, float* y, size_t ldy) {
  __m512 acc[RR][TT];
  for (int r = 0; r < RR; ++r)
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm512_setzero_ps();
  const size_t ahead = PrefetchBytes();
  size_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[RR];
    // Each row's stream prefetched `ahead` bytes ahead (one line per 64 bytes).
    if (ahead != 0 && k % (64 / sizeof(W)) == 0) {
      for (int r = 0; r < RR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + r * K + k) + ahead, _MM_HINT_T0);
      }
    }
    for (int r = 0; r < RR; ++r) wv[r] = Load16(w + r * K + k);
    for (int t = 0; t < TT; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * ldx + k);
      for (int r = 0; r < RR; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < RR; ++r) {
    for (int t = 0; t < TT; ++t) {
      float s = _mm512_reduce_add_ps(acc[r][t]);
      for (size_t kk = k; kk < K; ++kk) s += x[t * ldx + kk] * avx2::ToF32(w[r * K + kk]);
      y[t * ldy + r] = s;
    }
  }
}

template <int RR, typename W>
inline void Tokens512(const float* x, size_t ldx, size_t T, const W* w, size_t K, float* y,
                      size_t ldy) {
  size_t t = 0;
  for (; t + 4 <= T; t += 4) Tile512<RR, 4>(x + t * ldx, ldx, w, K, y + t * ldy, ldy);
  switch (T - t) {
    case 3:
      Tile512<RR, 3>(x + t * ldx, ldx, w, K, y + t * ldy, ldy);
      break;
    case 2:
      Tile512<RR, 2>(x + t * ldx, ldx, w, K, y + t * ldy, ldy);
      break;
    case 1:
      Tile512<RR, 1>(x + t * ldx, ldx, w, K, y + t * ldy, ldy);
      break;
    default:
      break;
  }
}

// Few-token bf16 GEMV over R rows read side by side, for TT <= kGemvMaxTokens tokens: 64-byte
// loads (32 weights per row per step), the even and odd weights of each load widened in place
// (a shift and a mask: no cross-lane shuffle on the weights) against the activations split
// once per step into their even and odd columns, each row's stream prefetched PrefetchBytes()
// ahead (prefetch_distance.h). The K tail goes through masked loads (never read past a row).
// One token keeps separate even/odd accumulators (two independent chains per row); more tokens
// share one.
constexpr size_t kGemvMaxTokens = 4;

template <int R, int TT>
inline void GemvBf16(const float* x, size_t ldx, const uint16_t* const* w, size_t K,
                     float* const* y, size_t ldy) {
  constexpr int A = TT == 1 ? 2 : 1;  // accumulators per (row, token)
  __m512 acc[R][TT][A];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t)
      for (int a = 0; a < A; ++a) acc[r][t][a] = _mm512_setzero_ps();
  const __m512i idx_e = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i idx_o = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const size_t ahead = PrefetchBytes();
  auto step = [&](size_t k, __mmask32 mw, bool tail) {
    __m512 xe[TT], xo[TT];
    for (int t = 0; t < TT; ++t) {
      const float* xt = x + t * ldx + k;
      const __m512 x0 = tail ? _mm512_maskz_loadu_ps(static_cast<__mmask16>(mw), xt) : _mm512_loadu_ps(xt);
      const __m512 x1 = tail ? _mm512_maskz_loadu_ps(static_cast<__mmask16>(mw >> 16), xt + 16)
                             : _mm512_loadu_ps(xt + 16);
      xe[t] = _mm512_permutex2var_ps(x0, idx_e, x1);
      xo[t] = _mm512_permutex2var_ps(x0, idx_o, x1);
    }
    for (int r = 0; r < R; ++r) {
      __m512i v;
      if (tail) {
        v = _mm512_maskz_loadu_epi16(mw, w[r] + k);
      } else {
        if (ahead != 0) _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + ahead, _MM_HINT_T0);
        v = _mm512_loadu_si512(w[r] + k);
      }
      const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
      for (int t = 0; t < TT; ++t) {
        acc[r][t][0] = _mm512_fmadd_ps(we, xe[t], acc[r][t][0]);
        acc[r][t][A - 1] = _mm512_fmadd_ps(wo, xo[t], acc[r][t][A - 1]);
      }
    }
  };
  size_t k = 0;
  for (; k + 32 <= K; k += 32) step(k, ~__mmask32{0}, false);
  if (k < K) step(k, static_cast<__mmask32>((uint64_t{1} << (K - k)) - 1), true);
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < TT; ++t) {
      const __m512 s = A == 2 ? _mm512_add_ps(acc[r][t][0], acc[r][t][A - 1]) : acc[r][t][0];
      y[r][t * ldy] = _mm512_reduce_add_ps(s);
    }
  }
}

// Up to kGemvMaxTokens tokens, the rows walked as kGemvStreams long streams (row_streams.h).
template <int TT>
void GemvBf16Rows(const float* x, size_t ldx, const uint16_t* w, size_t K, size_t n_begin,
                  size_t n_end, float* y, size_t ldy) {
  WalkRowStreams<kGemvStreams>(
      w, K, n_begin, n_end, y, [&](auto r, const uint16_t* const* rows, float* const* outs) {
        GemvBf16<decltype(r)::value, TT>(x, ldx, rows, K, outs, ldy);
      });
}

template <typename W>
void Matmul512(const float* x, size_t ldx, size_t T, const W* w, size_t K, size_t n_begin,
               size_t n_end, float* y, size_t ldy) {
  constexpr size_t kRowBlock = 16;
  for (size_t n0 = n_begin; n0 < n_end; n0 += kRowBlock) {
    const size_t n1 = n0 + kRowBlock < n_end ? n0 + kRowBlock : n_end;
    size_t n = n0;
    if (T == 1) {
      for (; n + 4 <= n1; n += 4) Tile512<4, 1>(x, ldx, w + n * K, K, y + n, ldy);
    } else {
      // 4 rows x 4 tokens: 16 accumulators + 4 weight vectors + 1 activation of 32 registers.
      for (; n + 4 <= n1; n += 4) Tokens512<4>(x, ldx, T, w + n * K, K, y + n, ldy);
    }
    for (; n < n1; ++n) Tokens512<1>(x, ldx, T, w + n * K, K, y + n, ldy);
  }
}

}  // namespace

void MatmulBf16Avx512(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                      size_t n_begin, size_t n_end, float* y, size_t ldy) {
  switch (T) {
    case 1:
      return GemvBf16Rows<1>(x, ldx, w, K, n_begin, n_end, y, ldy);
    case 2:
      return GemvBf16Rows<2>(x, ldx, w, K, n_begin, n_end, y, ldy);
    case 3:
      return GemvBf16Rows<3>(x, ldx, w, K, n_begin, n_end, y, ldy);
    case 4:
      return GemvBf16Rows<4>(x, ldx, w, K, n_begin, n_end, y, ldy);
    default:
      break;
  }
  Matmul512(x, ldx, T, w, K, n_begin, n_end, y, ldy);
}

void MatmulF32Avx512(const float* x, size_t ldx, size_t T, const float* w, size_t K, size_t n_begin,
                     size_t n_end, float* y, size_t ldy) {
  Matmul512(x, ldx, T, w, K, n_begin, n_end, y, ldy);
}

// The tiles for every token count: Tile512 sums each (row, token) in the same order whatever
// its row and token counts.
void MatmulBf16TilesAvx512(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                           size_t n_begin, size_t n_end, float* y, size_t ldy) {
  Matmul512(x, ldx, T, w, K, n_begin, n_end, y, ldy);
}

float DotAvx512(const float* a, const float* b, size_t n) {
  __m512 s = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s);
  float r = _mm512_reduce_add_ps(s);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

void AxpyAvx512(float alpha, const float* x, size_t n, float* y) {
  const __m512 a = _mm512_set1_ps(alpha);
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(a, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

namespace {

// QI queries x SJ keys of DotAvx512 at once: one accumulator per pair, the same FMAs in the
// same order, the same reduction. D % 16 == 0.
template <int QI, int SJ>
void DotTile(const float* q, size_t ldq, const float* keys, size_t D, float scale, float* scores,
             size_t lds) {
  __m512 acc[QI][SJ];
  for (int i = 0; i < QI; ++i)
    for (int j = 0; j < SJ; ++j) acc[i][j] = _mm512_setzero_ps();
  for (size_t c = 0; c < D; c += 16) {
    __m512 kv[SJ];
    for (int j = 0; j < SJ; ++j) kv[j] = _mm512_loadu_ps(keys + j * D + c);
    for (int i = 0; i < QI; ++i) {
      const __m512 qv = _mm512_loadu_ps(q + i * ldq + c);
      for (int j = 0; j < SJ; ++j) acc[i][j] = _mm512_fmadd_ps(qv, kv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < QI; ++i)
    for (int j = 0; j < SJ; ++j) scores[i * lds + j] = _mm512_reduce_add_ps(acc[i][j]) * scale;
}

}  // namespace

void DotRowsAvx512(const float* q, size_t ldq, size_t nq, const float* keys, size_t ns, size_t D,
                   float scale, float* scores, size_t lds) {
  size_t i = 0;
  for (; i + 4 <= nq; i += 4) {
    size_t s = 0;
    for (; s + 4 <= ns; s += 4) DotTile<4, 4>(q + i * ldq, ldq, keys + s * D, D, scale, scores + i * lds + s, lds);
    for (; s < ns; ++s) DotTile<4, 1>(q + i * ldq, ldq, keys + s * D, D, scale, scores + i * lds + s, lds);
  }
  for (; i < nq; ++i) {
    size_t s = 0;
    for (; s + 4 <= ns; s += 4) DotTile<1, 4>(q + i * ldq, ldq, keys + s * D, D, scale, scores + i * lds + s, lds);
    for (; s < ns; ++s) DotTile<1, 1>(q + i * ldq, ldq, keys + s * D, D, scale, scores + i * lds + s, lds);
  }
}

// AxpyAvx512 over ns rows in order, the output held in registers (up to 128 columns at a time)
// instead of loaded and stored per row: each element sees the same FMAs in the same order.
// D % 16 == 0.
void AxpyRowsAvx512(const float* a, size_t ns, const float* values, size_t D, float* out) {
  constexpr size_t kRegs = 8;
  for (size_t c0 = 0; c0 < D; c0 += 16 * kRegs) {
    const size_t nr = (D - c0) / 16 < kRegs ? (D - c0) / 16 : kRegs;
    __m512 o[kRegs];
    for (size_t r = 0; r < nr; ++r) o[r] = _mm512_loadu_ps(out + c0 + 16 * r);
    for (size_t s = 0; s < ns; ++s) {
      const __m512 av = _mm512_set1_ps(a[s]);
      const float* v = values + s * D + c0;
      for (size_t r = 0; r < nr; ++r) o[r] = _mm512_fmadd_ps(av, _mm512_loadu_ps(v + 16 * r), o[r]);
    }
    for (size_t r = 0; r < nr; ++r) _mm512_storeu_ps(out + c0 + 16 * r, o[r]);
  }
}

void RmsNormAvx512(const float* x, const float* w, size_t dim, float eps, float* y) {
  const float ss = DotAvx512(x, x, dim);
  const float r = 1.f / std::sqrt(ss / static_cast<float>(dim) + eps);
  const __m512 rv = _mm512_set1_ps(r);
  size_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), rv);
    _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(w + i), v));
  }
  for (; i < dim; ++i) y[i] = w[i] * (x[i] * r);
}

const kernels::DenseKernels kAvx512Kernels = {
    MatmulBf16Avx512, MatmulF32Avx512, RmsNormAvx512, SoftmaxAvx2,
    SiluMulAvx2,      DotAvx512,       AxpyAvx512,
};

const kernels::DenseKernels kAvx512InvariantKernels = {
    MatmulBf16TilesAvx512, MatmulF32Avx512, RmsNormAvx512, SoftmaxAvx2,
    SiluMulAvx2,      DotAvx512,       AxpyAvx512,
};

}  // namespace pw::cpu
