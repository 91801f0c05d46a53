// Backend entry points of the any-precision kernels (not a public interface: use anyprec.h).
#pragma once

#include <cstddef>

#include "kernels/anyprec/anyprec.h"

namespace pw::anyprec::internal {

// Rows [row_begin, row_end) of y = W_bits x; arguments already validated by ApGemmRows and
// `ws` at least ApGemmWorkspaceBytes(view.cols, tokens) bytes, kWorkspaceAlign-aligned.
using GemmRowsFn = void (*)(const BlockView& view, int bits, const float* x, int tokens, float* y,
                            int row_begin, int row_end, void* ws);

void GemmRowsScalar(const BlockView& view, int bits, const float* x, int tokens, float* y,
                    int row_begin, int row_end, void* ws);
void GemmRowsAvx2(const BlockView& view, int bits, const float* x, int tokens, float* y,
                  int row_begin, int row_end, void* ws);
void GemmRowsAvx512(const BlockView& view, int bits, const float* x, int tokens, float* y,
                    int row_begin, int row_end, void* ws);

// SIMD backends read x in "slot order": inside every 32-column slice of a 256-column group,
// slot q holds the column of byte SliceSlotToByte(q) (the order in which the unpack/convert
// steps produce weights), or with `strided` (the AVX2 width-3 permute path) of byte
// StridedSlotToByte(q). xp: [tokens][PaddedCols(cols)], zero beyond cols.
constexpr int SliceSlotToByte(int q) { return q < 8 ? q : q < 16 ? q + 8 : q < 24 ? q - 8 : q; }
constexpr int StridedSlotToByte(int q) { return 4 * (q % 8) + q / 8; }
constexpr int PaddedCols(int cols) { return (cols + kGroupCols - 1) / kGroupCols * kGroupCols; }
void PermuteX(const float* x, int tokens, int cols, bool strided, float* xp);

// Column chunk (multiple of 256) of which the SIMD backends decode two rows at a time in
// multi-token calls, so that the chunk of x for all tokens stays in L2: about 160 KiB / (4 * tokens), in [256, 16384]
// (rows up to 16384 columns are then decoded whole for a few tokens, streaming the planes
// sequentially; larger token counts visit the rows chunk by chunk).
int SimdChunkCols(int tokens);
// Scratch the SIMD backends carve out of the workspace, in bytes.
size_t SimdWorkspaceBytes(int cols, int tokens);

}  // namespace pw::anyprec::internal
