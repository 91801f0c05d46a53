// Any-precision quantizer: damage tables exact and consistent with the split identity,
// hierarchy of codes and LUTs, determinism across thread counts, input validation.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/anyprec/quantizer.h"

namespace pw::anyprec {
namespace {

struct Inputs {
  int rows, cols;
  std::vector<float> w, h;
};

Inputs MakeInputs(int rows, int cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::uniform_real_distribution<float> ud(0.1f, 3.f);
  Inputs in{rows, cols, std::vector<float>(static_cast<size_t>(rows) * cols), std::vector<float>(cols)};
  for (auto& v : in.w) v = nd(rng);
  for (int i = 0; i < rows * cols; i += 97) in.w[i] *= 8.f;  // a few outliers
  for (auto& v : in.h) v = ud(rng);
  return in;
}

QuantizedBlock Quantize(const Inputs& in, QuantizeOptions opt = {}) {
  auto q = QuantizeBlock(in.w.data(), in.rows, in.cols, in.h.data(), opt);
  EXPECT_TRUE(q.ok()) << q.status().ToString();
  return std::move(q).value();
}

double Damage(const Inputs& in, const QuantizedBlock& q, int bits) {
  double d = 0;
  for (int r = 0; r < in.rows; ++r) {
    for (int c = 0; c < in.cols; ++c) {
      const int code = UnpackCode(q.block.planes.data(), in.rows, in.cols, r, c) >> (8 - bits);
      const double wq = F16ToF32(q.block.luts[bits][(static_cast<size_t>(r) << bits) + code]);
      const double e = in.w[r * in.cols + c] - wq;
      d += in.h[c] * e * e;
    }
  }
  return d;
}

TEST(Quantizer, DamageTableIsExact) {
  const Inputs in = MakeInputs(9, 301, 1);
  const QuantizedBlock q = Quantize(in);
  double d0 = 0;
  for (int r = 0; r < in.rows; ++r)
    for (int c = 0; c < in.cols; ++c) d0 += in.h[c] * in.w[r * in.cols + c] * in.w[r * in.cols + c];
  EXPECT_NEAR(q.damage[0], d0, 1e-9 * d0);
  for (int b = kMinBits; b <= kMaxBits; ++b) {
    EXPECT_NEAR(q.damage[b], Damage(in, q, b), 1e-9 * q.damage[0]) << "bits " << b;
  }
}

TEST(Quantizer, SplitIdentityHolds) {
  for (int seed_bits : {3, 4}) {
    const Inputs in = MakeInputs(7, 513, 2 + seed_bits);
    QuantizeOptions opt;
    opt.seed_bits = seed_bits;
    const QuantizedBlock q = Quantize(in, opt);
    for (int b = seed_bits + 1; b <= kMaxBits; ++b) {
      const double drop = q.damage_fp64[b - 1] - q.damage_fp64[b];
      EXPECT_GT(q.split_gain[b], 0) << b;
      EXPECT_NEAR(drop, q.split_gain[b], 1e-9 * q.damage_fp64[kMinBits]) << "bits " << b;
    }
  }
}

TEST(Quantizer, DamageFallsAsBitsRise) {
  const Inputs in = MakeInputs(16, 256, 3);
  const QuantizedBlock q = Quantize(in);
  EXPECT_GT(q.damage[0], q.damage[3]);
  for (int b = kMinBits + 1; b <= kMaxBits; ++b) EXPECT_LT(q.damage_fp64[b], q.damage_fp64[b - 1]);
  // 8 bits over ~256 distinct values per row: nearly lossless (fp16 rounding dominates).
  EXPECT_LT(q.damage[8], 1e-4 * q.damage[0]);
  EXPECT_LT(q.damage[3], 0.1 * q.damage[0]);
}

TEST(Quantizer, CodesAreNestedIntervalsAndLutsAreClusterMeans) {
  const Inputs in = MakeInputs(5, 200, 4);
  const QuantizedBlock q = Quantize(in);
  for (int r = 0; r < in.rows; ++r) {
    for (int b = kMinBits; b <= kMaxBits; ++b) {
      std::vector<double> mass(1 << b, 0), moment(1 << b, 0), lo(1 << b, 1e30), hi(1 << b, -1e30);
      for (int c = 0; c < in.cols; ++c) {
        const int code = UnpackCode(q.block.planes.data(), in.rows, in.cols, r, c) >> (8 - b);
        const double w = in.w[r * in.cols + c];
        mass[code] += in.h[c];
        moment[code] += in.h[c] * w;
        lo[code] = std::min(lo[code], w);
        hi[code] = std::max(hi[code], w);
      }
      double prev_hi = -1e30;
      for (int k = 0; k < (1 << b); ++k) {
        if (mass[k] == 0) continue;
        EXPECT_GE(lo[k], prev_hi) << "codes not ordered by value, row " << r << " bits " << b;
        prev_hi = hi[k];
        EXPECT_EQ(q.block.luts[b][(r << b) + k], F32ToF16(static_cast<float>(moment[k] / mass[k])))
            << "row " << r << " bits " << b << " code " << k;
      }
    }
  }
}

TEST(Quantizer, DeterministicAcrossThreadCounts) {
  const Inputs in = MakeInputs(33, 130, 5);
  QuantizeOptions one, three;
  three.threads = 3;
  const QuantizedBlock a = Quantize(in, one), b = Quantize(in, three);
  EXPECT_EQ(a.block.planes, b.block.planes);
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    EXPECT_EQ(a.block.luts[bits], b.block.luts[bits]);
    EXPECT_EQ(a.damage[bits], b.damage[bits]);
  }
}

TEST(Quantizer, MaxBitsBelowEightStopsSplitting) {
  const Inputs in = MakeInputs(4, 100, 6);
  QuantizeOptions opt;
  opt.max_bits = 5;
  const QuantizedBlock q = Quantize(in, opt);
  EXPECT_EQ(q.damage[6], q.damage[5]);
  EXPECT_EQ(q.damage[8], q.damage[5]);
  EXPECT_LT(q.damage[5], q.damage[4]);
}

TEST(Quantizer, RejectsBadInputs) {
  Inputs in = MakeInputs(2, 10, 7);
  in.h[3] = 0;
  EXPECT_FALSE(QuantizeBlock(in.w.data(), 2, 10, in.h.data(), {}).ok());
  in.h[3] = 1;
  in.w[5] = std::nanf("");
  EXPECT_FALSE(QuantizeBlock(in.w.data(), 2, 10, in.h.data(), {}).ok());
  // Rows are fitted on several threads; the error names the first non-finite weight in
  // row-major order whichever thread met which first.
  in.w[17] = INFINITY;
  QuantizeOptions two;
  two.threads = 2;
  for (int t = 0; t < 20; ++t) {
    auto r = QuantizeBlock(in.w.data(), 2, 10, in.h.data(), two);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("weight (0, 5) is not finite"), std::string::npos) << r.status().ToString();
  }
  in.w[17] = 0;
  in.w[5] = 0;
  QuantizeOptions bad;
  bad.seed_bits = 2;
  EXPECT_FALSE(QuantizeBlock(in.w.data(), 2, 10, in.h.data(), bad).ok());
  bad.seed_bits = 6;
  bad.max_bits = 5;
  EXPECT_FALSE(QuantizeBlock(in.w.data(), 2, 10, in.h.data(), bad).ok());
  // Degenerate rows (all weights equal, a single column) still quantize.
  std::vector<float> same(2 * 10, 0.25f);
  auto q = QuantizeBlock(same.data(), 2, 10, in.h.data(), {});
  ASSERT_TRUE(q.ok());
  EXPECT_NEAR(q->damage[3], 0.0, 1e-12);
  EXPECT_TRUE(QuantizeBlock(in.w.data(), 1, 1, in.h.data(), {}).ok());
}

}  // namespace
}  // namespace pw::anyprec
