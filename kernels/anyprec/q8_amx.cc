// AMX backend of the integer fast path (q8.h): where UseTiles says (from 8 or 12 tokens, rows
// of up to 2048 columns, of 4096 up to 16 tokens) a block's rows run on AMX-INT8 tiles
// (TDPBSSD, signed int8 x signed int8 into int32); fewer tokens, longer rows and the dense
// int8 matrices are the AVX-512 backend's (q8_avx512.cc). Compiled with the AVX-512 fast
// path's flags plus -mamx-tile -mamx-int8; selected at run time only when the CPU reports
// AMX-TILE and AMX-INT8 beside the AVX-512 fast path's extensions and the kernel grants the
// process the tile data state (q8.cc).
//
// Per block of 16 rows and group pair: each row's codes are formed and looked up in registers
// exactly as in the AVX-512 backend (q8_avx512_decode.inc), but in the row's signed int8 LUT,
// and stored as A tiles: 16 rows x 64 weights of one 256-column group (the 32-column halves of
// two slices), 4 A tiles per group. The activations are laid out once per call as B tiles
// (16 rows of 4-byte column groups x up to 16 tokens: a 16 x 16 dword transpose of the
// tokens' 64 matching bytes). One C tile (16 rows x tokens, int32) sums one group's 256
// columns exactly (4 TDPBSSD), then is converted to fp32 and multiplied by the tokens' scales
// of that group: the same integers and the same one-multiply-add-per-group accumulation as the
// other backends (no +128 offset term: both operands are signed). The row's LUT scale is
// applied once at the end.
//
// No allocation: tiles and the activation layout live on the calling thread's stack (about
// 230 KiB per call; glibc's default thread stack is 8 MiB).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/anyprec/q8_internal.h"
#include "kernels/cpu/amx_tile_config.h"

namespace pw::anyprec::internal {
namespace amxq8 {
namespace {

#include "kernels/anyprec/q8_avx512_decode.inc"

// Where the tiles beat the AVX-512 loops (pw-bench-kernels apq8gemv, one thread, both backends
// with the tiles forced from 1 token, CPU time): from 8 tokens at 3-4 bits (1.09-1.36x at 8
// tokens), from 12 at 5-8 bits (1.04-1.41x at 12; 0.78-0.98x at 8, where the codes cost more
// and the AVX-512 loop's per-token work is still small); rows of up to 2048 columns at any
// token count (1-2 column chunks: 1.4x at 32 tokens), of up to 4096 while they are one chunk
// (up to 16 tokens: 14336x4096 at 12 and 16 tokens 1.2-1.8x). Longer rows stay on AVX-512:
// walked chunk by chunk (2 and 7 passes over the rows of 14336x4096 and 4096x14336 with 4 pairs
// per chunk) the tiles lost almost everywhere (0.16-0.97x at 4-12 tokens, 0.39-1.36x at 16):
// each pass reads a few hundred bytes of every plane row, 8 strided streams.
constexpr int MinTokens(int bits) { return bits <= 4 ? 8 : 12; }
constexpr int kAnyTokensCols = 2048;
// Tokens per C / B tile, rows per A / C tile.
constexpr int kTileTokens = 16;
constexpr int kTileRows = 16;
// Group pairs whose A and B tiles are laid out at a time for G groups of 16 tokens: kChunkPairs
// / G (at least 1): 64 KiB of A tiles per row block (two kept) and at most 64 KiB of B tiles,
// so up to 16 tokens a row of 4096 columns is one chunk.
constexpr int kChunkPairs = 8;
constexpr int kTileBytes = 1024;  // 16 rows x 64 bytes
// Whether block rows of `cols` columns at `tokens` tokens run on the tiles (see MinTokens).
constexpr bool UseTiles(int cols, int tokens, int bits) {
  const int pairs = (cols + 2 * kGroupCols - 1) / (2 * kGroupCols);
  const int g = (tokens + kTileTokens - 1) / kTileTokens;
  return tokens >= MinTokens(bits) && (cols <= kAnyTokensCols || pairs <= kChunkPairs / g);
}
// A and B tiles per group pair: 2 groups x 4 steps of 64 columns.
constexpr int kPairTiles = 8;

// Tiles 0, 1: the C tiles of a pair's two groups (16 rows x w tokens); 2, 4: A tiles (16 rows
// x 64 bytes); 3, 5: B tiles (16 rows x w tokens' 4 bytes).
void Configure(int w) {
  cpu::AmxTileConfig c;
  for (int i : {0, 1, 3, 5}) {
    c.rows[i] = kTileRows;
    c.colsb[i] = static_cast<uint16_t>(4 * w);
  }
  for (int i : {2, 4}) {
    c.rows[i] = kTileRows;
    c.colsb[i] = 64;
  }
  _tile_loadconfig(&c);
}

// r[i] dword j -> r[j] dword i, for a 16 x 16 matrix of dwords in 16 registers.
inline void Transpose16x16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // Now r[4i + q], 128-bit lane L: rows 4i..4i+3 of column 4L + q.
  for (int i = 0; i < 2; ++i) {
    for (int q = 0; q < 4; ++q) {
      t[8 * i + q] = _mm512_shuffle_i32x4(r[8 * i + q], r[8 * i + 4 + q], 0x88);
      t[8 * i + 4 + q] = _mm512_shuffle_i32x4(r[8 * i + q], r[8 * i + 4 + q], 0xDD);
    }
  }
  for (int q = 0; q < 8; ++q) {
    r[q] = _mm512_shuffle_i32x4(t[q], t[8 + q], 0x88);
    r[q + 8] = _mm512_shuffle_i32x4(t[q], t[8 + q], 0xDD);
  }
}

// Index of the A / B tile of group h (0, 1) of a pair, step s (columns 64s..64s+63 of the
// group, i.e. the group's 32-column halves of slices 2s and 2s + 1).
constexpr int TileIndex(int h, int s) { return h * 4 + s; }

// B tiles of pairs [P0, P0 + np) for tokens [t0, t0 + n) (n <= 16; tokens past n are zero):
// tile (p, h, s) row kk, dword i = bytes 4kk..4kk+3 of token t0 + i's 64 activation bytes
// matching A tile (h, s): slice 2s (kk < 8) or 2s + 1 (kk >= 8), half h of the pair's slice.
void LayoutActs(const Q8Acts& a, int stride, int P0, int np, int t0, int n, uint8_t* out) {
  for (int p = 0; p < np; ++p) {
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 4; ++s) {
        __m512i r[16];
        for (int i = 0; i < kTileTokens; ++i) {
          if (i < n) {
            const int8_t* x = a.q + static_cast<size_t>(t0 + i) * stride + 512 * (P0 + p) +
                              128 * s + 32 * h;
            r[i] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))),
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 64)), 1);
          } else {
            r[i] = _mm512_setzero_si512();
          }
        }
        Transpose16x16(r);
        uint8_t* dst = out + (p * kPairTiles + TileIndex(h, s)) * kTileBytes;
        for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(dst + 64 * kk, r[kk]);
      }
    }
  }
}

// Rows [r0, r1) for every token, in blocks of 16 rows, each column chunk's row blocks in three
// stages run one block apart: decode block i into A tiles, multiply block i - 1 (its A tiles
// were stored a whole decode earlier, so the tile loads do not wait for the stores), and scale
// and write back block i - 2 (its C tiles were stored a multiply stage earlier, so the vector
// loads do not wait for the tile unit).
template <int B>
void TileRows(const BlockView& v, const Q8Lut& lut, const Q8Acts& a, float* y, size_t ldy, int r0,
              int r1) {
  const BlockAndLut src{v, lut};
  const int T = a.tokens;
  const int G = (T + kTileTokens - 1) / kTileTokens;  // token groups
  const int W = T < kTileTokens ? T : kTileTokens;     // tile width in tokens
  const int groups = (v.cols + kGroupCols - 1) / kGroupCols;
  const int pairs = (groups + 1) / 2;
  const bool odd = groups % 2 != 0;
  const int stride = Q8ActStride(v.cols), ngroups = Q8ActGroups(v.cols);
  const int chunk = kChunkPairs / G > 0 ? kChunkPairs / G : 1;
  const int nb = (r1 - r0 + kTileRows - 1) / kTileRows;
  static_assert(kMaxTokens <= 4 * kTileTokens);

  // A tiles of two row blocks; B tiles, scales and C tiles of G * np <= kChunkPairs (token
  // group, pair) entries; C tiles of two row blocks.
  alignas(64) uint8_t atiles[2][kChunkPairs * kPairTiles * kTileBytes];
  alignas(64) uint8_t btiles[kChunkPairs * kPairTiles * kTileBytes];
  alignas(64) float scales[kChunkPairs][2][kTileTokens];
  alignas(64) int32_t ctiles[2][kChunkPairs][2][kTileRows * kTileTokens];

  Configure(W);
  for (int P0 = 0; P0 < pairs; P0 += chunk) {
    const int np = pairs - P0 < chunk ? pairs - P0 : chunk;
    const bool first = P0 == 0;
    auto half = [&](int p) { return odd && P0 + p == pairs - 1; };
    // The chunk's activation layout for every token group, kept for every row block.
    for (int j = 0; j < G; ++j) {
      const int t0 = j * kTileTokens;
      const int n = T - t0 < kTileTokens ? T - t0 : kTileTokens;
      LayoutActs(a, stride, P0, np, t0, n, btiles + j * np * kPairTiles * kTileBytes);
      for (int p = 0; p < np; ++p) {
        for (int h = 0; h < 2; ++h) {
          for (int i = 0; i < kTileTokens; ++i) {
            scales[j * np + p][h][i] =
                i < n ? a.scales[static_cast<size_t>(t0 + i) * ngroups + 2 * (P0 + p) + h] : 0.f;
          }
        }
      }
    }
    // A tiles of block b: each row's codes of the chunk, decoded once. Rows of a short last
    // block are zero (their C rows are not written back).
    auto decode = [&](int b) {
      uint8_t* at = atiles[b & 1];
      const int rb = r0 + b * kTileRows;
      const int M = r1 - rb < kTileRows ? r1 - rb : kTileRows;
      if (M < kTileRows) std::memset(at, 0, sizeof atiles[0]);
      for (int m = 0; m < M; ++m) {
        Row<B, false> row;
        row.Init(src, rb + m);
        for (int p = 0; p < np; ++p) {
          uint8_t* base = at + p * kPairTiles * kTileBytes + 64 * m;
          // Slices 2s and 2s + 1 together: their low halves (group 2P) are row m of A tile
          // (0, s), their high halves (group 2P + 1) row m of A tile (1, s).
          __m512i w[8];
          row.DecodePair(P0 + p, half(p), [&](int k, __m512i wk) { w[k] = wk; }, kPrefetchBytes);
          for (int s = 0; s < 4; ++s) {
            uint8_t* d = base + s * kTileBytes;
            _mm512_store_si512(d, _mm512_inserti64x4(w[2 * s], _mm512_castsi512_si256(w[2 * s + 1]), 1));
            _mm512_store_si512(d + 4 * kTileBytes, _mm512_shuffle_i64x2(w[2 * s], w[2 * s + 1], 0xEE));
          }
        }
      }
    };
    // C tiles of block b: one per (token group, pair, group), 4 TDPBSSD each.
    auto multiply = [&](int b) {
      const uint8_t* at0 = atiles[b & 1];
      for (int j = 0; j < G; ++j) {
        for (int p = 0; p < np; ++p) {
          const bool two = !half(p);
          const uint8_t* at = at0 + p * kPairTiles * kTileBytes;
          const uint8_t* bt = btiles + (j * np + p) * kPairTiles * kTileBytes;
          _tile_zero(0);
          if (two) _tile_zero(1);
          for (int s = 0; s < 4; ++s) {
            _tile_loadd(2, at + TileIndex(0, s) * kTileBytes, 64);
            _tile_loadd(3, bt + TileIndex(0, s) * kTileBytes, 64);
            _tile_dpbssd(0, 2, 3);
            if (two) {
              _tile_loadd(4, at + TileIndex(1, s) * kTileBytes, 64);
              _tile_loadd(5, bt + TileIndex(1, s) * kTileBytes, 64);
              _tile_dpbssd(1, 4, 5);
            }
          }
          _tile_stored(0, ctiles[b & 1][j * np + p][0], 64);
          if (two) _tile_stored(1, ctiles[b & 1][j * np + p][1], 64);
        }
      }
    };
    // y[t][rb + m] (+)= lut scale[rb + m] * sum over the chunk's groups of scale[t][g] * C.
    auto write_back = [&](int b) {
      const int rb = r0 + b * kTileRows;
      const int M = r1 - rb < kTileRows ? r1 - rb : kTileRows;
      const __mmask16 rows = static_cast<__mmask16>((1u << M) - 1);
      const __m512 ls = _mm512_maskz_loadu_ps(rows, lut.scales + rb);
      for (int j = 0; j < G; ++j) {
        const int t0 = j * kTileTokens;
        const int n = T - t0 < kTileTokens ? T - t0 : kTileTokens;
        __m512i acc[kTileRows];
        for (auto& r : acc) r = _mm512_castps_si512(_mm512_setzero_ps());
        for (int p = 0; p < np; ++p) {
          const int32_t(*c)[kTileRows * kTileTokens] = ctiles[b & 1][j * np + p];
          const __m512 s0 = _mm512_load_ps(scales[j * np + p][0]);
          const __m512 s1 = _mm512_load_ps(scales[j * np + p][1]);
          const bool two = !half(p);
          for (int m = 0; m < kTileRows; ++m) {
            __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[0] + 16 * m)), s0,
                                       _mm512_castsi512_ps(acc[m]));
            if (two) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[1] + 16 * m)), s1, f);
            acc[m] = _mm512_castps_si512(f);
          }
        }
        Transpose16x16(acc);  // acc[i]: token t0 + i's 16 rows
        for (int i = 0; i < n; ++i) {
          float* yt = y + static_cast<size_t>(t0 + i) * ldy + rb;
          __m512 o = _mm512_mul_ps(_mm512_castsi512_ps(acc[i]), ls);
          if (!first) o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(rows, yt));
          _mm512_mask_storeu_ps(yt, rows, o);
        }
      }
    };
    for (int b = 0; b < nb + 2; ++b) {
      if (b < nb) decode(b);
      if (b >= 1 && b <= nb) multiply(b - 1);
      if (b >= 2) write_back(b - 2);
    }
  }
  _tile_release();
}

}  // namespace
}  // namespace amxq8

void Q8RowsAmx(const BlockView& view, int bits, const Q8Lut& lut, const Q8Acts& acts, float* y,
               size_t ldy, int row_begin, int row_end) {
  if (!amxq8::UseTiles(view.cols, acts.tokens, bits)) {
    Q8RowsAvx512(view, bits, lut, acts, y, ldy, row_begin, row_end);
    return;
  }
  switch (bits) {
    case 3: amxq8::TileRows<3>(view, lut, acts, y, ldy, row_begin, row_end); break;
    case 4: amxq8::TileRows<4>(view, lut, acts, y, ldy, row_begin, row_end); break;
    case 5: amxq8::TileRows<5>(view, lut, acts, y, ldy, row_begin, row_end); break;
    case 6: amxq8::TileRows<6>(view, lut, acts, y, ldy, row_begin, row_end); break;
    case 7: amxq8::TileRows<7>(view, lut, acts, y, ldy, row_begin, row_end); break;
    case 8: amxq8::TileRows<8>(view, lut, acts, y, ldy, row_begin, row_end); break;
    default: break;
  }
}

}  // namespace pw::anyprec::internal
