// AMX backend of the dense CPU kernels: the bf16 matmul for five tokens and more on AMX-BF16
// tiles; fewer tokens, the fp32 matmul and the vector kernels are the AVX-512 backend's.
// Compiled with -mamx-tile -mamx-bf16 -mavx512bf16 (pw_kernels_cpu's CMakeLists); selected at
// run time only when the CPU reports AMX-TILE, AMX-BF16 and AVX512-BF16 and the kernel grants
// the process the tile data state (dispatch.cc).
//
// Precision: the weights are bf16 already; each fp32 activation is split into three bf16
// values, hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid) (round to nearest even), and
// the three are multiplied against the weights (TDPBF16PS: bf16 x bf16 products are exact in
// fp32, summed in fp32). Each rounding keeps the next 8 significant bits and leaves an exact
// residual, so hi + mid + lo == x for every normal x with |x| > 2^-100 (24 bits = fp32's
// significand): the products are the fp32 products and only the order of the fp32 sums differs
// from the other backends (the same tolerance holds). The tile unit treats denormal bf16 inputs
// as zero, so for smaller activations the dropped part is below 2^-126 per product;
// non-finite activations give NaN.
//
// No allocation: the activation layout lives on the calling thread's stack (192 KiB per call,
// kChunkCols below), so callers' threads need stacks of at least 256 KiB (glibc's default is
// 8 MiB).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "kernels/cpu/amx_tile_config.h"
#include "kernels/cpu/dense.h"

namespace pw::cpu {

void MatmulBf16Avx512(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                      size_t n_begin, size_t n_end, float* y, size_t ldy);
void MatmulF32Avx512(const float* x, size_t ldx, size_t T, const float* w, size_t K, size_t n_begin,
                     size_t n_end, float* y, size_t ldy);
void MatmulBf16TilesAvx512(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                           size_t n_begin, size_t n_end, float* y, size_t ldy);
void RmsNormAvx512(const float* x, const float* w, size_t dim, float eps, float* y);
void SoftmaxAvx2(float* x, size_t n);
void SiluMulAvx2(const float* gate, const float* up, size_t n, float* out);
float DotAvx512(const float* a, const float* b, size_t n);
void AxpyAvx512(float alpha, const float* x, size_t n, float* y);

namespace {

// Fewest tokens the tiles take: up to 4 tokens stay on the AVX-512 few-token GEMV, which reads
// memory faster there (pw-bench-kernels, bf16gemv t1..t4: 14-15.6 GB/s per core against
// 12-13 GB/s on tiles) and is not bound by its arithmetic yet.
constexpr size_t kMinTokens = 5;
// Tokens per tile (one C tile holds 16 rows x 16 tokens) and per pass over the weights.
constexpr int kGroup = 16;
constexpr size_t kPassTokens = 2 * kGroup;
// Columns whose split activations are laid out at a time, for G groups of 16 tokens: 2048 / G
// (G x 3 parts x 1024 / G pairs x 16 tokens x 4 bytes = 192 KiB of stack, kept in L2 while
// every row of the thread's range reads it). A row of up to 2048 columns (every OLMoE matrix
// at G = 1) is then read in one piece.
constexpr size_t kChunkCols = 2048;
constexpr int kSplits = 3;

// Tiles: 0 and 1 the accumulators of groups 0 and 1, 2 the weight rows (16 rows x 32 bf16), 3/4/5 the hi/mid/lo activations of group 0, 6/7 hi/mid of
// group 1 (its lo goes through tile 3 once group 0's hi has been used, so at G = 2 both groups
// are laid out 16 tokens wide, group 1 padded with zero activations). tt: the tokens of group 0
// (G = 1) or 16 (G = 2).
void Configure(int tt) {
  AmxTileConfig c;
  c.rows[2] = 16;
  c.colsb[2] = 64;
  for (int i : {0, 1, 3, 4, 5, 6, 7}) {
    c.rows[i] = 16;
    c.colsb[i] = static_cast<uint16_t>(4 * tt);
  }
  _tile_loadconfig(&c);
}

// Lays out columns [k0, k0 + kc) (kc a multiple of 32) of tokens [0, tt) as B tiles `width`
// tokens wide (width >= tt): dword p * width + t of part j (hi, mid, lo) holds part j of
// columns k0 + 2p and k0 + 2p + 1 of token t, even column in the low half.
inline __m512 Widen(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

void SplitActs(const float* x, size_t ldx, int tt, size_t k0, size_t kc, uint32_t* hi,
               uint32_t* mid, uint32_t* lo, int width) {
  const __m512i lane = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(width));
  for (int t = 0; t < tt; ++t) {
    const float* xt = x + static_cast<size_t>(t) * ldx + k0;
    for (size_t p0 = 0; 2 * p0 < kc; p0 += 16) {
      __m512 a = _mm512_loadu_ps(xt + 2 * p0), b = _mm512_loadu_ps(xt + 2 * p0 + 16);
      const __m512i idx = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(p0) * width + t));
      uint32_t* parts[kSplits] = {hi, mid, lo};
      for (int j = 0; j < kSplits; ++j) {
        const __m512i h = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
        _mm512_i32scatter_epi32(parts[j], idx, h, 4);
        if (j + 1 < kSplits) {
          a = _mm512_sub_ps(a, Widen(_mm512_castsi512_si256(h)));
          b = _mm512_sub_ps(b, Widen(_mm512_extracti64x4_epi64(h, 1)));
        }
      }
    }
  }
}

// C tile (16 rows x tt tokens, row stride 64 bytes) into y[t * ldy + r], r < 16: stored on the
// first column chunk, added on the next ones.
inline void WriteBack(const float* c, int tt, bool first, float* y, size_t ldy) {
  const __m512i rows =
      _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 16, 0);
  for (int t = 0; t < tt; ++t) {
    float* yt = y + static_cast<size_t>(t) * ldy;
    const __m512 v = _mm512_i32gather_ps(rows, c + t, 4);
    _mm512_storeu_ps(yt, first ? v : _mm512_add_ps(v, _mm512_loadu_ps(yt)));
  }
}

// Rows [n_begin, n_end) (a multiple of 16 apart), columns [0, K32) (a multiple of 32), tokens
// [0, T) with T <= kPassTokens, in blocks of 16 adjacent rows; each weight is read once per
// column chunk (once in all at G = 1 and K <= 2048), the next block prefetched line by line
// while one is multiplied. (Blocks of 16 rows taken from 16 distant parts of the range, one
// long stream per tile row, measured no faster.)
// kSegment: the columns one accumulator sums before its tile is added into y in fp32 (at most
// the chunk, the columns laid out at a time, kChunkCols / G). Every token count sums in one
// order when both G use the same segments (kChunkCols / 2): the batch-invariant table.
template <int G, size_t kSegment = kChunkCols / G>
void TilePass(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K, size_t K32,
              size_t n_begin, size_t n_end, float* y, size_t ldy) {
  constexpr size_t kChunk = kChunkCols / G;
  static_assert(kSegment <= kChunk && kChunk % kSegment == 0 && kSegment % 32 == 0);
  constexpr size_t kPairs = kChunk / 2;
  alignas(64) uint32_t acts[G][kSplits][kPairs * kGroup];
  alignas(64) float c[G][16 * 16];
  const int tt0 = static_cast<int>(T < kGroup ? T : kGroup);
  const int tt1 = G == 2 ? kGroup : 0;  // the layout width of group 1
  Configure(tt0);
  const size_t stride = K * sizeof(uint16_t);
  // Group 1's padding tokens stay zero for every chunk.
  if constexpr (G == 2) std::memset(acts[1], 0, sizeof acts[1]);
  for (size_t k0 = 0; k0 < K32; k0 += kChunk) {
    const size_t kc = K32 - k0 < kChunk ? K32 - k0 : kChunk;
    SplitActs(x, ldx, tt0, k0, kc, acts[0][0], acts[0][1], acts[0][2], tt0);
    if constexpr (G == 2) {
      SplitActs(x + kGroup * ldx, ldx, static_cast<int>(T) - kGroup, k0, kc, acts[1][0], acts[1][1],
                acts[1][2], kGroup);
    }
    for (size_t n0 = n_begin; n0 < n_end; n0 += 16) {
      const uint16_t* a = w + n0 * K + k0;
      // The next row block, at the same columns (one line per row per step).
      const char* ahead = reinterpret_cast<const char*>(a + 16 * K);
      // The accumulators into y: stored on the row block's first segment, added on the next.
      bool first = k0 == 0;
      auto flush = [&] {
        _tile_stored(0, c[0], 64);
        WriteBack(c[0], tt0, first, y + n0, ldy);
        if constexpr (G == 2) {
          _tile_stored(1, c[1], 64);
          WriteBack(c[1], static_cast<int>(T) - kGroup, first, y + kGroup * ldy + n0, ldy);
        }
        first = false;
      };
      _tile_zero(0);
      if constexpr (G == 2) _tile_zero(1);
      for (size_t kk = 0; kk < kc; kk += 32) {
        _tile_loadd(2, a + kk, stride);
        const size_t p = kk / 2;
        _tile_loadd(3, acts[0][0] + p * tt0, 4 * tt0);
        _tile_loadd(4, acts[0][1] + p * tt0, 4 * tt0);
        _tile_loadd(5, acts[0][2] + p * tt0, 4 * tt0);
        // hi, mid, lo in that order into one accumulator: hi + mid is exact, so one activation
        // times one weight comes out as the fp32 product.
        if constexpr (G == 1) {
          _tile_dpbf16ps(0, 2, 3);
          _tile_dpbf16ps(0, 2, 4);
          _tile_dpbf16ps(0, 2, 5);
        } else {
          _tile_loadd(6, acts[1][0] + p * tt1, 4 * tt1);
          _tile_loadd(7, acts[1][1] + p * tt1, 4 * tt1);
          _tile_dpbf16ps(0, 2, 3);
          _tile_dpbf16ps(0, 2, 4);
          _tile_dpbf16ps(0, 2, 5);
          _tile_dpbf16ps(1, 2, 6);
          _tile_dpbf16ps(1, 2, 7);
          _tile_loadd(3, acts[1][2] + p * tt1, 4 * tt1);
          _tile_dpbf16ps(1, 2, 3);
        }
        for (int r = 0; r < 16; ++r) _mm_prefetch(ahead + r * stride + kk * 2, _MM_HINT_T0);
        if constexpr (kSegment < kChunk) {
          if ((kk + 32) % kSegment == 0 && kk + 32 < kc) {
            flush();
            _tile_zero(0);
            if constexpr (G == 2) _tile_zero(1);
          }
        }
      }
      flush();
    }
  }
  _tile_release();
}

// kInvariant: tiles for every token count (not only from kMinTokens), the same accumulation
// segments for one and two groups, and the rows past the last block of 16 on the AVX-512 tiles, so each
// token sums in one order whatever T is.
template <bool kInvariant>
void MatmulBf16AmxImpl(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                       size_t n_begin, size_t n_end, float* y, size_t ldy) {
  constexpr auto rest = kInvariant ? MatmulBf16TilesAvx512 : MatmulBf16Avx512;
  const size_t K32 = K / 32 * 32;
  const size_t n_tiles = n_begin + (n_end - n_begin) / 16 * 16;
  if ((!kInvariant && T < kMinTokens) || K32 == 0 || n_tiles == n_begin) {
    rest(x, ldx, T, w, K, n_begin, n_end, y, ldy);
    return;
  }
  for (size_t t0 = 0; t0 < T; t0 += kPassTokens) {
    const size_t tt = T - t0 < kPassTokens ? T - t0 : kPassTokens;
    const float* xt = x + t0 * ldx;
    float* yt = y + t0 * ldy;
    if (tt > static_cast<size_t>(kGroup)) {
      TilePass<2>(xt, ldx, tt, w, K, K32, n_begin, n_tiles, yt, ldy);
    } else if constexpr (kInvariant) {
      TilePass<1, kChunkCols / 2>(xt, ldx, tt, w, K, K32, n_begin, n_tiles, yt, ldy);
    } else {
      TilePass<1>(xt, ldx, tt, w, K, K32, n_begin, n_tiles, yt, ldy);
    }
    // Columns past the last multiple of 32, in fp32.
    if (K32 < K) {
      for (size_t t = 0; t < tt; ++t) {
        for (size_t n = n_begin; n < n_tiles; ++n) {
          float s = 0.f;
          for (size_t k = K32; k < K; ++k) s += xt[t * ldx + k] * Bf16Bits(w[n * K + k]);
          yt[t * ldy + n] += s;
        }
      }
    }
  }
  // Rows past the last block of 16.
  if (n_tiles < n_end) rest(x, ldx, T, w, K, n_tiles, n_end, y, ldy);
}

void MatmulBf16Amx(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                   size_t n_begin, size_t n_end, float* y, size_t ldy) {
  MatmulBf16AmxImpl<false>(x, ldx, T, w, K, n_begin, n_end, y, ldy);
}

void MatmulBf16AmxInvariant(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                            size_t n_begin, size_t n_end, float* y, size_t ldy) {
  MatmulBf16AmxImpl<true>(x, ldx, T, w, K, n_begin, n_end, y, ldy);
}

}  // namespace

const kernels::DenseKernels kAmxKernels = {
    MatmulBf16Amx, MatmulF32Avx512, RmsNormAvx512, SoftmaxAvx2,
    SiluMulAvx2,   DotAvx512,       AxpyAvx512,
};

const kernels::DenseKernels kAmxInvariantKernels = {
    MatmulBf16AmxInvariant, MatmulF32Avx512, RmsNormAvx512, SoftmaxAvx2,
    SiluMulAvx2,            DotAvx512,       AxpyAvx512,
};

}  // namespace pw::cpu
