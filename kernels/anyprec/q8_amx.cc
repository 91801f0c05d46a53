// AMX backend of the integer fast path (q8.h): where UseTiles says (from 8 or 12 tokens, rows
// of up to 16384 columns) a block's rows run on AMX-INT8 tiles (TDPBSSD, signed int8 x signed
// int8 into int32); fewer tokens, longer rows and the dense int8 matrices are the AVX-512
// backend's (q8_avx512.cc). Compiled with the AVX-512 fast
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
// No allocation: tiles and the activation layout live on the calling thread's stack, a fixed
// 420 KiB frame per call whatever the shape (A tiles 128 KiB, B tiles 256 KiB, C tiles 32 KiB,
// scales 4 KiB), as the dense AMX kernel's (kernels/cpu/dense_amx.cc, 192 KiB): the callers'
// threads are std::threads and the main thread, with glibc's default stacks (8 MiB here;
// nothing in the project sets a smaller one).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/anyprec/q8_internal.h"
#include "kernels/cpu/prefetch_distance.h"
#include "kernels/cpu/amx_tile_config.h"

namespace pw::anyprec::internal {
namespace amxq8 {
namespace {

#include "kernels/anyprec/q8_avx512_decode.inc"

// Where the tiles beat the AVX-512 loops (pw-bench-kernels apq8gemv, one thread, both backends
// with the tiles forced from 1 token, CPU time): from 8 tokens at 3-4 bits (1.09-1.36x at 8
// tokens), from 12 at 5-8 bits (1.04-1.41x at 12; 0.78-0.98x at 8, where the codes cost more
// and the AVX-512 loop's per-token work is still small). Rows longer than 4096 columns, walked
// row block by row block across all columns (TileRows): from 8 tokens at 3 bits, from 12 at
// 4-8 bits (4096x14336 at 8 tokens: 3 bits 1.02-1.09x, 4 bits 0.94-0.98x, 8 bits 0.80-0.83x;
// at 12 tokens 0.98-1.47x, at 16 1.27-1.87x, at 32 (token passes of 16) 1.12-1.84x; rows of
// 4096 columns at 32 tokens, 14336x4096: 2.17-2.80x).
constexpr int MinTokens(int bits, int cols) {
  return cols > 4096 ? (bits <= 3 ? 8 : 12) : (bits <= 4 ? 8 : 12);
}
constexpr int kAnyTokensCols = 2048;
// Tokens per C / B tile, rows per A / C tile.
constexpr int kTileTokens = 16;
constexpr int kTileRows = 16;
// Group pairs whose A and B tiles are laid out at a time for G groups of 16 tokens: kChunkPairs
// / G (at least 1): 64 KiB of A tiles per row block (two kept) and at most 64 KiB of B tiles,
// so up to 16 tokens a row of 4096 columns is one chunk.
constexpr int kChunkPairs = 8;
constexpr int kTileBytes = 1024;  // 16 rows x 64 bytes
// (group pair, token group) entries whose B tiles are laid out at once when rows are walked
// row block by row block across all their columns: 256 KiB, a row of 16384 columns at up to
// 16 tokens (a row of 14336 columns: 224 KiB).
constexpr int kAllPairEntries = 32;
constexpr int Pairs(int cols) { return (cols + 2 * kGroupCols - 1) / (2 * kGroupCols); }
constexpr int TokenGroups(int tokens) { return (tokens + kTileTokens - 1) / kTileTokens; }
// Whether rows of `cols` columns at `tokens` tokens fit the all-columns walk.
constexpr bool AllColumns(int cols, int tokens) { return TokenGroups(tokens) * Pairs(cols) <= kAllPairEntries; }
// Whether block rows of `cols` columns at `tokens` tokens run on the tiles (see MinTokens):
// rows of up to 2048 columns at any token count, longer ones where the B tiles of one token
// group and every column fit the all-columns walk (up to 16384 columns; more tokens run in
// passes, Q8RowsAmx). Rows longer still stay on AVX-512: walked chunk by chunk, one pass over
// all rows per chunk (each pass reading a few hundred bytes of every plane row, 8 strided
// streams), the tiles lost almost everywhere (0.16-0.97x at 4-12 tokens, 0.39-1.36x at 16).
constexpr bool UseTiles(int cols, int tokens, int bits) {
  return tokens >= MinTokens(bits, cols) && (cols <= kAnyTokensCols || AllColumns(cols, 1));
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

// Rows [r0, r1) for every token, in blocks of 16 rows, in steps of one row block and one
// column chunk (kChunkPairs / G group pairs), each step in three stages run one step apart:
// decode step i into A tiles, multiply step i - 1 (its A tiles were stored a whole decode
// earlier, so the tile loads do not wait for the stores), and scale and write back step i - 2
// (its C tiles were stored a multiply stage earlier, so the vector loads do not wait for the
// tile unit). Rows that are one chunk: one step per row block. Longer rows whose B tiles fit
// kAllPairEntries (AllColumns): row block outer, chunk inner, the B tiles of every column laid
// out once, so each row block's planes are read front to back, one step after another. Otherwise (rows of up to 2048 columns
// beyond 16 tokens): chunk outer, row block inner, the B tiles of one chunk at a time.
template <int B>
void TileRows(const BlockView& v, const Q8Lut& lut, const Q8Acts& a, float* y, size_t ldy, int r0,
              int r1) {
  const BlockAndLut src{v, lut};
  const int T = a.tokens;
  const int G = TokenGroups(T);
  const int W = T < kTileTokens ? T : kTileTokens;     // tile width in tokens
  const int groups = (v.cols + kGroupCols - 1) / kGroupCols;
  const int pairs = Pairs(v.cols);
  const bool odd = groups % 2 != 0;
  const int stride = Q8ActStride(v.cols), ngroups = Q8ActGroups(v.cols);
  const int chunk = kChunkPairs / G > 0 ? kChunkPairs / G : 1;
  const int nchunks = (pairs + chunk - 1) / chunk;
  const int nb = (r1 - r0 + kTileRows - 1) / kTileRows;
  const bool all = nchunks > 1 && AllColumns(v.cols, T);
  static_assert(kMaxTokens <= 4 * kTileTokens);
  static_assert(kAllPairEntries >= kChunkPairs);

  // A tiles of two steps; B tiles and scales of G x (the chunk's or every) pair entries; C
  // tiles of two steps.
  alignas(64) uint8_t atiles[2][kChunkPairs * kPairTiles * kTileBytes];
  alignas(64) uint8_t btiles[kAllPairEntries * kPairTiles * kTileBytes];
  alignas(64) float scales[kAllPairEntries][2][kTileTokens];
  alignas(64) int32_t ctiles[2][kChunkPairs][2][kTileRows * kTileTokens];

  // B tiles and scales of pairs [P0, P0 + np) for every token group, entry j * np + p.
  auto layout = [&](int P0, int np) {
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
  };
  // Step k: row block and chunk; LP0, lnp: the pairs whose B tiles are laid out.
  int LP0 = 0, lnp = 0;
  struct Step {
    int rb, M, P0, np;
  };
  auto step = [&](int k) {
    const int b = all ? k / nchunks : k;
    const int c = all ? k % nchunks : LP0 / chunk;
    Step s;
    s.rb = r0 + b * kTileRows;
    s.M = r1 - s.rb < kTileRows ? r1 - s.rb : kTileRows;
    s.P0 = c * chunk;
    s.np = pairs - s.P0 < chunk ? pairs - s.P0 : chunk;
    return s;
  };
  auto half = [&](int P) { return odd && P == pairs - 1; };
  auto entry = [&](int j, int P) { return j * lnp + (P - LP0); };

  // A tiles of step k: each row's codes of the chunk, decoded once. Rows of a short last
  // block are zero (their C rows are not written back). Each plane stream is prefetched
  // kPrefetchBytes ahead as on AVX-512 (a prefetch of exactly the next step's bytes instead,
  // one line per plane row and pair, was 5-10 % slower at 4096x14336, 12 and 16 tokens).
  auto decode = [&](int k) {
    const Step s = step(k);
    uint8_t* at = atiles[k & 1];
    if (s.M < kTileRows) std::memset(at, 0, sizeof atiles[0]);
    for (int m = 0; m < s.M; ++m) {
      Row<B, cpu::PrefetchLevel::kL1, false> row;
      row.Init(src, s.rb + m);
      for (int p = 0; p < s.np; ++p) {
        uint8_t* base = at + p * kPairTiles * kTileBytes + 64 * m;
        // Slices 2q and 2q + 1 together: their low halves (group 2P) are row m of A tile
        // (0, q), their high halves (group 2P + 1) row m of A tile (1, q).
        __m512i w[8];
        row.DecodePair(s.P0 + p, half(s.P0 + p), [&](int kk, __m512i wk) { w[kk] = wk; },
                       kPrefetchBytes);
        for (int q = 0; q < 4; ++q) {
          uint8_t* d = base + q * kTileBytes;
          _mm512_store_si512(d, _mm512_inserti64x4(w[2 * q], _mm512_castsi512_si256(w[2 * q + 1]), 1));
          _mm512_store_si512(d + 4 * kTileBytes, _mm512_shuffle_i64x2(w[2 * q], w[2 * q + 1], 0xEE));
        }
      }
    }
  };
  // C tiles of step k: one per (token group, pair, group), 4 TDPBSSD each.
  auto multiply = [&](int k) {
    const Step s = step(k);
    const uint8_t* at0 = atiles[k & 1];
    for (int j = 0; j < G; ++j) {
      for (int p = 0; p < s.np; ++p) {
        const bool two = !half(s.P0 + p);
        const uint8_t* at = at0 + p * kPairTiles * kTileBytes;
        const uint8_t* bt = btiles + entry(j, s.P0 + p) * kPairTiles * kTileBytes;
        _tile_zero(0);
        if (two) _tile_zero(1);
        for (int q = 0; q < 4; ++q) {
          _tile_loadd(2, at + TileIndex(0, q) * kTileBytes, 64);
          _tile_loadd(3, bt + TileIndex(0, q) * kTileBytes, 64);
          _tile_dpbssd(0, 2, 3);
          if (two) {
            _tile_loadd(4, at + TileIndex(1, q) * kTileBytes, 64);
            _tile_loadd(5, bt + TileIndex(1, q) * kTileBytes, 64);
            _tile_dpbssd(1, 4, 5);
          }
        }
        _tile_stored(0, ctiles[k & 1][j * s.np + p][0], 64);
        if (two) _tile_stored(1, ctiles[k & 1][j * s.np + p][1], 64);
      }
    }
  };
  // y[t][rb + m] (+)= lut scale[rb + m] * sum over the chunk's groups of scale[t][g] * C
  // (+ from the second chunk of a row block on).
  auto write_back = [&](int k) {
    const Step s = step(k);
    const bool first = s.P0 == 0;
    const __mmask16 rows = static_cast<__mmask16>((1u << s.M) - 1);
    const __m512 ls = _mm512_maskz_loadu_ps(rows, lut.scales + s.rb);
    for (int j = 0; j < G; ++j) {
      const int t0 = j * kTileTokens;
      const int n = T - t0 < kTileTokens ? T - t0 : kTileTokens;
      __m512i acc[kTileRows];
      for (auto& r : acc) r = _mm512_castps_si512(_mm512_setzero_ps());
      for (int p = 0; p < s.np; ++p) {
        const int32_t(*c)[kTileRows * kTileTokens] = ctiles[k & 1][j * s.np + p];
        const int e = entry(j, s.P0 + p);
        const __m512 s0 = _mm512_load_ps(scales[e][0]);
        const __m512 s1 = _mm512_load_ps(scales[e][1]);
        const bool two = !half(s.P0 + p);
        for (int m = 0; m < kTileRows; ++m) {
          __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[0] + 16 * m)), s0,
                                     _mm512_castsi512_ps(acc[m]));
          if (two) f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[1] + 16 * m)), s1, f);
          acc[m] = _mm512_castps_si512(f);
        }
      }
      Transpose16x16(acc);  // acc[i]: token t0 + i's 16 rows
      for (int i = 0; i < n; ++i) {
        float* yt = y + static_cast<size_t>(t0 + i) * ldy + s.rb;
        __m512 o = _mm512_mul_ps(_mm512_castsi512_ps(acc[i]), ls);
        if (!first) o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(rows, yt));
        _mm512_mask_storeu_ps(yt, rows, o);
      }
    }
  };
  auto run = [&](int steps) {
    for (int k = 0; k < steps + 2; ++k) {
      if (k < steps) decode(k);
      if (k >= 1 && k <= steps) multiply(k - 1);
      if (k >= 2) write_back(k - 2);
    }
  };

  Configure(W);
  if (all) {
    LP0 = 0;
    lnp = pairs;
    layout(0, pairs);
    run(nb * nchunks);
  } else {
    for (int P0 = 0; P0 < pairs; P0 += chunk) {
      LP0 = P0;
      lnp = pairs - P0 < chunk ? pairs - P0 : chunk;
      layout(P0, lnp);
      run(nb);
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
  // Rows longer than kAnyTokensCols whose B tiles at this many tokens exceed kAllPairEntries:
  // the tokens in passes that fit (each pass decodes the rows again).
  int per = acts.tokens;
  if (view.cols > amxq8::kAnyTokensCols && !amxq8::AllColumns(view.cols, per)) {
    const int g = amxq8::kAllPairEntries / amxq8::Pairs(view.cols);
    per = (g > 1 ? g : 1) * amxq8::kTileTokens;
  }
  const int stride = Q8ActStride(view.cols), ngroups = Q8ActGroups(view.cols);
  for (int t0 = 0; t0 < acts.tokens; t0 += per) {
    const Q8Acts a{acts.tokens - t0 < per ? acts.tokens - t0 : per, acts.cols,
                   acts.q + static_cast<size_t>(t0) * stride,
                   acts.scales + static_cast<size_t>(t0) * ngroups, acts.offsets + t0};
    float* yt = y + static_cast<size_t>(t0) * ldy;
    switch (bits) {
      case 3: amxq8::TileRows<3>(view, lut, a, yt, ldy, row_begin, row_end); break;
      case 4: amxq8::TileRows<4>(view, lut, a, yt, ldy, row_begin, row_end); break;
      case 5: amxq8::TileRows<5>(view, lut, a, yt, ldy, row_begin, row_end); break;
      case 6: amxq8::TileRows<6>(view, lut, a, yt, ldy, row_begin, row_end); break;
      case 7: amxq8::TileRows<7>(view, lut, a, yt, ldy, row_begin, row_end); break;
      case 8: amxq8::TileRows<8>(view, lut, a, yt, ldy, row_begin, row_end); break;
      default: break;
    }
  }
}

}  // namespace pw::anyprec::internal
