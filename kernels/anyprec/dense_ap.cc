#include "kernels/anyprec/dense_ap.h"

#include <cstring>
#include <string>

#include "kernels/anyprec/quantizer.h"

namespace pw::anyprec {

Result<std::unique_ptr<DenseApMatrix>> QuantizeDenseAp(const uint16_t* w, int rows, int cols,
                                                       int bits, int threads) {
  if (bits < kMinBits || bits > kMaxBits) {
    return InvalidArgument("dense any-precision width " + std::to_string(bits) + " is outside " +
                           std::to_string(kMinBits) + ".." + std::to_string(kMaxBits));
  }
  if (rows < 1 || cols < 1) {
    return InvalidArgument("dense any-precision matrix of " + std::to_string(rows) + " x " +
                           std::to_string(cols));
  }
  // The experts' fit up to this width: 3-bit k-means, then each cluster split at its optimal
  // cut. Seeding k-means at the width itself was worse on rows with a few large weights (its
  // quantile start leaves the tails to few centroids): relative error 0.144 against 0.101 at 4
  // bits, 0.078 against 0.004 at 8 (tests/anyprec/dense_ap_test.cc's rows).
  QuantizeOptions qo;
  qo.seed_bits = kMinBits;
  qo.max_bits = bits;
  qo.threads = threads;
  const std::vector<float> h(static_cast<size_t>(cols), 1.f);
  auto row_of = [&](int r, float* out) {
    const uint16_t* src = w + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) {
      const uint32_t u = static_cast<uint32_t>(src[c]) << 16;
      std::memcpy(&out[c], &u, sizeof(float));
    }
  };
  PW_ASSIGN_OR_RETURN(QuantizedBlock q, QuantizeBlock(row_of, rows, cols, h.data(), qo));

  auto m = std::make_unique<DenseApMatrix>();
  m->bits = bits;
  const size_t plane = PlaneBytes(rows, cols);
  m->planes.assign(q.block.planes.begin(), q.block.planes.begin() + static_cast<ptrdiff_t>(bits * plane));
  m->lut_values.resize(Q8LutValueBytes(rows, bits));
  m->lut_scales.resize(static_cast<size_t>(rows));
  PW_RETURN_IF_ERROR(QuantizeLut(q.block.luts[bits].data(), rows, bits, m->lut_values.data(),
                                 m->lut_scales.data()));
  const uint8_t* base[kNumPlanes] = {};
  for (int p = 0; p < bits; ++p) base[p] = m->planes.data() + p * plane;
  const uint16_t* luts[kMaxBits + 1] = {};
  m->pages = std::make_unique<PageLists>(base, luts, rows, cols, rows);
  m->lut = {m->lut_values.data(), m->lut_scales.data(), nullptr, 0};
  return m;
}

}  // namespace pw::anyprec
