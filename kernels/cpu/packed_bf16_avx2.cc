// UnpackBf16Rows on AVX2 (compiled with it; chosen at run time): a chunk's 64 columns from one
// 32-byte code load, two nibble masks, two byte shuffles through the row's table and four byte
// interleaves with its low bytes (packed_bf16.h's slot order makes them come out in column order).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/packed_bf16.h"

namespace pw::cpu {

void UnpackBf16RowsAvx2(const PackedBf16View& w, size_t r0, size_t r1, uint16_t* out) {
  const size_t chunks = w.ChunksPerRow();
  const size_t full = w.cols / kPackedChunkColumns;
  const __m256i nib = _mm256_set1_epi8(0x0F);
  for (size_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.Row(r);
    const __m256i tbl = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.tables + r * kPackedTableBytes)));
    uint16_t* o = out + (r - r0) * w.cols;
    for (size_t ch = 0; ch < chunks; ++ch) {
      const uint8_t* p = row + ch * kPackedChunkBytes;
      const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      const __m256i ha = _mm256_shuffle_epi8(tbl, _mm256_and_si256(codes, nib));
      const __m256i hb = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(codes, 4), nib));
      const __m256i la = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
      const __m256i lb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64));
      alignas(32) uint16_t tmp[kPackedChunkColumns];
      uint16_t* d = ch < full ? o + ch * kPackedChunkColumns : tmp;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm256_unpacklo_epi8(la, ha));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 16), _mm256_unpacklo_epi8(lb, hb));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 32), _mm256_unpackhi_epi8(la, ha));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 48), _mm256_unpackhi_epi8(lb, hb));
      if (d == tmp) {
        std::memcpy(o + ch * kPackedChunkColumns, tmp,
                    (w.cols - ch * kPackedChunkColumns) * sizeof(uint16_t));
      }
    }
    for (uint32_t i = w.exc_begin[r]; i < w.exc_begin[r + 1]; ++i) o[w.exc_col[i]] = w.exc_bits[i];
  }
}

}  // namespace pw::cpu
