// AVX-512 (F, BW, VL, DQ, VNNI, VBMI, GFNI) backend of the integer fast path (q8.h).
//
// One 64-byte load of a plane row covers two 256-column groups (bytes 0..31 of group 2P, then
// of group 2P+1). For each of the 8 slices k the codes of 64 columns are formed in registers:
// bit k of plane p moved to bit b-1-p with one shift and one ternary-logic merge per plane; for
// b <= 4 slices k and k+4 are formed together (low and high nibble) by the same shifts; for
// b >= 5 all 8 slices at once by an 8x8 bit transpose across the plane registers (at one
// token and 5-6 bits by a byte transpose and GFNI affine transforms, the activations permuted
// to match). Codes are looked up in the row's int8 LUT, offset to unsigned (+128), with vpermb
// (b <= 6, the table replicated to 64 entries), vpermi2b (b = 7), or two vpermi2b and a blend
// on bit 7 (b = 8), and multiplied with the quantized activations by vpdpbusd into int32. Per
// group pair one int32 -> fp32 conversion and one multiply-add by the two groups' activation
// scales; at the end the +128 offset is removed with the per-token Q8Acts::offsets term.
// One token: one row at a time, its b plane streams prefetched 2 KiB ahead. Several tokens:
// each group pair of a row is decoded once into 8 registers and reused for every token.
#include <immintrin.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/anyprec/q8_internal.h"
#include "kernels/cpu/prefetch_distance.h"
#include "kernels/cpu/row_streams.h"

namespace pw::anyprec::internal {
namespace avx512q8 {
namespace {

#include "kernels/anyprec/q8_avx512_decode.inc"

// Activation scales of group pair P as one vector (lanes 0..7: group 2P, 8..15: group 2P+1).
inline __m512 PairScales(const float* s, int P) {
  return _mm512_insertf32x8(_mm512_set1_ps(s[2 * P]), _mm256_set1_ps(s[2 * P + 1]), 1);
}

// A row of a dense int8 matrix (Q8Matrix): 64 bytes per slice, offset to unsigned on load.
struct DenseRow {
  const int8_t* w;
  float scale;

  void Init(const Q8Matrix& m, int r) {
    w = m.values + static_cast<size_t>(r) * Q8ActStride(m.cols);
    scale = m.scales[r];
  }
  template <class F>
  inline void DecodePair(int P, bool /*half: rows are zero-padded*/, F&& use, size_t prefetch) const {
    const __m512i off = _mm512_set1_epi8(static_cast<char>(0x80));
    const int8_t* base = w + 512 * P;
    for (int k = 0; k < 8; ++k) {
      _mm_prefetch(reinterpret_cast<const char*>(base + 64 * k + prefetch), _MM_HINT_T0);
      use(k, _mm512_xor_si512(_mm512_loadu_si512(base + 64 * k), off));
    }
  }
};

// NR rows (RowT: Row<B> or DenseRow, initialised) of one token, y[i] for row i.
// `ahead`: the software prefetch distance along each row's stream. kPermuted: the codes by
// DecodePairPermuted, a.q in PermuteActs's order.
template <class RowT, int NR, bool kPermuted = false>
void GemvRows(const RowT* rows, int cols, const Q8Acts& a, float* y, size_t ahead) {
  const int groups = (cols + kGroupCols - 1) / kGroupCols;
  const int pairs = (groups + 1) / 2;
  const bool odd = groups % 2 != 0;
  __m512 accf[NR];
  for (auto& f : accf) f = _mm512_setzero_ps();
  for (int P = 0; P < pairs; ++P) {
    const bool half = odd && P == pairs - 1;
    const int8_t* xp = a.q + 512 * P;
    __m512i acc[NR];
    for (auto& c : acc) c = _mm512_setzero_si512();
    for (int i = 0; i < NR; ++i) {
      auto use = [&](int k, __m512i w) {
        acc[i] = _mm512_dpbusd_epi32(acc[i], w, _mm512_loadu_si512(xp + 64 * k));
      };
      if constexpr (kPermuted) {
        rows[i].DecodePairPermuted(P, half, use, ahead);
      } else {
        rows[i].DecodePair(P, half, use, ahead);
      }
    }
    const __m512 s = PairScales(a.scales, P);
    for (int i = 0; i < NR; ++i) accf[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i]), s, accf[i]);
  }
  for (int i = 0; i < NR; ++i) y[i] = rows[i].scale * (_mm512_reduce_add_ps(accf[i]) - a.offsets[0]);
}

// One row (initialised) for every token, y[t * ldy] for token t: each group pair decoded
// once, then dotted with each token.
template <class RowT>
void GemmRow(const RowT& row, int cols, const Q8Acts& a, float* y, size_t ldy) {
  const int groups = (cols + kGroupCols - 1) / kGroupCols;
  const int pairs = (groups + 1) / 2;
  const bool odd = groups % 2 != 0;
  const int stride = Q8ActStride(cols), ngroups = Q8ActGroups(cols);
  const size_t ahead = kPrefetchBytes;
  __m512 accf[kMaxTokens];
  const int T = a.tokens;
  for (int t = 0; t < T; ++t) accf[t] = _mm512_setzero_ps();
  __m512i w[8];
  for (int P = 0; P < pairs; ++P) {
    row.DecodePair(P, odd && P == pairs - 1, [&](int k, __m512i wk) { w[k] = wk; }, ahead);
    const int8_t* xp = a.q + 512 * P;
    int t = 0;
    for (; t + 2 <= T; t += 2) {
      const int8_t* x0 = xp + static_cast<size_t>(t) * stride;
      const int8_t* x1 = x0 + stride;
      __m512i c0 = _mm512_setzero_si512(), c1 = _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k) {
        c0 = _mm512_dpbusd_epi32(c0, w[k], _mm512_loadu_si512(x0 + 64 * k));
        c1 = _mm512_dpbusd_epi32(c1, w[k], _mm512_loadu_si512(x1 + 64 * k));
      }
      accf[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0),
                                PairScales(a.scales + static_cast<size_t>(t) * ngroups, P), accf[t]);
      accf[t + 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1),
                                    PairScales(a.scales + static_cast<size_t>(t + 1) * ngroups, P),
                                    accf[t + 1]);
    }
    if (t < T) {
      const int8_t* x0 = xp + static_cast<size_t>(t) * stride;
      __m512i c0 = _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k) c0 = _mm512_dpbusd_epi32(c0, w[k], _mm512_loadu_si512(x0 + 64 * k));
      accf[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0),
                                PairScales(a.scales + static_cast<size_t>(t) * ngroups, P), accf[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    y[static_cast<size_t>(t) * ldy] = row.scale * (_mm512_reduce_add_ps(accf[t]) - a.offsets[t]);
  }
}

// Two rows for every token: each group pair of both rows decoded once, and each activation
// load feeding both rows' products, so the tokens' activations (64 tokens x 2048 columns are
// 128 KB: L2, not L1) are read once per two rows. Per row the operations and their order are
// GemmRow's: the same bits.
template <class RowT>
void GemmRowPair(const RowT& r0, const RowT& r1, int cols, const Q8Acts& a, float* y0, float* y1, size_t ldy) {
  const int groups = (cols + kGroupCols - 1) / kGroupCols;
  const int pairs = (groups + 1) / 2;
  const bool odd = groups % 2 != 0;
  const int stride = Q8ActStride(cols), ngroups = Q8ActGroups(cols);
  const size_t ahead = kPrefetchBytes;
  __m512 acc0[kMaxTokens], acc1[kMaxTokens];
  const int T = a.tokens;
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  __m512i w0[8], w1[8];
  for (int P = 0; P < pairs; ++P) {
    const bool half = odd && P == pairs - 1;
    r0.DecodePair(P, half, [&](int k, __m512i wk) { w0[k] = wk; }, ahead);
    r1.DecodePair(P, half, [&](int k, __m512i wk) { w1[k] = wk; }, ahead);
    const int8_t* xp = a.q + 512 * P;
    for (int t = 0; t < T; ++t) {
      const int8_t* x = xp + static_cast<size_t>(t) * stride;
      __m512i c0 = _mm512_setzero_si512(), c1 = _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k) {
        const __m512i xk = _mm512_loadu_si512(x + 64 * k);
        c0 = _mm512_dpbusd_epi32(c0, w0[k], xk);
        c1 = _mm512_dpbusd_epi32(c1, w1[k], xk);
      }
      const __m512 s = PairScales(a.scales + static_cast<size_t>(t) * ngroups, P);
      acc0[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0), s, acc0[t]);
      acc1[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1), s, acc1[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    y0[static_cast<size_t>(t) * ldy] = r0.scale * (_mm512_reduce_add_ps(acc0[t]) - a.offsets[t]);
    y1[static_cast<size_t>(t) * ldy] = r1.scale * (_mm512_reduce_add_ps(acc1[t]) - a.offsets[t]);
  }
}
constexpr bool kGemmRowPairs = true;

// Rows decoded side by side at one token, and the prefetch distances. One row at a time with
// its b plane streams prefetched 2 KiB ahead beat 2 and 4 rows side by side (sharing each
// activation load) at every shape measured: 4b or 2b interleaved streams of short row
// segments read slower than b long ones (4096x14336, 4 bits: 15.5 GB/s against 12.7 with 4
// rows; 14336x4096: 16.4 against 14.4; 8 bits: 14.4 against 11.1 and 14.0 against 13.7).
// Dense int8 rows: the same, one row after the next (4 rows side by side measured equal in the
// engine).
template <int B>
constexpr int kSideBySide = 1;
inline size_t BlockAhead(int, size_t) { return kPrefetchBytes; }
inline size_t DenseAhead() { return kPrefetchBytes; }
constexpr int kDenseStreams = 1;

// One token at 5 and 6 bits: the codes by the GFNI bit transpose (BitTranspose8x8Gfni, 32 µops
// per 512 weights against 48) against the token's activations permuted once per call into a
// buffer on the stack. Rows longer than kPermutedMaxStride columns keep DecodePair. Returns
// whether it ran. At 7 and 8 bits it was 1.15-1.3x faster from the cache on AMD Zen 4 but
// not from DRAM, where two threads at 14336x4096 b8 measured 1.00-1.92x slower in 8 of 8
// paired rounds (docs/benchmarks.md): those widths keep Transpose8x8.
constexpr int kPermutedMaxStride = 16384;
constexpr int kPermutedMaxBits = 6;

template <int B, cpu::PrefetchLevel L>
bool OneTokenFast(const BlockAndLut& src, int cols, const Q8Acts& a, float* y, int r0, int r1) {
  if constexpr (B < kTransposeFrom || B > kPermutedMaxBits) {
    return false;
  } else {
    const int stride = Q8ActStride(cols);
    if (stride > kPermutedMaxStride) return false;
    alignas(64) int8_t xq[kPermutedMaxStride];
    PermuteActs(a.q, stride, xq);
    Q8Acts permuted = a;
    permuted.q = xq;
    Row<B, L> row;
    for (int r = r0; r < r1; ++r) {
      row.Init(src, r);
      GemvRows<Row<B, L>, 1, true>(&row, cols, permuted, y + r, kPrefetchBytes);
    }
    return true;
  }
}

#include "kernels/anyprec/q8_rows.inc"

// QuantizeActs's rule for one token (q8_quantize.inc) in 16-float vectors: per group amax by
// vmaxps, q = round-to-nearest-even(x * (127 / amax)) by vmulps and vcvtps2dq (the default
// rounding mode), packed to bytes by vpmovdb; the group's sum of q in int32.
void QuantizeRowVec(const float* x, int cols, int8_t* q, float* scales, float* offset) {
  const int groups = Q8ActGroups(cols);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  double off = 0.0;
  for (int g = 0; g < groups; ++g) {
    const int c0 = g * kGroupCols;
    const int n = c0 >= cols ? 0 : (cols - c0 < kGroupCols ? cols - c0 : kGroupCols);
    auto mask = [&](int i) -> __mmask16 {
      const int m = n - i;
      return m >= 16 ? static_cast<__mmask16>(0xFFFF) : m <= 0 ? 0 : static_cast<__mmask16>((1u << m) - 1);
    };
    __m512 vmax = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
      vmax = _mm512_max_ps(vmax, _mm512_and_ps(_mm512_maskz_loadu_ps(mask(i), x + c0 + i), abs_mask));
    }
    const float amax = _mm512_reduce_max_ps(vmax);
    const float scale = amax / 127.f;
    const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    int8_t* dst = q + (g / 2) * (2 * kGroupCols) + (g % 2) * 32;
    __m512i sum = _mm512_setzero_si512();
    for (int k = 0; k < kGroupCols / 32; ++k) {
      for (int h = 0; h < 2; ++h) {
        const int i = 32 * k + 16 * h;
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask(i), x + c0 + i), inv);
        const __m512i r = _mm512_cvtps_epi32(v);
        sum = _mm512_add_epi32(sum, r);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 64 * k + 16 * h), _mm512_cvtepi32_epi8(r));
      }
    }
    scales[g] = scale;
    off += static_cast<double>(scale) * _mm512_reduce_add_epi32(sum);
  }
  *offset = static_cast<float>(128.0 * off);
}

}  // namespace
}  // namespace avx512q8

void QuantizeRowAvx512(const float* x, int cols, int8_t* q, float* scales, float* offset) {
  avx512q8::QuantizeRowVec(x, cols, q, scales, offset);
}

void DenseQ8RowsAvx512(const Q8Matrix& m, const Q8Acts& acts, float* y, size_t ldy, int row_begin,
                       int row_end) {
  avx512q8::DenseRows(m, acts, y, ldy, row_begin, row_end);
}

void Q8RowsAvx512(const BlockView& view, int bits, const Q8Lut& lut, const Q8Acts& acts, float* y,
                  size_t ldy, int row_begin, int row_end) {
  avx512q8::RowsAnyWidth(view, bits, lut, acts, y, ldy, row_begin, row_end);
}

}  // namespace pw::anyprec::internal
