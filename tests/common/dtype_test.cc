#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace pw {
namespace {

// Reference narrowing: the nearest of the two neighbouring representable values, computed in
// double, ties to the even bit pattern. `lo` and `hi` are adjacent bit patterns bracketing x.
uint16_t NearestOf(double x, uint16_t lo, double lo_val, uint16_t hi, double hi_val) {
  double dlo = std::fabs(x - lo_val), dhi = std::fabs(hi_val - x);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);  // DeepSeek-V3's FP8 weights
  for (auto t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64, DType::kI32,
                 DType::kI16, DType::kI8, DType::kU8, DType::kBool, DType::kF8E4M3}) {
    auto back = DTypeFromName(DTypeName(t));
    ASSERT_TRUE(back.has_value()) << DTypeName(t);
    EXPECT_EQ(*back, t);
  }
  EXPECT_EQ(DTypeFromName("F8_E4M3"), DType::kF8E4M3);
  EXPECT_FALSE(DTypeFromName("F8_E5M2").has_value());
  EXPECT_FALSE(DTypeFromName("bf16").has_value());
  EXPECT_FALSE(DTypeFromName("").has_value());
}

TEST(DTypeTest, Bf16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = Bf16ToF32(static_cast<uint16_t>(h));
    uint16_t back = F32ToBf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToF32(back))) << h;
    } else {
      EXPECT_EQ(back, h) << h;
    }
  }
}

TEST(DTypeTest, F16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = F16ToF32(static_cast<uint16_t>(h));
    uint16_t back = F32ToF16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(back))) << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << h;
    } else {
      EXPECT_EQ(back, h) << h;
    }
  }
}

TEST(DTypeTest, F16ToF32KnownValues) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::isinf(F16ToF32(0x7c00)));
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 (even) and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even) -> up.
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past max finite
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  // A NaN whose payload lives only in the low 16 bits must not collapse to infinity.
  float nan_low = F32FromBits(0x7f800001u);
  ASSERT_TRUE(std::isnan(nan_low));
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(nan_low))));
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(F32FromBits(0xffffffffu)))));
}

TEST(DTypeTest, F16RoundsToNearestEven) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // tie between 65504 (odd) and 65536 (inf)
  EXPECT_EQ(F32ToF16(1e9f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e9f), 0xfc00);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even zero
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 * 2^-24: tie -> even 2
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(F32FromBits(0x7f800001u)))));
}

// Random floats over the whole exponent range against a double-precision reference.
TEST(DTypeTest, NarrowingMatchesReferenceOnRandomFloats) {
  const uint32_t seed = 12345;
  std::mt19937 rng(seed);
  for (int i = 0; i < 200000; ++i) {
    float f = F32FromBits(rng());
    if (std::isnan(f) || std::isinf(f)) continue;
    double x = f;
    // bf16: bracket by truncation.
    {
      uint16_t t = static_cast<uint16_t>(F32Bits(f) >> 16);
      uint16_t t1 = static_cast<uint16_t>(t + 1);
      double tv = Bf16ToF32(t), t1v = Bf16ToF32(t1);
      // IEEE rounding treats the step past the largest finite value as 2^128.
      if (std::isinf(t1v)) t1v = std::copysign(std::ldexp(1.0, 128), t1v);
      uint16_t want = (tv == x) ? t : NearestOf(x, t, tv, t1, t1v);
      ASSERT_EQ(F32ToBf16(f), want) << "seed " << seed << " bits " << F32Bits(f);
    }
    // f16: only the representable range (beyond it: inf, checked above).
    if (std::fabs(x) < 65504.0) {
      double ax = std::fabs(x);
      // Find the largest half pattern <= |x| by binary search over positive patterns.
      uint16_t lo = 0, hi = 0x7bff;
      while (lo < hi) {
        uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
        if (F16ToF32(mid) <= ax)
          lo = mid;
        else
          hi = static_cast<uint16_t>(mid - 1);
      }
      double lv = F16ToF32(lo);
      uint16_t want = (lv == ax) ? lo
                                 : NearestOf(ax, lo, lv, static_cast<uint16_t>(lo + 1),
                                             F16ToF32(static_cast<uint16_t>(lo + 1)));
      if (std::signbit(f)) want |= 0x8000;
      ASSERT_EQ(F32ToF16(f), want) << "seed " << seed << " bits " << F32Bits(f);
    }
  }
}

}  // namespace
}  // namespace pw
