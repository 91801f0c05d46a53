// The bf16-activation table on CPUs with AVX512-BF16 (compiled with it; selected at run time
// only when the CPU reports it): matmul_bf16 rounds each activation to bf16 (vcvtne2ps2bf16,
// nearest even) and multiplies bf16 pairs with vdpbf16ps, 32 weights per instruction against
// 16 for an fp32 FMA, with no widening of the weights: the arithmetic of bf16 inference
// (llama.cpp's bf16 type, torch in bf16), opted into with PW_BF16_ACTIVATIONS=1. Both
// instructions treat denormal inputs as 0 (whatever MXCSR says): activations under 2^-126 in
// magnitude count as 0 here, where the scalar reference rounds them. Every other kernel is the
// AVX-512 backend's.
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/dense.h"
#include "kernels/cpu/packed_bf16.h"
#include "kernels/cpu/row_streams.h"

namespace pw::cpu {

void MatmulF32Avx512(const float* x, size_t ldx, size_t T, const float* w, size_t K, size_t n_begin,
                     size_t n_end, float* y, size_t ldy);
void RmsNormAvx512(const float* x, const float* w, size_t dim, float eps, float* y);
float DotAvx512(const float* a, const float* b, size_t n);
void AxpyAvx512(float alpha, const float* x, size_t n, float* y);
void SoftmaxAvx2(float* x, size_t n);
void SiluMulAvx2(const float* gate, const float* up, size_t n, float* out);

namespace {

// Activations converted per call, not per tile: vcvtne2ps2bf16 inside the tile loop cost most
// of vdpbf16ps's gain (AMD Zen 4: 1.2x the fp32 FMA tile instead of 1.6-1.9x). They go to a
// buffer on the stack (kernels never allocate), kStackActs bf16 values: 4 tokens of the
// longest rows (14336 columns) and more.
constexpr size_t kStackActs = size_t{64} << 10;
static_assert(kStackActs == kPackedFusedActs, "packed_bf16.h's fused product uses this buffer");

// Tokens [0, n) of x (stride ldx, K columns) as bf16, nearest even, rows of Kp (K rounded up to
// 32) with the padding 0.
void ToBf16Rows(const float* x, size_t ldx, size_t n, size_t K, size_t Kp, uint16_t* out) {
  for (size_t t = 0; t < n; ++t) {
    const float* xt = x + t * ldx;
    uint16_t* o = out + t * Kp;
    for (size_t k = 0; k < Kp; k += 32) {
      const size_t m = K > k ? (K - k < 32 ? K - k : 32) : 0;
      __m512bh v;
      if (m == 32) {
        v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xt + k + 16), _mm512_loadu_ps(xt + k));
      } else {
        const __mmask16 lo = static_cast<__mmask16>(m >= 16 ? 0xFFFFu : (1u << m) - 1);
        const __mmask16 hi = static_cast<__mmask16>(m > 16 ? (1u << (m - 16)) - 1 : 0);
        v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, xt + k + 16),
                                _mm512_maskz_loadu_ps(lo, xt + k));
      }
      _mm512_storeu_si512(o + k, (__m512i)v);
    }
  }
}

// How far ahead along each weight row a full 4 x 4 tile asks for the row into L2 (values:
// 16 KB; the rows of a range are contiguous, so past a row's end this is the rows after it).
// Without it a tile's weight reads and products did not overlap: on an AMD Zen 4 at 8 tokens
// 2048x1024 took 234 µs on two threads, 116 µs with it; 1, 2 and 3 tokens (bandwidth-bound)
// do not prefetch (docs/benchmarks.md, "The bf16-activation tile's weights prefetched").
constexpr size_t kTilePrefetchValues = 8192;

// RR weight rows w[r] x TT tokens (bf16 activations xb, rows of Kp) into y[r][t * ldy], 32
// columns per step, the weights' K tail through a mask. Each (row, token) has its own
// accumulator summed in one order whatever RR, TT, the rows beside it and the token grouping
// are, so a token's result does not depend on how many tokens share the call.
// Only the first `live` tokens' results are stored (a last tile padded with zero tokens).
template <int RR, int TT>
inline void TileDp(const uint16_t* xb, size_t Kp, const uint16_t* const* w, size_t K,
                   float* const* y, size_t ldy, int live = TT) {
  __m512 acc[RR][TT];
  for (int r = 0; r < RR; ++r)
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm512_setzero_ps();
  size_t k = 0;
  for (; k + 32 <= K; k += 32) {
    if constexpr (RR == 4 && TT == 4) {
      for (int r = 0; r < RR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + k + kTilePrefetchValues), _MM_HINT_T2);
      }
    }
    __m512i xv[TT];
    for (int t = 0; t < TT; ++t) xv[t] = _mm512_loadu_si512(xb + t * Kp + k);
    for (int r = 0; r < RR; ++r) {
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(w[r] + k);
      for (int t = 0; t < TT; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)xv[t], wv);
    }
  }
  if (k < K) {
    const __mmask32 m = static_cast<__mmask32>((1u << (K - k)) - 1);
    for (int r = 0; r < RR; ++r) {
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w[r] + k);
      for (int t = 0; t < TT; ++t) {
        acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)_mm512_loadu_si512(xb + t * Kp + k), wv);
      }
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int t = 0; t < live; ++t) y[r][t * ldy] = _mm512_reduce_add_ps(acc[r][t]);
}

// padded: xb holds zero tokens after the T given up to a multiple of 4, so that 1-3 tokens
// left after the 4-token tiles run as one more 4-token tile (their results alone stored): a
// 4 x 1..3 tile has 4-12 dependent accumulator chains where 4 x 4 has 16, and took longer for
// its one to three tokens than a full tile (AMD Zen 4: 1024x2048 at 5 tokens 127 µs, 8 tokens
// 100). Each real token's accumulators and order are the same either way.
template <int RR>
inline void TokensDp(const uint16_t* xb, size_t Kp, size_t T, const uint16_t* const* w, size_t K,
                     float* const* y, size_t ldy, bool padded = false) {
  float* yt[RR];
  size_t t = 0;
  auto at = [&](size_t t0) {
    for (int r = 0; r < RR; ++r) yt[r] = y[r] + t0 * ldy;
    return yt;
  };
  for (; t + 4 <= T; t += 4) TileDp<RR, 4>(xb + t * Kp, Kp, w, K, at(t), ldy);
  if (padded && t < T) {
    TileDp<RR, 4>(xb + t * Kp, Kp, w, K, at(t), ldy, static_cast<int>(T - t));
    return;
  }
  switch (T - t) {
    case 3:
      TileDp<RR, 3>(xb + t * Kp, Kp, w, K, at(t), ldy);
      break;
    case 2:
      TileDp<RR, 2>(xb + t * Kp, Kp, w, K, at(t), ldy);
      break;
    case 1:
      TileDp<RR, 1>(xb + t * Kp, Kp, w, K, at(t), ldy);
      break;
    default:
      break;
  }
}

// Tokens in groups that fit the stack buffer (converted once per group). Up to 4 tokens (one
// token tile) the rows go as 4 streams from 4 parts of the range, as the fp32 GEMV reads them
// (4 adjacent rows read 1.8x slower at one token on an AMD Zen 4); from 5 tokens on, in blocks
// of 16 rows that every token tile reuses from the cache, 4 rows x 4 tokens per tile (16
// accumulators + 4 activation vectors + 1 weight vector of 32 registers).
void MatmulBf16ActsBf16Avx512(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                              size_t n_begin, size_t n_end, float* y, size_t ldy) {
  const size_t Kp = (K + 31) / 32 * 32;
  if (K == 0 || Kp > kStackActs) {  // no columns, or rows longer than the buffer: the reference
    kScalarBf16ActsKernels.matmul_bf16(x, ldx, T, w, K, n_begin, n_end, y, ldy);
    return;
  }
  alignas(64) uint16_t xb[kStackActs];
  const uint16_t* rows[4];
  float* outs[4];
  // Token rows the buffer holds. A group whose last tile has 1-3 tokens pads it with zero rows
  // when they fit (TokensDp's `padded`); groups are not made smaller for it (each group reads
  // the whole matrix).
  const size_t group = kStackActs / Kp;
  for (size_t t0 = 0; t0 < T; t0 += group) {
    const size_t nt = T - t0 < group ? T - t0 : group;
    ToBf16Rows(x + t0 * ldx, ldx, nt, K, Kp, xb);
    const size_t padded_nt = (nt + 3) / 4 * 4;
    const bool padded = nt > 4 && padded_nt <= group;
    if (padded) std::memset(xb + nt * Kp, 0, (padded_nt - nt) * Kp * sizeof(uint16_t));
    float* yt = y + t0 * ldy;
    size_t n = n_begin;
    if (nt <= 4) {
      const size_t part = (n_end - n_begin) / 4;
      for (size_t i = 0; i < part; ++i) {
        for (int s = 0; s < 4; ++s) {
          rows[s] = w + (n_begin + s * part + i) * K;
          outs[s] = yt + n_begin + s * part + i;
        }
        TokensDp<4>(xb, Kp, nt, rows, K, outs, ldy);
      }
      n = n_begin + 4 * part;
    } else {
      constexpr size_t kRowBlock = 16;
      for (; n + kRowBlock <= n_end; n += kRowBlock) {
        for (size_t r = n; r < n + kRowBlock; r += 4) {
          for (int s = 0; s < 4; ++s) {
            rows[s] = w + (r + s) * K;
            outs[s] = yt + r + s;
          }
          TokensDp<4>(xb, Kp, nt, rows, K, outs, ldy, padded);
        }
      }
    }
    for (; n < n_end; ++n) {
      rows[0] = w + n * K;
      outs[0] = yt + n;
      TokensDp<1>(xb, Kp, nt, rows, K, outs, ldy, padded);
    }
  }
}

// One packed chunk at q (packed_bf16.h) as bf16 values: its columns 0..31 in *w0, 32..63 in
// *w1. The codes' low nibbles are slots 0..31, their high nibbles 32..63; a byte shuffle
// through the row's table (broadcast to every 128-bit lane) gives each slot's high byte, and the
// byte interleaves with the low bytes put the slots in column order.
inline void DecodeChunk(const uint8_t* q, __m512i tbl, __m512i* w0, __m512i* w1) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m512i e = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(codes, nib)),
                                       _mm256_and_si256(_mm256_srli_epi16(codes, 4), nib), 1);
  const __m512i h = _mm512_shuffle_epi8(tbl, e);
  const __m512i l = _mm512_loadu_si512(q + 32);
  *w0 = _mm512_unpacklo_epi8(l, h);
  *w1 = _mm512_unpackhi_epi8(l, h);
}

// RR packed rows (packed_bf16.h) x TT tokens: each chunk's 64 columns decoded in registers (its
// codes' nibbles through the row's table of high bytes, interleaved with its low bytes: columns
// 0..31 and 32..63 in order) and multiplied as TileDp multiplies the plain rows, 32 columns a
// step in the same order, so a row without exceptions gives TileDp's bits. A row's exceptions
// (decoded as +0) add their products after its sum.
template <int RR, int TT>
inline void PackedTileDp(const uint16_t* xb, size_t Kp, const PackedBf16View& w,
                         const size_t* rows, float* const* y, size_t ldy, int live = TT) {
  const size_t chunks = w.ChunksPerRow();
  __m512 acc[RR][TT];
  __m512i tbl[RR];
  const uint8_t* p[RR];
  for (int r = 0; r < RR; ++r) {
    tbl[r] = _mm512_broadcast_i32x4(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.tables + rows[r] * kPackedTableBytes)));
    p[r] = w.Row(rows[r]);
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  for (size_t c = 0; c < chunks; ++c) {
    __m512i x0[TT], x1[TT];
    for (int t = 0; t < TT; ++t) {
      x0[t] = _mm512_loadu_si512(xb + t * Kp + c * kPackedChunkColumns);
      x1[t] = _mm512_loadu_si512(xb + t * Kp + c * kPackedChunkColumns + 32);
    }
    for (int r = 0; r < RR; ++r) {
      __m512i w0, w1;
      DecodeChunk(p[r] + c * kPackedChunkBytes, tbl[r], &w0, &w1);
      for (int t = 0; t < TT; ++t) {
        acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)x0[t], (__m512bh)w0);
        acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)x1[t], (__m512bh)w1);
      }
    }
  }
  for (int r = 0; r < RR; ++r) {
    for (int t = 0; t < live; ++t) {
      float s = _mm512_reduce_add_ps(acc[r][t]);
      for (uint32_t i = w.exc_begin[rows[r]]; i < w.exc_begin[rows[r] + 1]; ++i) {
        s += Bf16Bits(xb[t * Kp + w.exc_col[i]]) * Bf16Bits(w.exc_bits[i]);
      }
      y[r][t * ldy] = s;
    }
  }
}

template <int RR>
inline void PackedTokensDp(const uint16_t* xb, size_t Kp, size_t T, const PackedBf16View& w,
                           const size_t* rows, float* const* y, size_t ldy) {
  switch (T) {
    case 4: PackedTileDp<RR, 4>(xb, Kp, w, rows, y, ldy); break;
    case 3: PackedTileDp<RR, 3>(xb, Kp, w, rows, y, ldy); break;
    case 2: PackedTileDp<RR, 2>(xb, Kp, w, rows, y, ldy); break;
    case 1: PackedTileDp<RR, 1>(xb, Kp, w, rows, y, ldy); break;
    default: break;
  }
}

// Packed rows [r0, r1) of w decoded into wb (rows of stride Kp; exceptions restored): the bits
// they were packed from, for TileDp to multiply as plain rows. The lines `ahead` bytes past each
// chunk are asked for into L2 (0: none).
void DecodePackedRows(const PackedBf16View& w, size_t r0, size_t r1, size_t Kp, uint16_t* wb,
                      size_t ahead) {
  const size_t chunks = w.ChunksPerRow();
  for (size_t r = r0; r < r1; ++r) {
    const __m512i tbl = _mm512_broadcast_i32x4(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.tables + r * kPackedTableBytes)));
    const uint8_t* p = w.Row(r);
    uint16_t* o = wb + (r - r0) * Kp;
    for (size_t c = 0; c < chunks; ++c) {
      const uint8_t* q = p + c * kPackedChunkBytes;
      if (ahead != 0) {
        _mm_prefetch(reinterpret_cast<const char*>(q + ahead), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(q + ahead + 64), _MM_HINT_T1);
      }
      __m512i w0, w1;
      DecodeChunk(q, tbl, &w0, &w1);
      _mm512_storeu_si512(o + c * kPackedChunkColumns, w0);
      _mm512_storeu_si512(o + c * kPackedChunkColumns + 32, w1);
    }
    for (uint32_t i = w.exc_begin[r]; i < w.exc_begin[r + 1]; ++i) o[w.exc_col[i]] = w.exc_bits[i];
  }
}

// Decoded rows for 5 tokens and more: 4 rows of up to 4096 columns (32 KB, L1's size on an AMD
// Zen 4), fewer of longer ones.
constexpr size_t kDecodedValues = size_t{16} << 10;

}  // namespace

const kernels::DenseKernels kAvx512Bf16ActsKernels = {
    MatmulBf16ActsBf16Avx512,
    MatmulF32Avx512,
    RmsNormAvx512,
    SoftmaxAvx2,
    SiluMulAvx2,
    DotAvx512,
    AxpyAvx512,
};

// The packed product of packed_bf16.h. 1-4 tokens: the rows as 4 streams from 4 parts of the
// range, as MatmulBf16ActsBf16Avx512 reads plain rows at these token counts, each chunk decoded
// in registers. 5 tokens and more: 4 rows at a time decoded into a buffer on the stack (L1) and
// multiplied by the plain kernel's token tiles (TokensDp), so the results are its bits.
void MatmulPackedBf16Avx512Bf16(const float* x, size_t ldx, size_t T, const PackedBf16View& w,
                                size_t n_begin, size_t n_end, float* y, size_t ldy) {
  const size_t Kp = w.PaddedCols();
  if (T == 0 || !w.FitsInRegisterProducts()) {
    std::fprintf(stderr, "MatmulPackedBf16Avx512Bf16: %zu tokens of %zu columns\n", T, w.cols);
    std::abort();
  }
  alignas(64) uint16_t xb[kStackActs];
  float* outs[4];
  if (T <= kPackedFusedTokens) {
    ToBf16Rows(x, ldx, T, w.cols, Kp, xb);
    ForRowStreams<kGemvStreams>(n_begin, n_end, [&](auto r, const size_t* n) {
      constexpr int R = decltype(r)::value;
      for (int s = 0; s < R; ++s) outs[s] = y + n[s];
      PackedTokensDp<R>(xb, Kp, T, w, n, outs, ldy);
    });
    return;
  }
  alignas(64) uint16_t wb[kDecodedValues];
  const size_t block = std::max<size_t>(1, std::min<size_t>(4, kDecodedValues / Kp));
  const uint16_t* wrows[4];
  const size_t group = kStackActs / Kp;
  for (size_t t0 = 0; t0 < T; t0 += group) {
    const size_t nt = T - t0 < group ? T - t0 : group;
    ToBf16Rows(x + t0 * ldx, ldx, nt, w.cols, Kp, xb);
    const size_t padded_nt = (nt + 3) / 4 * 4;
    const bool padded = nt > 4 && padded_nt <= group;
    if (padded) std::memset(xb + nt * Kp, 0, (padded_nt - nt) * Kp * sizeof(uint16_t));
    float* yt = y + t0 * ldy;
    for (size_t n0 = n_begin; n0 < n_end; n0 += block) {
      const size_t n1 = std::min(n_end, n0 + block);
      // The next block's rows are asked for into L2 while this one is multiplied.
      DecodePackedRows(w, n0, n1, Kp, wb, n1 < n_end ? (n1 - n0) * w.ChunksPerRow() * kPackedChunkBytes : 0);
      for (size_t n = n0; n < n1; ++n) {
        wrows[n - n0] = wb + (n - n0) * Kp;
        outs[n - n0] = yt + n;
      }
      if (n1 - n0 == 4) {
        TokensDp<4>(xb, Kp, nt, wrows, w.cols, outs, ldy, padded);
      } else {
        for (size_t i = 0; i < n1 - n0; ++i) TokensDp<1>(xb, Kp, nt, wrows + i, w.cols, outs + i, ldy, padded);
      }
    }
  }
}

}  // namespace pw::cpu
