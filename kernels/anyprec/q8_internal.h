// Backend entry points of the integer fast path (not a public interface: use q8.h).
#pragma once

#include <cstddef>

#include "kernels/anyprec/q8.h"

namespace pw::anyprec::internal {

// Software prefetch distance along each plane stream, for every SIMD backend (planes are
// contiguous within a page, so this is the stream a later pair or row reads; a prefetch past a
// page's end is harmless). Measured on the Xeon of docs/benchmarks.md at 1024, 4096 and 14336
// columns: 2 KiB beat 0.5, 1, 3.5, 4 and 7 KiB; on AMD Zen 4 none was mixed (docs/benchmarks.md,
// "Software prefetch on AMD Zen 4"), so it stays on every CPU.
inline constexpr size_t kPrefetchBytes = 2048;

// A block and its int8 LUT at one width: where the SIMD backends' rows come from.
struct BlockAndLut {
  const BlockView& view;
  const Q8Lut& lut;
};

// Rows [row_begin, row_end) of the fast-path product; arguments validated by ApGemmQ8Rows.
using Q8RowsFn = void (*)(const BlockView& view, int bits, const Q8Lut& lut, const Q8Acts& acts,
                          float* y, size_t ldy, int row_begin, int row_end);
void Q8RowsScalar(const BlockView& view, int bits, const Q8Lut& lut, const Q8Acts& acts, float* y,
                  size_t ldy, int row_begin, int row_end);
void Q8RowsAvx2(const BlockView& view, int bits, const Q8Lut& lut, const Q8Acts& acts, float* y,
                size_t ldy, int row_begin, int row_end);
void Q8RowsAvx512(const BlockView& view, int bits, const Q8Lut& lut, const Q8Acts& acts, float* y,
                  size_t ldy, int row_begin, int row_end);
// AMX-INT8 tiles from 8 or 12 tokens (rows of up to 16384 columns), else Q8RowsAvx512
// (q8_amx.cc).
void Q8RowsAmx(const BlockView& view, int bits, const Q8Lut& lut, const Q8Acts& acts, float* y,
               size_t ldy, int row_begin, int row_end);

// Rows [row_begin, row_end) of a dense int8 matrix product (DenseQ8Rows, validated).
using DenseRowsFn = void (*)(const Q8Matrix& m, const Q8Acts& acts, float* y, size_t ldy,
                             int row_begin, int row_end);
void DenseQ8RowsScalar(const Q8Matrix& m, const Q8Acts& acts, float* y, size_t ldy, int row_begin,
                       int row_end);
void DenseQ8RowsAvx2(const Q8Matrix& m, const Q8Acts& acts, float* y, size_t ldy, int row_begin,
                     int row_end);
void DenseQ8RowsAvx512(const Q8Matrix& m, const Q8Acts& acts, float* y, size_t ldy, int row_begin,
                       int row_end);

// Quantizes one token's row (QuantizeActs's rule) into q [Q8ActStride(cols)], scales
// [Q8ActGroups(cols)], *offset. Written once as q8_quantize.inc and compiled per backend.
using QuantizeRowFn = void (*)(const float* x, int cols, int8_t* q, float* scales, float* offset);
void QuantizeRowScalar(const float* x, int cols, int8_t* q, float* scales, float* offset);
void QuantizeRowAvx2(const float* x, int cols, int8_t* q, float* scales, float* offset);
void QuantizeRowAvx512(const float* x, int cols, int8_t* q, float* scales, float* offset);

}  // namespace pw::anyprec::internal
