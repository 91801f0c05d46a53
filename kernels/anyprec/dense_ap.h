// A dense matrix (attention projections, lm_head, dense and shared MLPs) held as any-precision
// codes at one width: per row 2^bits centroids fitted as an expert's are (quantizer.h: 3-bit
// k-means, then optimal splits up to the width; uniform sensitivity: no calibration statistics
// exist at load), the
// codes as `bits` bit-planes (anyprec.h's layout) and the int8 LUT of the fast path (q8.h). A
// step reads bits/8 bytes per weight plus rows * (2^bits + 4) bytes of LUT, where an int8 copy
// (q8.h's Q8Matrix) reads one byte per weight: llama.cpp's Q4_K_M keeps its output matrix at
// Q6_K and most attention at Q4_K for the same reason.
//
// Multiplied with ApGemmQ8Rows like an expert block at that width.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "kernels/anyprec/pack.h"
#include "kernels/anyprec/q8.h"

namespace pw::anyprec {

struct DenseApMatrix {
  int bits = 0;
  std::vector<uint8_t> planes;       // planes 0..bits-1, each PlaneBytes(rows, cols), in order
  std::vector<int8_t> lut_values;    // [rows][2^bits] (Q8Lut)
  std::vector<float> lut_scales;     // [rows]
  std::unique_ptr<PageLists> pages;  // one page per plane over `planes`
  Q8Lut lut;

  const BlockView& view() const { return pages->view(); }
  // Bytes a product reads: the planes and the int8 LUT with its scales.
  size_t Bytes() const { return planes.size() + lut_values.size() + 4 * lut_scales.size(); }
};

// Bytes DenseApMatrix::Bytes() gives a rows x cols matrix at `bits`.
inline size_t DenseApBytes(int rows, int cols, int bits) {
  return static_cast<size_t>(bits) * PlaneBytes(rows, cols) + Q8LutValueBytes(rows, bits) +
         4 * static_cast<size_t>(rows);
}

// Rows the fit takes at a time by default: its transient memory is about (1 KB + cols bytes)
// a row of a piece (8.4 MB at 2048 columns), whatever the matrix's row count.
inline constexpr int kDenseFitRows = 2048;

// From bf16 w [rows][cols] (row-major, raw bits) at `bits` in 3..8, fitted on `threads`
// threads `fit_rows` rows at a time (the same bytes for any thread count and any fit_rows).
// Non-finite weights are an error naming the first.
Result<std::unique_ptr<DenseApMatrix>> QuantizeDenseAp(const uint16_t* w, int rows, int cols,
                                                       int bits, int threads,
                                                       int fit_rows = kDenseFitRows);

}  // namespace pw::anyprec
