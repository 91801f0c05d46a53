// Scalar reference backend: the definition of correct for every other backend.
// Decodes each weight bit by bit and accumulates in fp64.
#include <cstdint>

#include "common/dtype.h"
#include "kernels/anyprec/internal.h"

namespace pw::anyprec::internal {

void GemmRowsScalar(const BlockView& view, int bits, const float* x, int tokens, float* y,
                    int row_begin, int row_end, void* /*ws*/) {
  const int cols = view.cols;
  const int entries = LutEntries(bits);
  for (int r = row_begin; r < row_end; ++r) {
    const uint8_t* plane_rows[kNumPlanes];
    for (int p = 0; p < bits; ++p) plane_rows[p] = view.PlaneRow(p, r);
    const uint16_t* lut = view.luts[bits] + static_cast<size_t>(r) * entries;
    double acc[kMaxTokens] = {};
    for (int c = 0; c < cols; ++c) {
      const BitPosition pos = PlaneBitPosition(c);
      int code = 0;
      for (int p = 0; p < bits; ++p) code = (code << 1) | ((plane_rows[p][pos.byte] >> pos.bit) & 1);
      const double w = pw::F16ToF32(lut[code]);
      for (int t = 0; t < tokens; ++t) acc[t] += w * x[static_cast<size_t>(t) * cols + c];
    }
    for (int t = 0; t < tokens; ++t) {
      y[static_cast<size_t>(t) * view.rows + r] = static_cast<float>(acc[t]);
    }
  }
}

}  // namespace pw::anyprec::internal
