// Lossless packed bf16 weights: the same bf16 values in 12 bits a weight instead of 16.
//
// A bf16 weight is two bytes: the high byte (sign and the top seven exponent bits) and the low
// byte (the last exponent bit and the seven mantissa bits). Trained weights (and initialised
// ones) use few high bytes per row: a row's values span a few binades of either sign, so 16
// high bytes cover all or nearly all of a row. The packed form keeps each low byte as it is and
// replaces each high byte with a 4-bit code into the row's table of 16 high bytes; a value
// whose high byte is not in the table is an exception, stored whole beside the matrix (its code
// decodes to +0, so a kernel adds its product separately). Decoding is exact: every packed row
// unpacks to the bits it was packed from (tests/kernels_cpu/packed_bf16_test.cc). A step that
// reads a bf16 matrix once per token reads 0.75x its bytes (plus the tables and exceptions).
//
// Layout, per row: ceil(cols / 64) chunks of 96 bytes, a chunk being 64 columns (the last
// padded with code 0 and low byte 0: finite values, since the exponent's last bit is 0, which the
// kernels multiply by zero activations or do not read): 32 code bytes, then 64 low bytes. Chunk slot s (0..63) holds
// column ColumnOfSlot(s) of the chunk; slot s's code is the low nibble of code byte s for
// s < 32, the high nibble of code byte s - 32 otherwise; its low byte is low byte s. This order
// lets an AVX-512 core decode a chunk with one byte shuffle and two byte interleaves into the
// chunk's columns 0..31 and 32..63 in order (an AVX2 core, in two halves of the same bytes).
//
// Kernels take a PackedBf16View (non-owning, as every kernel's arguments: kernels/dense_ops.h);
// PackBf16 makes the owning PackedBf16Matrix, once per matrix when a model loads
// (engine/models/model.h: QuantizeDense with DenseFormat::kBf16Packed, PackExperts) or a decode
// worker has fetched the broker's experts (services/workers/weights/remote_experts.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/dense_ops.h"

namespace pw::cpu {

inline constexpr size_t kPackedChunkColumns = 64;
inline constexpr size_t kPackedChunkBytes = 96;  // 32 code bytes, 64 low bytes
inline constexpr size_t kPackedTableBytes = 16;  // a row's high bytes by code

// The AVX512-BF16 product keeps a group of tokens' activations (the row padded to chunks each)
// on its stack, kPackedFusedActs values: at least one token's.
inline constexpr size_t kPackedFusedActs = size_t{64} << 10;
inline constexpr size_t kPackedFusedMaxColumns = size_t{16} << 10;

// The column (0..63, within its chunk) that chunk slot s holds.
constexpr size_t ColumnOfSlot(size_t s) {
  const size_t lane = s / 16, j = s % 16;
  return j < 8 ? 8 * lane + j : 32 + 8 * lane + (j - 8);
}

struct PackedBf16View {
  size_t rows = 0;
  size_t cols = 0;
  const uint8_t* chunks = nullptr;     // rows x ChunksPerRow() x kPackedChunkBytes
  const uint8_t* tables = nullptr;     // rows x kPackedTableBytes
  const uint32_t* exc_begin = nullptr; // rows + 1: row r's exceptions are [exc_begin[r], exc_begin[r + 1])
  const uint32_t* exc_col = nullptr;   // column of each exception, ascending within a row
  const uint16_t* exc_bits = nullptr;  // its bf16 bits

  size_t ChunksPerRow() const { return (cols + kPackedChunkColumns - 1) / kPackedChunkColumns; }
  size_t PaddedCols() const { return ChunksPerRow() * kPackedChunkColumns; }
  // Whether the products that decode in registers take these rows (kPackedFusedMaxColumns).
  bool FitsInRegisterProducts() const { return cols > 0 && PaddedCols() <= kPackedFusedMaxColumns; }
  const uint8_t* Row(size_t r) const { return chunks + r * ChunksPerRow() * kPackedChunkBytes; }
};

// Bytes of a packed [rows, cols] matrix without exceptions (each adds 6): chunks, tables and
// the exceptions' row index.
constexpr size_t PackedBf16Bytes(size_t rows, size_t cols) {
  return rows * ((cols + kPackedChunkColumns - 1) / kPackedChunkColumns * kPackedChunkBytes +
                 kPackedTableBytes) +
         (rows + 1) * sizeof(uint32_t);
}

class PackedBf16Matrix {
 public:
  PackedBf16View view() const;
  // Bytes a product reads: chunks, tables and exceptions.
  size_t Bytes() const;
  // Bytes of the same matrix as plain bf16; packing pays when Bytes() is less.
  size_t PlainBytes() const { return 2 * rows_ * cols_; }
  size_t exceptions() const { return exc_col_.size(); }

 private:
  friend PackedBf16Matrix PackBf16(const uint16_t* w, size_t rows, size_t cols);
  size_t rows_ = 0, cols_ = 0;
  std::vector<uint8_t> chunks_, tables_;
  std::vector<uint32_t> exc_begin_, exc_col_;
  std::vector<uint16_t> exc_bits_;
};

// Packs the row-major bf16 matrix w [rows, cols]. Each row's table holds its 16 most frequent
// high bytes (ties to the smaller byte); when a row has more than 16, one entry is 0x00 (the
// exceptions' code) and the other 15 are its most frequent others.
PackedBf16Matrix PackBf16(const uint16_t* w, size_t rows, size_t cols);

// Rows [r0, r1) of w unpacked into out (rows of w.cols values, exceptions restored): the exact
// bits PackBf16 was given. The reference (scalar) and the fastest this CPU runs (AVX2 where
// present), which tests check against it.
void UnpackBf16RowsScalar(const PackedBf16View& w, size_t r0, size_t r1, uint16_t* out);
void UnpackBf16Rows(const PackedBf16View& w, size_t r0, size_t r1, uint16_t* out);

// k.matmul_bf16's product (kernels/dense_ops.h) over the packed rows [n_begin, n_end) of w:
// y[t*ldy + n] = sum_k x[t*ldx + k] * W[n, k]. Where k is the bf16-activation table on
// AVX512-BF16 (UsesAvx512Bf16) and a row is at most kPackedFusedMaxColumns: up to
// kPackedFusedTokens tokens, each chunk is decoded in registers and multiplied there, in the
// order of that table's kernel (the same bits, but for the rows with exceptions, whose products
// are added after the row's sum); more tokens, blocks of rows are decoded into a buffer on the
// stack and multiplied by that kernel's tiles (its bits). One token on the AVX2 tables' GEMV:
// GemvPackedBf16Avx2 below. Otherwise the rows are unpacked
// `scratch_values / cols` at a time into scratch (at least one row's worth: aborts otherwise)
// and multiplied by k.matmul_bf16, so the results are that kernel's bits.
inline constexpr size_t kPackedFusedTokens = 4;
void MatmulPackedBf16(const kernels::DenseKernels& k, const float* x, size_t ldx, size_t T,
                      const PackedBf16View& w, size_t n_begin, size_t n_end, float* y, size_t ldy,
                      uint16_t* scratch, size_t scratch_values);

// Whether `k` multiplies packed rows in registers at 1-4 tokens and decodes them into L1 for more
// (UsesAvx512Bf16: AVX512-BF16 with bf16 activations): where reading packed rows is faster than
// plain ones at every token count measured, so where `auto` packs (pw serve's dense format, the
// engine's and decode worker's bf16 experts). The AVX2 tables decode in registers at one token
// only and unpack first from two.
bool PackingPays(const kernels::DenseKernels& k);

// Defined with the AVX512-BF16 table (dense_avx512_bf16.cc): the product above on that table.
void MatmulPackedBf16Avx512Bf16(const float* x, size_t ldx, size_t T, const PackedBf16View& w,
                                size_t n_begin, size_t n_end, float* y, size_t ldy);
// Defined in packed_bf16_avx2.cc: UnpackBf16Rows on AVX2, and the product above for one token
// on the AVX2 tables whose one token runs their GEMV (kAvx2Kernels, kAvx2Bf16ActsKernels: the
// activations rounded to bf16 first with `round_acts`), each chunk decoded in registers in the
// GEMV's order (its bits for rows without exceptions and K a multiple of 16).
void UnpackBf16RowsAvx2(const PackedBf16View& w, size_t r0, size_t r1, uint16_t* out);
void GemvPackedBf16Avx2(const float* x, bool round_acts, const PackedBf16View& w, size_t n_begin,
                        size_t n_end, float* y);

}  // namespace pw::cpu
