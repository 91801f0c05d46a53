// Dense matrices as any-precision codes at one width (kernels/anyprec/dense_ap.h): the fit gets
// closer to the weights as the width grows (and at 8 bits at least as close as the int8 copy),
// every fast-path backend multiplies it as the scalar reference does, the bytes do not depend on
// the thread count, and bad input is refused by name.
#include "kernels/anyprec/dense_ap.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "tests/anyprec/random_block.h"

namespace pw::anyprec {
namespace {

using kernels::Backend;

std::vector<uint16_t> RandomBf16(int rows, int cols, std::mt19937& rng) {
  // Rows of different scales with a few large weights, as trained matrices have.
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<uint16_t> w(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    const float scale = 0.01f * (1 + r % 7);
    for (int c = 0; c < cols; ++c) {
      float v = n(rng) * scale;
      if ((r * 31 + c) % 97 == 0) v *= 8;
      w[static_cast<size_t>(r) * cols + c] = F32ToBf16(v);
    }
  }
  return w;
}

// Weight (r, c) as the fast path sees it: the int8 table entry of its code times the row scale.
float Decoded(const DenseApMatrix& m, int r, int c) {
  const BitPosition pos = PlaneBitPosition(c);
  int code = 0;
  for (int p = 0; p < m.bits; ++p) {
    code = code << 1 | ((m.view().PlaneRow(p, r)[pos.byte] >> pos.bit) & 1);
  }
  return m.lut_scales[r] * m.lut_values[(static_cast<size_t>(r) << m.bits) + code];
}

double RelError(const std::vector<uint16_t>& w, int rows, int cols,
                const std::function<float(int, int)>& decoded) {
  double err = 0, ref = 0;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const double v = Bf16ToF32(w[static_cast<size_t>(r) * cols + c]);
      err += (decoded(r, c) - v) * (decoded(r, c) - v);
      ref += v * v;
    }
  }
  return std::sqrt(err / ref);
}

TEST(DenseAp, TheFitApproachesTheWeightsAsTheWidthGrows) {
  std::mt19937 rng(7);
  const int rows = 48, cols = 600;
  const auto w = RandomBf16(rows, cols, rng);
  double prev = 1e9;
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    auto m = QuantizeDenseAp(w.data(), rows, cols, bits, 1);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ((*m)->bits, bits);
    EXPECT_EQ((*m)->Bytes(), DenseApBytes(rows, cols, bits));
    const double e = RelError(w, rows, cols, [&](int r, int c) { return Decoded(**m, r, c); });
    std::printf("ap%d: relative error %.4f\n", bits, e);
    // The error falls by at least 1.3x a bit up to 6 bits (about 2x in the fit itself); at 7-8
    // bits the int8 table's rounding (127 steps a row) takes over and it falls less.
    if (bits <= 6) EXPECT_LT(e * 1.3, prev) << bits;
    EXPECT_LT(e, prev) << bits;
    prev = e;
  }
  // At 8 bits as close as the int8 copy (one scale per row, 127 steps), within 5 %.
  std::vector<int8_t> q(Q8MatrixValueBytes(rows, cols));
  std::vector<float> s(rows);
  ASSERT_TRUE(QuantizeBf16Rows(w.data(), rows, cols, q.data(), s.data(), 127).ok());
  const double int8 = RelError(w, rows, cols, [&](int r, int c) {
    return s[r] * q[static_cast<size_t>(r) * Q8ActStride(cols) + Q8ActIndex(c)];
  });
  EXPECT_LE(prev, 1.05 * int8);
}

TEST(DenseAp, EveryBackendMultipliesItAsTheReference) {
  std::mt19937 rng(11);
  const int rows = 40, cols = 700;
  const auto w = RandomBf16(rows, cols, rng);
  std::normal_distribution<float> n(0.f, 1.f);
  for (int tokens : {1, 5, 16}) {
    std::vector<float> x(static_cast<size_t>(tokens) * cols);
    for (float& v : x) v = n(rng);
    AlignedBuffer buf(Q8ActsBytes(tokens, cols));
    Q8Acts acts;
    ASSERT_TRUE(QuantizeActs(x.data(), cols, tokens, cols, buf.ws(), &acts).ok());
    for (int bits : {3, 4, 6, 8}) {
      auto m = QuantizeDenseAp(w.data(), rows, cols, bits, 2);
      ASSERT_TRUE(m.ok());
      std::vector<float> want(static_cast<size_t>(tokens) * rows);
      ASSERT_TRUE(ApGemmQ8Rows(Backend::kScalar, (*m)->view(), bits, (*m)->lut, acts, want.data(), rows, 0, rows).ok());
      // The product tracks the bf16 one (the fit's, the int8 table's and the activations'
      // rounding: 0.29-0.30 relative at 3 bits, 0.13-0.16 at 4 on these rows with large weights;
      // a wrong code or table gives errors of order 1).
      double err = 0, ref = 0;
      for (int t = 0; t < tokens; ++t) {
        for (int r = 0; r < rows; ++r) {
          double exact = 0;
          for (int c = 0; c < cols; ++c) {
            exact += static_cast<double>(Bf16ToF32(w[static_cast<size_t>(r) * cols + c])) * x[t * cols + c];
          }
          err += (want[t * rows + r] - exact) * (want[t * rows + r] - exact);
          ref += exact * exact;
        }
      }
      EXPECT_LT(std::sqrt(err / ref), bits == 3 ? 0.35 : bits == 4 ? 0.2 : 0.05) << bits;
      for (Backend be : {Backend::kAvx2, Backend::kAvx512, Backend::kAmx}) {
        if (!Q8BackendAvailable(be)) continue;
        std::vector<float> y(want.size());
        ASSERT_TRUE(ApGemmQ8Rows(be, (*m)->view(), bits, (*m)->lut, acts, y.data(), rows, 0, rows).ok());
        for (size_t i = 0; i < y.size(); ++i) {
          ASSERT_NEAR(y[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << BackendName(be) << " b" << bits << " i" << i;
        }
      }
    }
  }
}

TEST(DenseAp, TheBytesDoNotDependOnTheThreadCountOrThePiecesOfTheFit) {
  std::mt19937 rng(3);
  const int rows = 70, cols = 300;
  const auto w = RandomBf16(rows, cols, rng);
  auto one = QuantizeDenseAp(w.data(), rows, cols, 5, 1, rows);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  // Two threads, and pieces of 1 row, 16 (four and a tail of 6), 69 (a tail of 1) and more
  // than the matrix: every plane row and table where the whole fit puts it.
  for (auto [threads, fit_rows] : {std::pair{2, rows}, {1, 1}, {2, 16}, {1, 69}, {2, 1000}}) {
    auto other = QuantizeDenseAp(w.data(), rows, cols, 5, threads, fit_rows);
    ASSERT_TRUE(other.ok()) << other.status().ToString();
    EXPECT_EQ((*one)->planes, (*other)->planes) << threads << " threads, pieces of " << fit_rows;
    EXPECT_EQ((*one)->lut_values, (*other)->lut_values) << fit_rows;
    EXPECT_EQ((*one)->lut_scales, (*other)->lut_scales) << fit_rows;
  }
  EXPECT_FALSE(QuantizeDenseAp(w.data(), rows, cols, 5, 1, 0).ok());
}

TEST(DenseAp, RefusesBadWidthsShapesAndNonFiniteWeights) {
  std::mt19937 rng(5);
  auto w = RandomBf16(4, 64, rng);
  for (int bits : {0, 2, 9, 16}) {
    auto m = QuantizeDenseAp(w.data(), 4, 64, bits, 1);
    ASSERT_FALSE(m.ok()) << bits;
    EXPECT_NE(m.status().message().find("width " + std::to_string(bits)), std::string::npos) << m.status().ToString();
  }
  EXPECT_FALSE(QuantizeDenseAp(w.data(), 0, 64, 4, 1).ok());
  EXPECT_FALSE(QuantizeDenseAp(w.data(), 4, 0, 4, 1).ok());
  w[2 * 64 + 9] = F32ToBf16(std::numeric_limits<float>::quiet_NaN());
  auto m = QuantizeDenseAp(w.data(), 4, 64, 4, 2);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("(2, 9)"), std::string::npos) << m.status().ToString();
  // Fitted a row at a time, the weight is named by its row in the matrix, not in its piece.
  m = QuantizeDenseAp(w.data(), 4, 64, 4, 1, 1);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("(2, 9)"), std::string::npos) << m.status().ToString();
}

}  // namespace
}  // namespace pw::anyprec
