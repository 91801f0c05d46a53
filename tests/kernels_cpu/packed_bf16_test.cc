// Packed bf16 weights (kernels/cpu/packed_bf16.h): packing is lossless (every row unpacks to the
// bits it was packed from, on the scalar reference and on AVX2, for weight-like rows, rows of
// random bits with NaN and infinity, and awkward widths), weight-like rows take 0.75x their
// bytes, and the packed product equals the plain one: the same bits on the unpacking path of
// every CPU table, and where chunks are decoded in registers (AVX512-BF16, the AVX2 GEMV) for
// rows without exceptions (within fp32 rounding for rows with them).
#include "kernels/cpu/packed_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/dense.h"

namespace pw::cpu {
namespace {

using kernels::Backend;
using kernels::BackendSupported;

// Weight-like rows: normal values of standard deviation `sd` rounded to bf16.
std::vector<uint16_t> Gaussian(size_t rows, size_t cols, float sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<uint16_t> w(rows * cols);
  for (auto& v : w) v = ToBf16Bits(d(rng));
  return w;
}

// Any bits: NaN, infinity, denormals, both zeros, every exponent.
std::vector<uint16_t> AnyBits(size_t rows, size_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> w(rows * cols);
  for (auto& v : w) v = static_cast<uint16_t>(rng());
  if (!w.empty()) w[0] = 0x7F80;           // +inf
  if (w.size() > 1) w[1] = 0xFFC1;         // NaN
  if (w.size() > 2) w[2] = 0x8000;         // -0
  if (w.size() > 3) w[3] = 0x0001;         // denormal
  return w;
}

void ExpectRoundTrip(const std::vector<uint16_t>& w, size_t rows, size_t cols) {
  const PackedBf16Matrix m = PackBf16(w.data(), rows, cols);
  const PackedBf16View v = m.view();
  std::vector<uint16_t> ref(rows * cols, 0xDEAD), fast(rows * cols, 0xBEEF);
  UnpackBf16RowsScalar(v, 0, rows, ref.data());
  EXPECT_EQ(ref, w) << rows << "x" << cols;
  UnpackBf16Rows(v, 0, rows, fast.data());
  EXPECT_EQ(fast, w) << rows << "x" << cols;
  if (rows > 2 && BackendSupported(Backend::kAvx2)) {  // a range not starting at row 0
    std::vector<uint16_t> part((rows - 1) * cols);
    UnpackBf16RowsAvx2(v, 1, rows, part.data());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), w.begin() + cols)) << rows << "x" << cols;
  }
}

TEST(PackedBf16, SlotsCoverEveryColumnOnce) {
  std::vector<int> seen(kPackedChunkColumns, 0);
  for (size_t s = 0; s < kPackedChunkColumns; ++s) ++seen[ColumnOfSlot(s)];
  for (int n : seen) EXPECT_EQ(n, 1);
}

TEST(PackedBf16, RoundTripIsExact) {
  for (size_t cols : {1, 7, 31, 32, 33, 63, 64, 65, 100, 128, 2065}) {
    for (size_t rows : {1, 3, 17}) {
      ExpectRoundTrip(Gaussian(rows, cols, 0.02f, 7 + cols + rows), rows, cols);
      ExpectRoundTrip(AnyBits(rows, cols, 11 + cols * rows), rows, cols);
    }
  }
}

TEST(PackedBf16, WeightLikeRowsTakeThreeQuartersOfTheirBytes) {
  const size_t rows = 256, cols = 2048;
  const std::vector<uint16_t> w = Gaussian(rows, cols, 0.02f, 3);
  const PackedBf16Matrix m = PackBf16(w.data(), rows, cols);
  const double ratio = static_cast<double>(m.Bytes()) / (2.0 * rows * cols);
  EXPECT_GT(ratio, 0.75);
  EXPECT_LT(ratio, 0.76);
  // A normal row spans about 16 binades of either sign in 16 high bytes: few values fall outside.
  EXPECT_LT(m.exceptions(), rows * cols / 1000);
}

TEST(PackedBf16, RowsOfRandomBitsKeepEveryValueAsAnException) {
  const size_t rows = 4, cols = 300;
  const std::vector<uint16_t> w = AnyBits(rows, cols, 5);
  const PackedBf16Matrix m = PackBf16(w.data(), rows, cols);
  EXPECT_GT(m.exceptions(), rows * cols / 2);  // 256 high bytes, 15 in each table
  ExpectRoundTrip(w, rows, cols);
}

struct Table {
  const char* name;
  const kernels::DenseKernels* k;
};

std::vector<Table> Tables() {
  std::vector<Table> t;
  for (Backend b : {Backend::kScalar, Backend::kAvx2, Backend::kAvx512, Backend::kAmx}) {
    if (!BackendSupported(b)) continue;
    t.push_back({kernels::BackendName(b), &KernelsFor(b, false, false)});
    t.push_back({kernels::BackendName(b), &KernelsFor(b, false, true)});
  }
  return t;
}

// The packed product against the table's own product over the plain rows, rows [n0, n1).
void ExpectSameProduct(const kernels::DenseKernels& k, const char* name, const std::vector<uint16_t>& w,
                       size_t N, size_t K, size_t T, size_t n0, size_t n1, size_t scratch_values,
                       bool bits) {
  std::mt19937 rng(static_cast<uint32_t>(N * 131 + K * 7 + T));
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  const size_t ldx = K + 3, ldy = N + 2;
  std::vector<float> x(T * ldx);
  for (auto& v : x) v = d(rng);
  std::vector<float> plain(T * ldy, -7.f), packed(T * ldy, -7.f);
  k.matmul_bf16(x.data(), ldx, T, w.data(), K, n0, n1, plain.data(), ldy);
  const PackedBf16Matrix m = PackBf16(w.data(), N, K);
  std::vector<uint16_t> scratch(scratch_values);
  MatmulPackedBf16(k, x.data(), ldx, T, m.view(), n0, n1, packed.data(), ldy, scratch.data(),
                   scratch.size());
  for (size_t t = 0; t < T; ++t) {
    for (size_t n = 0; n < ldy; ++n) {
      const float a = plain[t * ldy + n], b = packed[t * ldy + n];
      if (n < n0 || n >= n1) {
        EXPECT_EQ(b, -7.f) << "wrote outside its rows";
        continue;
      }
      if (bits) {
        ASSERT_EQ(std::memcmp(&a, &b, sizeof a), 0)
            << name << " " << N << "x" << K << " T=" << T << " row " << n << ": " << a << " vs " << b;
      } else {
        ASSERT_NEAR(a, b, 1e-5f * (1.f + std::fabs(a))) << name << " T=" << T << " row " << n;
      }
    }
  }
}

// Whether the packed product keeps the table's bits: everywhere but where it decodes in
// registers (AVX512-BF16 at 1-4 tokens; the AVX2 tables' one-token GEMV) and adds a row's
// exceptions after its sum, or, for the AVX2 GEMV, pads a K that is not a multiple of 16.
bool KeepsBits(const kernels::DenseKernels& k, size_t T, size_t K, bool no_exceptions) {
  PackedBf16View shape;
  shape.cols = K;
  if (!shape.FitsInRegisterProducts()) return true;
  if (UsesAvx512Bf16(k) && T <= kPackedFusedTokens) return no_exceptions;
  if (T == 1 && (&k == &kAvx2Kernels || &k == &kAvx2Bf16ActsKernels)) return no_exceptions && K % 16 == 0;
  return true;
}

TEST(PackedBf16, ProductIsThePlainProduct) {
  for (const Table& tb : Tables()) {
    for (size_t K : {40, 64, 100, 2048, 16400}) {  // 16400: unpacked
      const size_t N = 37;
      const std::vector<uint16_t> w = Gaussian(N, K, 0.05f, static_cast<uint32_t>(K));
      const bool no_exceptions = PackBf16(w.data(), N, K).exceptions() == 0;
      for (size_t T : {1, 2, 3, 4, 5, 9, 16, 37}) {
        const bool bits = KeepsBits(*tb.k, T, K, no_exceptions);
        ExpectSameProduct(*tb.k, tb.name, w, N, K, T, 0, N, 4 * K, bits);
        ExpectSameProduct(*tb.k, tb.name, w, N, K, T, 5, 30, K, bits);
      }
    }
  }
}

TEST(PackedBf16, ProductWithExceptionsIsThePlainProduct) {
  // Values of every binade: most rows have exceptions.
  const size_t N = 21, K = 130;
  std::vector<uint16_t> w = Gaussian(N, K, 0.05f, 9);
  std::mt19937 rng(4);
  for (size_t i = 0; i < w.size(); i += 5) w[i] = ToBf16Bits(std::ldexp(0.7f, -40 + static_cast<int>(rng() % 60)));
  ASSERT_GT(PackBf16(w.data(), N, K).exceptions(), 0u);
  for (const Table& tb : Tables()) {
    for (size_t T : {1, 4, 6}) {
      ExpectSameProduct(*tb.k, tb.name, w, N, K, T, 0, N, 3 * K, KeepsBits(*tb.k, T, K, false));
    }
  }
}

TEST(PackedBf16DeathTest, ScratchSmallerThanARowAborts) {
  const std::vector<uint16_t> w = Gaussian(4, 100, 0.02f, 1);
  const PackedBf16Matrix m = PackBf16(w.data(), 4, 100);
  std::vector<float> x(100 * 8, 1.f), y(4 * 8);
  std::vector<uint16_t> scratch(99);
  EXPECT_DEATH(MatmulPackedBf16(KernelsFor(Backend::kScalar), x.data(), 100, 8, m.view(), 0, 4,
                                y.data(), 4, scratch.data(), scratch.size()),
               "less than a row");
}

}  // namespace
}  // namespace pw::cpu
