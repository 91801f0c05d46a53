// Every dense CPU backend (scalar, AVX2, AVX-512, AMX: each one the CPU has) against the
// scalar reference and the exact product, on fresh random inputs and awkward shapes (1..5,
// 16, 17, 20, 33, 37 tokens; rows and columns not multiples of 8/16/32). Outputs are poisoned with
// NaN before each run and guard values around them must survive.
//
// Tolerance: |y - ref| <= 1e-5 * sum_k |x_k * w_k| + 1e-6 for products (fp32 sums in a
// different order), 2e-6 relative for softmax/RMSNorm, 1e-5 relative for SiLU*mul (the
// vectorised exp is within a few ulp).
#include "kernels/cpu/dense.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

namespace pw::cpu {
namespace {

using kernels::Backend;
using kernels::BackendName;
using kernels::BackendSupported;
using kernels::DenseKernels;

constexpr float kGuard = 12345.f;

// The exact (double) product of x[0..K) and w[0..K), and the sum of its terms' magnitudes (the
// scale of an fp32 sum's rounding); with round_x, of x rounded to bf16 first.
std::pair<double, double> ExactDot(const float* x, const float* w, size_t K, bool round_x = false) {
  double exact = 0, mag = 0;
  for (size_t k = 0; k < K; ++k) {
    const double xk = round_x ? Bf16Bits(ToBf16Bits(x[k])) : x[k];
    exact += xk * w[k];
    mag += std::fabs(xk * w[k]);
  }
  return {exact, mag};
}

std::vector<Backend> BackendsUnderTest() {
  std::vector<Backend> out;
  for (Backend isa : {Backend::kScalar, Backend::kAvx2, Backend::kAvx512, Backend::kAmx}) {
    if (BackendSupported(isa)) out.push_back(isa);
  }
  return out;
}

class DenseTest : public ::testing::TestWithParam<Backend> {
 protected:
  const DenseKernels& k() { return KernelsFor(GetParam()); }
  const DenseKernels& ref() { return KernelsFor(Backend::kScalar); }
  std::mt19937 rng_{1234};
  std::vector<float> Random(size_t n, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
};

TEST_P(DenseTest, MatmulBf16AndF32MatchReference) {
  for (size_t T : {1, 3, 4, 5, 37}) {
    for (size_t K : {1, 7, 8, 33, 100, 257}) {
      for (size_t N : {1, 5, 19, 64}) {
        SCOPED_TRACE(testing::Message() << "T=" << T << " K=" << K << " N=" << N << " seed=1234");
        const size_t ldx = K + 3, ldy = N + 2;
        auto x = Random(T * ldx);
        auto wf = Random(N * K);
        std::vector<uint16_t> wb(N * K);
        for (size_t i = 0; i < wb.size(); ++i) {
          wb[i] = ToBf16Bits(wf[i]);
          wf[i] = Bf16Bits(wb[i]);  // same values in both precisions
        }
        // Sub-range of rows, as a thread would get.
        const size_t n_begin = N > 4 ? 1 : 0, n_end = N > 4 ? N - 1 : N;
        for (int variant = 0; variant < 2; ++variant) {
          std::vector<float> y(T * ldy, NAN), want(T * ldy, NAN);
          for (size_t t = 0; t < T; ++t) {
            for (size_t n = 0; n < ldy; ++n) {
              if (n < n_begin || n >= n_end) y[t * ldy + n] = want[t * ldy + n] = kGuard;
            }
          }
          if (variant == 0) {
            k().matmul_bf16(x.data(), ldx, T, wb.data(), K, n_begin, n_end, y.data(), ldy);
          } else {
            k().matmul_f32(x.data(), ldx, T, wf.data(), K, n_begin, n_end, y.data(), ldy);
          }
          for (size_t t = 0; t < T; ++t) {
            for (size_t n = 0; n < ldy; ++n) {
              const float got = y[t * ldy + n];
              if (n < n_begin || n >= n_end) {
                ASSERT_EQ(got, kGuard) << "wrote outside its rows at t=" << t << " n=" << n;
                continue;
              }
              const auto [exact, mag] = ExactDot(x.data() + t * ldx, wf.data() + n * K, K);
              ASSERT_FALSE(std::isnan(got)) << "t=" << t << " n=" << n << " variant=" << variant;
              ASSERT_NEAR(got, exact, 1e-5 * mag + 1e-6) << "t=" << t << " n=" << n;
            }
          }
        }
      }
    }
  }
}

// Longer rows and the token counts where the backends change strategy (1..4 = the AVX-512
// few-token GEMV, 5 = the AMX backend's first tile width, 16/17 = one or two tile groups,
// 33/37 = a second pass over the weights), rows not a multiple of 16 (the AMX tail goes
// through AVX-512) and columns past one layout chunk with a tail under 32. Checked against the
// exact (double) product as above and against the scalar backend's output.
TEST_P(DenseTest, MatmulBf16LongRowsAndTileTokenCounts) {
  const std::pair<size_t, size_t> shapes[] = {{1057, 100}, {2100, 37}};  // (K, N)
  for (size_t T : {1, 2, 3, 4, 5, 16, 17, 20, 33, 37}) {
    for (const auto& [K, N] : shapes) {
      {
        SCOPED_TRACE(testing::Message() << "T=" << T << " K=" << K << " N=" << N << " seed=1234");
        const size_t ldx = K + 5, ldy = N + 3;
        auto x = Random(T * ldx);
        std::vector<uint16_t> wb(N * K);
        for (auto& v : wb) v = ToBf16Bits(Random(1)[0]);
        const size_t n_begin = 3, n_end = N - 1;  // an odd row range, as a thread could get
        std::vector<float> y(T * ldy, NAN), want(T * ldy, NAN);
        for (size_t t = 0; t < T; ++t) {
          for (size_t n = 0; n < ldy; ++n) {
            if (n < n_begin || n >= n_end) y[t * ldy + n] = want[t * ldy + n] = kGuard;
          }
        }
        k().matmul_bf16(x.data(), ldx, T, wb.data(), K, n_begin, n_end, y.data(), ldy);
        ref().matmul_bf16(x.data(), ldx, T, wb.data(), K, n_begin, n_end, want.data(), ldy);
        for (size_t t = 0; t < T; ++t) {
          for (size_t n = 0; n < ldy; ++n) {
            const float got = y[t * ldy + n];
            if (n < n_begin || n >= n_end) {
              ASSERT_EQ(got, kGuard) << "wrote outside its rows at t=" << t << " n=" << n;
              continue;
            }
            double exact = 0, mag = 0;
            for (size_t kk = 0; kk < K; ++kk) {
              const double p = double(x[t * ldx + kk]) * Bf16Bits(wb[n * K + kk]);
              exact += p;
              mag += std::fabs(p);
            }
            ASSERT_FALSE(std::isnan(got)) << "t=" << t << " n=" << n;
            ASSERT_NEAR(got, exact, 1e-5 * mag + 1e-6) << "t=" << t << " n=" << n;
            ASSERT_NEAR(got, want[t * ldy + n], 2e-5 * mag + 2e-6) << "t=" << t << " n=" << n;
          }
        }
      }
    }
  }
}

// A weight matrix that picks one column per row returns the activations themselves, exactly,
// at magnitudes from 1e-30 to 1e30: no backend may round an fp32 activation (the AMX backend's
// three-way bf16 split of each activation must be exact).
TEST_P(DenseTest, MatmulBf16KeepsEveryActivationBit) {
  const size_t K = 96, N = 64;
  std::vector<uint16_t> w(N * K, 0);
  for (size_t n = 0; n < N; ++n) w[n * K + (n * 7) % K] = ToBf16Bits(1.f);
  for (size_t T : {1, 2, 4, 5, 16, 20, 32}) {
    SCOPED_TRACE(testing::Message() << "T=" << T);
    std::vector<float> x(T * K);
    std::uniform_real_distribution<float> mant(1.f, 2.f);
    std::uniform_int_distribution<int> expo(-99, 99);
    for (auto& v : x) v = std::ldexp(mant(rng_), expo(rng_)) * (rng_() % 2 ? 1.f : -1.f);
    std::vector<float> y(T * N, NAN);
    k().matmul_bf16(x.data(), K, T, w.data(), K, 0, N, y.data(), N);
    for (size_t t = 0; t < T; ++t) {
      for (size_t n = 0; n < N; ++n) {
        ASSERT_EQ(y[t * N + n], x[t * K + (n * 7) % K]) << "t=" << t << " n=" << n;
      }
    }
  }
}

TEST_P(DenseTest, RmsNormSoftmaxSiluDotAxpyMatchReference) {
  for (size_t n : {1, 3, 8, 17, 37, 64, 1000}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    auto x = Random(n, -4.f, 4.f), w = Random(n), up = Random(n);
    std::vector<float> got(n + 1, NAN), want(n + 1, NAN);
    got[n] = want[n] = kGuard;

    k().rms_norm(x.data(), w.data(), n, 1e-6f, got.data());
    ref().rms_norm(x.data(), w.data(), n, 1e-6f, want.data());
    for (size_t i = 0; i <= n; ++i) ASSERT_NEAR(got[i], want[i], 2e-6 * std::fabs(want[i]) + 1e-7);

    std::vector<float> s1(x), s2(x);
    s1.push_back(kGuard);
    s2.push_back(kGuard);
    k().softmax(s1.data(), n);
    ref().softmax(s2.data(), n);
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(s1[i], s2[i], 2e-6 * s2[i] + 1e-9) << i;
      total += s1[i];
    }
    ASSERT_EQ(s1[n], kGuard);
    ASSERT_NEAR(total, 1.0, 1e-5);

    std::fill(got.begin(), got.end() - 1, NAN);
    std::fill(want.begin(), want.end() - 1, NAN);
    k().silu_mul(x.data(), up.data(), n, got.data());
    ref().silu_mul(x.data(), up.data(), n, want.data());
    for (size_t i = 0; i <= n; ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-7);

    double exact = 0, mag = 0;
    for (size_t i = 0; i < n; ++i) {
      exact += double(x[i]) * w[i];
      mag += std::fabs(double(x[i]) * w[i]);
    }
    ASSERT_NEAR(k().dot(x.data(), w.data(), n), exact, 1e-5 * mag + 1e-6);

    std::vector<float> y1(up), y2(up);
    k().axpy(0.37f, x.data(), n, y1.data());
    ref().axpy(0.37f, x.data(), n, y2.data());
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(y1[i], y2[i], 1e-6 * (std::fabs(y2[i]) + 1));
  }
}

TEST_P(DenseTest, SoftmaxHandlesMinusInfinityAndLargeValues) {
  std::vector<float> v = {-INFINITY, 1000.f, 999.f, -INFINITY, -50.f, 0.f, 3.f, -INFINITY, 998.f};
  k().softmax(v.data(), v.size());
  EXPECT_EQ(v[0], 0.f);
  EXPECT_EQ(v[3], 0.f);
  EXPECT_EQ(v[7], 0.f);
  const double e1 = 1.0, e2 = std::exp(-1.0), e3 = std::exp(-2.0), z = e1 + e2 + e3;
  EXPECT_NEAR(v[1], e1 / z, 1e-6);
  EXPECT_NEAR(v[2], e2 / z, 1e-6);
  EXPECT_NEAR(v[8], e3 / z, 1e-6);
}

TEST(Bf16, RoundTripAndRounding) {
  EXPECT_EQ(Bf16Bits(ToBf16Bits(1.0f)), 1.0f);
  EXPECT_EQ(Bf16Bits(ToBf16Bits(-2.5f)), -2.5f);
  // 1 + 2^-8 is halfway between two bf16 values: round to even (1.0).
  EXPECT_EQ(Bf16Bits(ToBf16Bits(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(Bf16Bits(ToBf16Bits(NAN))));
}

// The bf16-activation tables (KernelsFor(isa, false, true): vdpbf16ps where the CPU has
// AVX512-BF16, else the backend's fp32 kernel on rounded activations) against the exact product
// of the rounded activations, with the same tolerance as the fp32 tables, which a kernel that
// kept the fp32 activations misses (each rounding moves a term by up to 2^-9 of itself).
// The batch-invariant table (KernelsFor(isa, true, true)) gives each token's result the same bits
// at every token count; the default one may not (AVX2 runs one token through its GEMV). Outputs
// outside the rows stay untouched.
TEST_P(DenseTest, MatmulWithBf16ActivationsMatchesTheRoundedProduct) {
  for (bool invariant : {false, true}) {
    SCOPED_TRACE(invariant ? "batch-invariant table" : "default table");
    const DenseKernels& kb = KernelsFor(GetParam(), invariant, /*bf16_activations=*/true);
    struct Shape {
      size_t T, K, N;
    };
    std::vector<Shape> shapes;
    for (size_t T : {1, 2, 3, 4, 5, 17, 37})
      for (size_t K : {1, 7, 31, 32, 33, 100, 257, 1057})
        for (size_t N : {1, 5, 19, 64}) shapes.push_back({T, K, N});
    // Rows longer than the AVX512-BF16 kernel's activation buffer (64 Ki values); tokens in two
    // groups of that buffer (16 tokens of 4000 columns fit); no columns at all.
    shapes.push_back({3, 70001, 5});
    shapes.push_back({17, 4000, 5});
    shapes.push_back({3, 0, 5});
    for (const Shape& shape : shapes) {
      const size_t T = shape.T, K = shape.K, N = shape.N;
      SCOPED_TRACE(testing::Message() << "T=" << T << " K=" << K << " N=" << N << " seed=1234");
      const size_t ldx = K + 3, ldy = N + 2;
      auto x = Random(T * ldx, -4.f, 4.f);
      auto wf = Random(N * K);
      std::vector<uint16_t> wb(N * K);
      for (size_t i = 0; i < wb.size(); ++i) {
        wb[i] = ToBf16Bits(wf[i]);
        wf[i] = Bf16Bits(wb[i]);
      }
      const size_t n_begin = N > 4 ? 1 : 0, n_end = N > 4 ? N - 1 : N;
      std::vector<float> y(T * ldy, NAN);
      for (size_t t = 0; t < T; ++t) {
        for (size_t n = 0; n < ldy; ++n) {
          if (n < n_begin || n >= n_end) y[t * ldy + n] = kGuard;
        }
      }
      kb.matmul_bf16(x.data(), ldx, T, wb.data(), K, n_begin, n_end, y.data(), ldy);
      for (size_t t = 0; t < T; ++t) {
        // The same token alone.
        std::vector<float> alone(ldy, NAN);
        kb.matmul_bf16(x.data() + t * ldx, ldx, 1, wb.data(), K, n_begin, n_end, alone.data(), ldy);
        for (size_t n = 0; n < ldy; ++n) {
          const float got = y[t * ldy + n];
          if (n < n_begin || n >= n_end) {
            ASSERT_EQ(got, kGuard) << "wrote outside its rows at t=" << t << " n=" << n;
            continue;
          }
          const auto [exact, mag] =
              ExactDot(x.data() + t * ldx, wf.data() + n * K, K, /*round_x=*/true);
          ASSERT_FALSE(std::isnan(got)) << "t=" << t << " n=" << n;
          ASSERT_NEAR(got, exact, 1e-5 * mag + 1e-6) << "t=" << t << " n=" << n;
          if (invariant) {
            ASSERT_EQ(got, alone[n])
                << "token " << t << " of " << T << " differs from itself alone, n=" << n;
          }
        }
      }
    }
  }
}

std::string IsaParamName(const testing::TestParamInfo<Backend>& info) {
  return BackendName(info.param);
}

INSTANTIATE_TEST_SUITE_P(Backends, DenseTest, ::testing::ValuesIn(BackendsUnderTest()),
                         IsaParamName);

}  // namespace
}  // namespace pw::cpu
