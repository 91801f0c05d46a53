// The packed bf16 kernels on AVX2 (compiled with it; chosen at run time). A chunk's 64 columns
// come from one 32-byte code load, two nibble masks, two byte shuffles through the row's table
// and four byte interleaves with its low bytes (packed_bf16.h's slot order makes them come out
// in column order): UnpackBf16RowsAvx2 stores them, the one-token GEMV multiplies them in
// registers.
#include <immintrin.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/dense.h"
#include "kernels/cpu/packed_bf16.h"
#include "kernels/cpu/row_streams.h"
#include "kernels/cpu/simd_avx2.h"

namespace pw::cpu {
namespace {

// One packed chunk at q as bf16 values, 16 columns a register: d[0] columns 0..15, d[1] 16..31,
// d[2] 32..47, d[3] 48..63.
inline void DecodeChunkAvx2(const uint8_t* q, __m256i tbl, __m256i d[4]) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i ha = _mm256_shuffle_epi8(tbl, _mm256_and_si256(codes, nib));
  const __m256i hb = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(codes, 4), nib));
  const __m256i la = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
  const __m256i lb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64));
  d[0] = _mm256_unpacklo_epi8(la, ha);
  d[1] = _mm256_unpacklo_epi8(lb, hb);
  d[2] = _mm256_unpackhi_epi8(la, ha);
  d[3] = _mm256_unpackhi_epi8(lb, hb);
}

// R packed rows x one token (xp: the activations padded with zeros to whole chunks): each 16
// columns as the plain AVX2 GEMV (dense_avx2.cc, GemvBf16Avx2) takes them, the even and odd
// weights widened by a shift and a mask against the activations split once into even and odd
// columns, two accumulators a row, in column order. A row's exceptions (decoded as +0) add
// their products after its sum.
template <int R>
inline void PackedGemvAvx2(const float* xp, const PackedBf16View& w, const size_t* rows, float* const* y) {
  __m256 acc[R][2];
  __m256i tbl[R];
  const uint8_t* p[R];
  for (int r = 0; r < R; ++r) {
    acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    tbl[r] = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.tables + rows[r] * kPackedTableBytes)));
    p[r] = w.Row(rows[r]);
  }
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const size_t chunks = w.ChunksPerRow();
  for (size_t c = 0; c < chunks; ++c) {
    __m256 xe[4], xo[4];
    for (int g = 0; g < 4; ++g) {
      const float* xg = xp + c * kPackedChunkColumns + 16 * g;
      const __m256 x0 = _mm256_loadu_ps(xg), x1 = _mm256_loadu_ps(xg + 8);
      const __m256 e = _mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
      const __m256 o = _mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
      xe[g] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
      xo[g] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
    }
    for (int r = 0; r < R; ++r) {
      __m256i d[4];
      DecodeChunkAvx2(p[r] + c * kPackedChunkBytes, tbl[r], d);
      for (int g = 0; g < 4; ++g) {
        acc[r][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(d[g], 16)), xe[g], acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(d[g], hi)), xo[g], acc[r][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    float s = avx2::HSum(_mm256_add_ps(acc[r][0], acc[r][1]));
    for (uint32_t i = w.exc_begin[rows[r]]; i < w.exc_begin[rows[r] + 1]; ++i) {
      s += xp[w.exc_col[i]] * Bf16Bits(w.exc_bits[i]);
    }
    *y[r] = s;
  }
}

}  // namespace

void GemvPackedBf16Avx2(const float* x, bool round_acts, const PackedBf16View& w, size_t n_begin,
                        size_t n_end, float* y) {
  const size_t Kp = w.PaddedCols();
  if (!w.FitsInRegisterProducts()) {
    std::fprintf(stderr, "GemvPackedBf16Avx2: rows of %zu columns\n", w.cols);
    std::abort();
  }
  alignas(32) float xp[kPackedFusedMaxColumns];
  for (size_t k = 0; k < w.cols; ++k) xp[k] = round_acts ? Bf16Bits(ToBf16Bits(x[k])) : x[k];
  for (size_t k = w.cols; k < Kp; ++k) xp[k] = 0.f;
  ForRowStreams<kGemvStreams>(n_begin, n_end, [&](auto r, const size_t* n) {
    constexpr int R = decltype(r)::value;
    float* outs[R];
    for (int s = 0; s < R; ++s) outs[s] = y + n[s];
    PackedGemvAvx2<R>(xp, w, n, outs);
  });
}

void UnpackBf16RowsAvx2(const PackedBf16View& w, size_t r0, size_t r1, uint16_t* out) {
  const size_t chunks = w.ChunksPerRow();
  const size_t full = w.cols / kPackedChunkColumns;
  for (size_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.Row(r);
    const __m256i tbl = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.tables + r * kPackedTableBytes)));
    uint16_t* o = out + (r - r0) * w.cols;
    for (size_t ch = 0; ch < chunks; ++ch) {
      __m256i d[4];
      DecodeChunkAvx2(row + ch * kPackedChunkBytes, tbl, d);
      alignas(32) uint16_t tmp[kPackedChunkColumns];
      uint16_t* dst = ch < full ? o + ch * kPackedChunkColumns : tmp;
      for (int g = 0; g < 4; ++g) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16 * g), d[g]);
      if (dst == tmp) {
        std::memcpy(o + ch * kPackedChunkColumns, tmp,
                    (w.cols - ch * kPackedChunkColumns) * sizeof(uint16_t));
      }
    }
    for (uint32_t i = w.exc_begin[r]; i < w.exc_begin[r + 1]; ++i) o[w.exc_col[i]] = w.exc_bits[i];
  }
}

}  // namespace pw::cpu
