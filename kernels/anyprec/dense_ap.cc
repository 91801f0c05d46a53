#include "kernels/anyprec/dense_ap.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/anyprec/quantizer.h"

namespace pw::anyprec {

Result<std::unique_ptr<DenseApMatrix>> QuantizeDenseAp(const uint16_t* w, int rows, int cols,
                                                       int bits, int threads, int fit_rows) {
  if (bits < kMinBits || bits > kMaxBits) {
    return InvalidArgument("dense any-precision width " + std::to_string(bits) + " is outside " +
                           std::to_string(kMinBits) + ".." + std::to_string(kMaxBits));
  }
  if (rows < 1 || cols < 1) {
    return InvalidArgument("dense any-precision matrix of " + std::to_string(rows) + " x " +
                           std::to_string(cols));
  }
  if (fit_rows < 1) return InvalidArgument("dense any-precision fit of " + std::to_string(fit_rows) + " rows at a time");
  // The experts' fit up to this width: 3-bit k-means, then each cluster split at its optimal
  // cut. Seeding k-means at the width itself was worse on rows with a few large weights (its
  // quantile start leaves the tails to few centroids): relative error 0.144 against 0.101 at 4
  // bits, 0.078 against 0.004 at 8 (tests/anyprec/dense_ap_test.cc's rows).
  QuantizeOptions qo;
  qo.seed_bits = kMinBits;
  qo.max_bits = bits;
  qo.threads = threads;
  const std::vector<float> h(static_cast<size_t>(cols), 1.f);
  auto m = std::make_unique<DenseApMatrix>();
  m->bits = bits;
  const size_t plane = PlaneBytes(rows, cols), row_bytes = PlaneRowBytes(cols);
  m->planes.resize(static_cast<size_t>(bits) * plane);
  m->lut_values.resize(Q8LutValueBytes(rows, bits));
  m->lut_scales.resize(static_cast<size_t>(rows));
  // The quantizer fits every row on its own and returns all 8 planes and every width's table:
  // fitted whole, a 50,304 x 2048 lm_head would hold 153 MB beside its copy for the fit's
  // length. In pieces of fit_rows rows the rows get the same codes and tables, and the fit
  // holds one piece's (about 1 KB a row plus a byte a weight).
  for (int r0 = 0; r0 < rows; r0 += fit_rows) {
    const int n = std::min(fit_rows, rows - r0);
    auto row_of = [&](int r, float* out) {
      const uint16_t* src = w + static_cast<size_t>(r0 + r) * cols;
      for (int c = 0; c < cols; ++c) {
        const uint32_t u = static_cast<uint32_t>(src[c]) << 16;
        std::memcpy(&out[c], &u, sizeof(float));
      }
    };
    auto q = QuantizeBlock(row_of, n, cols, h.data(), qo);
    if (!q.ok()) {
      // The quantizer names the piece's row: name the matrix's first non-finite weight.
      for (size_t i = static_cast<size_t>(r0) * cols; i < static_cast<size_t>(r0 + n) * cols; ++i) {
        if ((w[i] & 0x7F80u) == 0x7F80u) {
          return InvalidArgument("quantize: weight (" + std::to_string(i / cols) + ", " +
                                 std::to_string(i % cols) + ") is not finite");
        }
      }
      return q.status();
    }
    const size_t piece_plane = PlaneBytes(n, cols);
    for (int p = 0; p < bits; ++p) {
      std::memcpy(m->planes.data() + p * plane + static_cast<size_t>(r0) * row_bytes,
                  q->block.planes.data() + p * piece_plane, piece_plane);
    }
    PW_RETURN_IF_ERROR(QuantizeLut(q->block.luts[bits].data(), n, bits,
                                   m->lut_values.data() + Q8LutValueBytes(r0, bits),
                                   m->lut_scales.data() + r0));
  }
  const uint8_t* base[kNumPlanes] = {};
  for (int p = 0; p < bits; ++p) base[p] = m->planes.data() + p * plane;
  const uint16_t* luts[kMaxBits + 1] = {};
  m->pages = std::make_unique<PageLists>(base, luts, rows, cols, rows);
  m->lut = {m->lut_values.data(), m->lut_scales.data(), nullptr, 0};
  return m;
}

}  // namespace pw::anyprec
