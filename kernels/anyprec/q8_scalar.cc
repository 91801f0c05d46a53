// Scalar reference of the integer fast path: the definition of correct for the SIMD backends.
// Decodes each code bit by bit, sums each 256-column group exactly in int64, accumulates the
// scaled group sums in fp64.
#include <cmath>
#include <cstdint>

#include "kernels/anyprec/q8_internal.h"

namespace pw::anyprec::internal {
namespace scalar {
#include "kernels/anyprec/q8_quantize.inc"
}  // namespace scalar

void QuantizeRowScalar(const float* x, int cols, int8_t* q, float* scales, float* offset) {
  scalar::QuantizeRowImpl(x, cols, q, scales, offset);
}

void Q8RowsScalar(const BlockView& view, int bits, const Q8Lut& lut, const Q8Acts& acts, float* y,
                  size_t ldy, int row_begin, int row_end) {
  const int cols = view.cols;
  const int stride = Q8ActStride(cols), groups = Q8ActGroups(cols);
  for (int r = row_begin; r < row_end; ++r) {
    const uint8_t* plane_rows[kNumPlanes];
    for (int p = 0; p < bits; ++p) plane_rows[p] = view.PlaneRow(p, r);
    const int8_t* w = Q8LutRow(lut, r, bits);
    for (int t = 0; t < acts.tokens; ++t) {
      const int8_t* xq = acts.q + static_cast<size_t>(t) * stride;
      const float* xs = acts.scales + static_cast<size_t>(t) * groups;
      double acc = 0.0;
      for (int g = 0; g * kGroupCols < cols; ++g) {
        int64_t sum = 0;
        const int end = cols < (g + 1) * kGroupCols ? cols : (g + 1) * kGroupCols;
        for (int c = g * kGroupCols; c < end; ++c) {
          const BitPosition pos = PlaneBitPosition(c);
          int code = 0;
          for (int p = 0; p < bits; ++p) code = (code << 1) | ((plane_rows[p][pos.byte] >> pos.bit) & 1);
          sum += static_cast<int64_t>(w[code]) * xq[Q8ActIndex(c)];
        }
        acc += static_cast<double>(xs[g]) * static_cast<double>(sum);
      }
      y[static_cast<size_t>(t) * ldy + r] = static_cast<float>(acc * lut.scales[r]);
    }
  }
}

void DenseQ8RowsScalar(const Q8Matrix& m, const Q8Acts& acts, float* y, size_t ldy, int row_begin,
                       int row_end) {
  const int stride = Q8ActStride(m.cols), groups = Q8ActGroups(m.cols);
  for (int r = row_begin; r < row_end; ++r) {
    const int8_t* w = m.values + static_cast<size_t>(r) * stride;
    for (int t = 0; t < acts.tokens; ++t) {
      const int8_t* xq = acts.q + static_cast<size_t>(t) * stride;
      const float* xs = acts.scales + static_cast<size_t>(t) * groups;
      double acc = 0.0;
      for (int g = 0; g * kGroupCols < m.cols; ++g) {
        int64_t sum = 0;
        const int end = m.cols < (g + 1) * kGroupCols ? m.cols : (g + 1) * kGroupCols;
        for (int c = g * kGroupCols; c < end; ++c) {
          sum += static_cast<int64_t>(w[Q8ActIndex(c)]) * xq[Q8ActIndex(c)];
        }
        acc += static_cast<double>(xs[g]) * static_cast<double>(sum);
      }
      y[static_cast<size_t>(t) * ldy + r] = static_cast<float>(acc * m.scales[r]);
    }
  }
}

}  // namespace pw::anyprec::internal
