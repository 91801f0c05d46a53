// The integer fast path (kernels/anyprec/q8.h):
//   - LUT and activation quantization against their defining formulas;
//   - the scalar reference against the exact fp16-LUT product, within the error bound the two
//     quantizations allow: |y_q8 - y_exact| <= sum_c (|dw| |x| + |w| |dx| + |dw| |dx|) with
//     |dw| <= lut_scale / 2 and |dx| <= act_scale / 2 per column (plus fp32 rounding);
//   - every SIMD backend against the scalar reference: |y - y_ref| <= 1e-5 * sum_c (|w8| + 128)
//     |x8| (scaled): fp32 group accumulation vs fp64, where the VNNI path sums the weights
//     offset to unsigned (w8 + 128) and subtracts the offset's share at the end, so its rounding
//     scales with the offset sum too (one column of a small weight would otherwise fail a bound
//     on |w8 x8| alone); on random blocks of awkward shapes, every width, 1/3/37/64 tokens, page
//     lists of several tile sizes, outputs poisoned with NaN first; the AMX backend also at
//     8, 12 and 16 tokens, where its tiles take over.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/anyprec/anyprec.h"
#include "kernels/anyprec/pack.h"
#include "kernels/anyprec/q8.h"
#include "kernels/cpu/kernel_settings.h"
#include "tests/anyprec/random_block.h"

namespace pw::anyprec {
namespace {

using kernels::Backend;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The int8 LUTs of one block at every width.
struct Q8Luts {
  std::vector<int8_t> values[kMaxBits + 1];
  std::vector<float> scales[kMaxBits + 1];
  Q8Lut At(int bits) const { return {values[bits].data(), scales[bits].data()}; }
};

Q8Luts MakeQ8Luts(const PackedBlock& b) {
  Q8Luts l;
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    l.values[bits].resize(Q8LutValueBytes(b.rows, bits));
    l.scales[bits].resize(b.rows);
    EXPECT_TRUE(QuantizeLut(b.luts[bits].data(), b.rows, bits, l.values[bits].data(),
                            l.scales[bits].data()).ok());
  }
  return l;
}

struct Acts {
  AlignedBuffer buf;
  Q8Acts acts;
  Acts(const std::vector<float>& x, int tokens, int cols) : buf(Q8ActsBytes(tokens, cols)) {
    const Status s = QuantizeActs(x.data(), cols, tokens, cols, buf.ws(), &acts);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
};

std::vector<Backend> Q8SimdBackends() {
  std::vector<Backend> out;
  for (Backend b : {Backend::kAvx2, Backend::kAvx512, Backend::kAmx}) {
    if (Q8BackendAvailable(b)) {
      out.push_back(b);
    } else {
      std::printf("[ SKIPPED  ] fast path %s: this CPU does not support it\n", BackendName(b));
    }
  }
  return out;
}

int Code(const RandomBlock& rb, int r, int c, int bits) {
  return rb.codes[static_cast<size_t>(r) * rb.block.cols + c] >> (8 - bits);
}

TEST(Q8Lut, QuantizesEachRowToItsWidthsMaximum) {
  std::mt19937 rng(11);
  RandomBlock rb = MakeRandomBlock(9, 10, rng);
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    std::vector<int8_t> v(Q8LutValueBytes(9, bits));
    std::vector<float> s(9);
    ASSERT_TRUE(QuantizeLut(rb.block.luts[bits].data(), 9, bits, v.data(), s.data()).ok());
    for (int r = 0; r < 9; ++r) {
      int most = 0;
      for (int i = 0; i < LutEntries(bits); ++i) {
        const float want = F16ToF32(rb.block.luts[bits][(r << bits) + i]);
        const int q = v[(r << bits) + i];
        EXPECT_LE(std::abs(q), Q8LutMax(bits));
        EXPECT_LE(std::fabs(q * s[r] - want), 0.5f * s[r] * (1 + 1e-5f)) << "b" << bits << " r" << r;
        most = std::max(most, std::abs(q));
      }
      EXPECT_EQ(most, Q8LutMax(bits)) << "b" << bits;  // 31 at 3-4 bits, 127 above
    }
  }
  // A row of zeros gets scale 0 and zero values; a non-finite centroid is refused.
  std::vector<uint16_t> zeros(8, 0), bad(8, 0);
  bad[3] = 0x7C00;  // +inf
  std::vector<int8_t> v(8, 1);
  float s = 1;
  ASSERT_TRUE(QuantizeLut(zeros.data(), 1, 3, v.data(), &s).ok());
  EXPECT_EQ(s, 0.f);
  for (int8_t q : v) EXPECT_EQ(q, 0);
  EXPECT_FALSE(QuantizeLut(bad.data(), 1, 3, v.data(), &s).ok());
}

TEST(Q8Acts, QuantizesPerGroupInPairOrder) {
  std::mt19937 rng(12);
  for (int cols : {1, 31, 256, 300, 512, 700, 1100}) {
    const int tokens = 3;
    auto x = RandomX(tokens, cols, rng);
    x[0] = 0;  // exact zero stays zero
    Acts a(x, tokens, cols);
    const int stride = Q8ActStride(cols), groups = Q8ActGroups(cols);
    EXPECT_EQ(stride % 512, 0);
    for (int t = 0; t < tokens; ++t) {
      std::vector<int> seen(stride, 0);
      double off = 0;
      for (int g = 0; g < groups; ++g) {
        float amax = 0;
        for (int c = g * 256; c < std::min(cols, (g + 1) * 256); ++c) amax = std::max(amax, std::fabs(x[t * cols + c]));
        const float scale = a.acts.scales[t * groups + g];
        EXPECT_FLOAT_EQ(scale, amax / 127.f);
        long sum = 0;
        for (int c = g * 256; c < std::min(cols, (g + 1) * 256); ++c) {
          const int i = Q8ActIndex(c);
          ++seen[i];
          const int q = a.acts.q[t * stride + i];
          const int want = amax > 0 ? static_cast<int>(std::nearbyint(x[t * cols + c] * (127.f / amax))) : 0;
          EXPECT_EQ(q, want) << cols << " c" << c;
          sum += q;
        }
        off += static_cast<double>(scale) * sum;
      }
      EXPECT_NEAR(a.acts.offsets[t], 128 * off, 1e-4 * (1 + std::fabs(128 * off)));
      for (int i = 0; i < stride; ++i) {
        // Every column has its own byte; bytes of no column are zero padding.
        EXPECT_LE(seen[i], 1);
        if (seen[i] == 0) {
          EXPECT_EQ(a.acts.q[t * stride + i], 0) << "padding byte " << i;
        }
      }
    }
  }
  std::vector<float> x(10, 1.f);
  x[4] = std::numeric_limits<float>::infinity();
  AlignedBuffer buf(Q8ActsBytes(1, 10));
  Q8Acts out;
  EXPECT_FALSE(QuantizeActs(x.data(), 10, 1, 10, buf.ws(), &out).ok());
  EXPECT_FALSE(QuantizeActs(x.data(), 10, 0, 10, buf.ws(), &out).ok());
  EXPECT_FALSE(QuantizeActs(x.data(), 10, 1, 10, {buf.ptr, 8}, &out).ok());
}

TEST(Q8Scalar, WithinQuantizationBoundOfExactProduct) {
  std::mt19937 rng(13);
  const int rows = 17, cols = 600, tokens = 3;
  RandomBlock rb = MakeRandomBlock(rows, cols, rng);
  const Q8Luts luts = MakeQ8Luts(rb.block);
  auto x = RandomX(tokens, cols, rng);
  Acts a(x, tokens, cols);
  PageLists pages = rb.block.Pages(5);
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    std::vector<float> exact(tokens * rows, kNaN), fast(tokens * rows, kNaN);
    ASSERT_TRUE(ApGemm(Backend::kScalar, pages.view(), bits, x.data(), tokens, exact.data(), {}).ok());
    ASSERT_TRUE(ApGemmQ8Rows(Backend::kScalar, pages.view(), bits, luts.At(bits), a.acts, fast.data(),
                             rows, 0, rows).ok());
    double worst = 0;
    for (int t = 0; t < tokens; ++t) {
      for (int r = 0; r < rows; ++r) {
        const double dw = 0.5 * luts.scales[bits][r];
        double bound = 0, mag = 0;
        for (int c = 0; c < cols; ++c) {
          const double w = std::fabs(F16ToF32(rb.block.luts[bits][(r << bits) + Code(rb, r, c, bits)]));
          const double xv = std::fabs(x[t * cols + c]);
          const double dx = 0.5 * a.acts.scales[t * Q8ActGroups(cols) + c / 256];
          bound += dw * xv + w * dx + dw * dx;
          mag += w * xv;
        }
        const double err = std::fabs(fast[t * rows + r] - exact[t * rows + r]);
        EXPECT_LE(err, bound + 1e-5 * mag) << "b" << bits << " t" << t << " r" << r;
        worst = std::max(worst, err / mag);
      }
    }
    std::printf("b%d: worst |fast - exact| / sum|w x| = %.2e\n", bits, worst);
  }
}

struct Shape {
  int rows, cols;
};

// Every backend of `backends` against the scalar reference on block `rb` at every width, for
// `tokens` random tokens, with the planes given as pages of each of `tiles` rows; outputs
// poisoned with NaN first.
void ExpectBackendsMatchReference(const std::vector<Backend>& backends, const RandomBlock& rb,
                                  const Q8Luts& luts, const Shape& s, int tokens,
                                  const std::vector<int>& tiles, std::mt19937& rng, unsigned seed) {
  auto x = RandomX(tokens, s.cols, rng);
  Acts a(x, tokens, s.cols);
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    // Tolerance scale: sum_c (|w8| + 128) * s_r * |x8 * s_g| per output.
    std::vector<double> mag(static_cast<size_t>(tokens) * s.rows, 0.0);
    for (int t = 0; t < tokens; ++t) {
      for (int r = 0; r < s.rows; ++r) {
        for (int c = 0; c < s.cols; ++c) {
          mag[t * s.rows + r] += (std::fabs(luts.values[bits][(r << bits) + Code(rb, r, c, bits)]) + 128) *
                                 luts.scales[bits][r] *
                                 std::fabs(a.acts.q[t * Q8ActStride(s.cols) + Q8ActIndex(c)] *
                                           a.acts.scales[t * Q8ActGroups(s.cols) + c / 256]);
        }
      }
    }
    PageLists ref_pages = rb.block.Pages(s.rows);
    std::vector<float> want(static_cast<size_t>(tokens) * s.rows, kNaN);
    ASSERT_TRUE(ApGemmQ8Rows(Backend::kScalar, ref_pages.view(), bits, luts.At(bits), a.acts,
                             want.data(), s.rows, 0, s.rows).ok());
    for (int tile : tiles) {
      PageLists pages = rb.block.Pages(tile);
      for (Backend be : backends) {
        std::vector<float> y(want.size(), kNaN);
        Status st = ApGemmQ8Rows(be, pages.view(), bits, luts.At(bits), a.acts, y.data(), s.rows, 0, s.rows);
        ASSERT_TRUE(st.ok()) << st.ToString();
        int bad = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          const double tol = 1e-5 * mag[i] + 1e-30;
          if (!(std::fabs(static_cast<double>(y[i]) - want[i]) <= tol) && ++bad <= 3) {
            ADD_FAILURE() << BackendName(be) << " " << s.rows << "x" << s.cols << " t" << tokens
                          << " b" << bits << " tile" << tile << " seed " << seed << " index " << i
                          << ": got " << y[i] << " want " << want[i] << " tol " << tol;
          }
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

TEST(Q8Backends, MatchReferenceOnAwkwardShapes) {
  const auto backends = Q8SimdBackends();
  if (backends.empty()) GTEST_SKIP() << "no SIMD fast path on this CPU";
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  // Rows past the last block of 16, odd group counts (a half last pair); on the AMX backend
  // several column chunks at 37 and 64 tokens (two group pairs per chunk), rows of up to 2048
  // columns on tiles, of 3600 (8 pairs, one chunk) on tiles up to 16 tokens and walked row
  // block by row block across all columns above, longer ones ({2, 4100}) as the AMX backend's
  // thresholds say (AmxMatchesReferenceOnLongRows).
  const Shape shapes[] = {{1, 1}, {37, 50}, {129, 65}, {64, 256}, {33, 513}, {9, 768}, {3, 1000}, {6, 1024}, {40, 2000}, {20, 3600}, {2, 4100}};
  // 8 (3-4 bits), 12, 16, 37, 64: the AMX tiles (one partial, one full, three and four token
  // groups of 16).
  const int token_counts[] = {1, 3, 8, 12, 16, 37, 64};
  for (const Shape& s : shapes) {
    RandomBlock rb = MakeRandomBlock(s.rows, s.cols, rng);
    const Q8Luts luts = MakeQ8Luts(rb.block);
    for (int tokens : token_counts) {
      ExpectBackendsMatchReference(backends, rb, luts, s, tokens, {1, 7, 64}, rng, seed);
    }
  }
}

// At 3 and 4 bits the AVX2 kernel multiplies the LUT biased to unsigned (value + kQ8LutBias)
// and adds two slices' int16 pair sums before widening them, which holds only while every LUT
// value is within Q8LutMax. Here every product is as large as it can be: every centroid of a
// row is the same +-1 (so +-31 in int8, 63 or 1 biased) and every activation +-1 (so +-127),
// so with centroids +1 every int16 sum reaches +-2 * 2 * 63 * 127. Every backend must still
// give the reference's result, at one token and at several.
TEST(Q8Backends, LargestProductsAtThreeAndFourBitsMatchReference) {
  std::vector<Backend> backends = Q8SimdBackends();
  if (backends.empty()) GTEST_SKIP() << "no SIMD fast path on this CPU";
  std::mt19937 rng(21);
  const int rows = 5, cols = 1000;
  RandomBlock rb = MakeRandomBlock(rows, cols, rng);
  PageLists pages = rb.block.Pages(rows);
  for (float centroid : {1.f, -1.f}) {
    for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
      for (auto& v : rb.block.luts[bits]) v = F32ToF16(centroid);
    }
    const Q8Luts luts = MakeQ8Luts(rb.block);
    for (int bits : {3, 4}) {
      EXPECT_EQ(luts.values[bits][0], centroid * Q8LutMax(bits));
      for (float sign : {1.f, -1.f}) {
        for (int tokens : {1, 8}) {
          std::vector<float> x(static_cast<size_t>(tokens) * cols, sign);
          Acts a(x, tokens, cols);
          std::vector<float> want(static_cast<size_t>(tokens) * rows, kNaN);
          ASSERT_TRUE(ApGemmQ8Rows(Backend::kScalar, pages.view(), bits, luts.At(bits), a.acts, want.data(),
                                   rows, 0, rows).ok());
          EXPECT_NEAR(want[0], centroid * sign * cols, 1e-3 * cols);
          for (Backend be : backends) {
            std::vector<float> y(want.size(), kNaN);
            ASSERT_TRUE(
                ApGemmQ8Rows(be, pages.view(), bits, luts.At(bits), a.acts, y.data(), rows, 0, rows).ok());
            for (size_t i = 0; i < y.size(); ++i) {
              EXPECT_NEAR(y[i], want[i], 1e-5 * cols)
                  << BackendName(be) << " b" << bits << " t" << tokens << " i" << i;
            }
          }
        }
      }
    }
  }
}

// The AMX backend on long rows, where its tiles walk each block of 16 rows across all its
// columns with the B tiles of every column laid out once: {20, 14400} (29 group pairs, a half
// last one: 4 column chunks per row block at 12 and 16 tokens; at 37 tokens the B tiles of all
// columns exceed the layout, so the tokens run in passes of 16, 16 and 5) and {17, 8000} (16
// pairs: at 37 tokens one pass of 32 tokens in two token groups, then one of 5). Page tiles
// of 7 rows put page boundaries inside every row block.
TEST(Q8Backends, AmxMatchesReferenceOnLongRows) {
  if (!Q8BackendAvailable(Backend::kAmx)) GTEST_SKIP() << "no AMX fast path on this CPU";
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (const Shape& s : {Shape{20, 14400}, Shape{17, 8000}}) {
    RandomBlock rb = MakeRandomBlock(s.rows, s.cols, rng);
    const Q8Luts luts = MakeQ8Luts(rb.block);
    for (int tokens : {12, 16, 37}) {
      ExpectBackendsMatchReference({Backend::kAmx}, rb, luts, s, tokens, {7, 32}, rng, seed);
    }
  }
}

// The int8 LUT given as row tiles (pages of a paged pool, each its own allocation) gives the
// same bits as the contiguous LUT, on every backend, for tiles that do and do not divide rows.
TEST(Q8Backends, PagedLutEqualsContiguousLut) {
  std::vector<Backend> backends = Q8SimdBackends();
  backends.push_back(Backend::kScalar);
  std::mt19937 rng(7);
  const Shape shapes[] = {{1, 1}, {37, 50}, {129, 300}};
  for (const Shape& s : shapes) {
    RandomBlock rb = MakeRandomBlock(s.rows, s.cols, rng);
    const Q8Luts luts = MakeQ8Luts(rb.block);
    const int tokens = 3;
    auto x = RandomX(tokens, s.cols, rng);
    Acts a(x, tokens, s.cols);
    PageLists planes = rb.block.Pages(16);
    for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
      for (int tile : {1, 5, 64}) {
        std::vector<std::vector<int8_t>> page_store;
        std::vector<const int8_t*> pages;
        for (int r0 = 0; r0 < s.rows; r0 += tile) {
          const int n = std::min(tile, s.rows - r0);
          page_store.emplace_back(luts.values[bits].begin() + (static_cast<size_t>(r0) << bits),
                                  luts.values[bits].begin() + (static_cast<size_t>(r0 + n) << bits));
        }
        for (const auto& p : page_store) pages.push_back(p.data());
        Q8Lut paged;
        paged.scales = luts.scales[bits].data();
        paged.pages = pages.data();
        paged.tile_rows = tile;
        for (Backend be : backends) {
          std::vector<float> want(static_cast<size_t>(tokens) * s.rows, kNaN), got(want.size(), kNaN);
          ASSERT_TRUE(ApGemmQ8Rows(be, planes.view(), bits, luts.At(bits), a.acts, want.data(),
                                   s.rows, 0, s.rows).ok());
          ASSERT_TRUE(ApGemmQ8Rows(be, planes.view(), bits, paged, a.acts, got.data(), s.rows, 0,
                                   s.rows).ok());
          EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
              << BackendName(be) << " " << s.rows << "x" << s.cols << " b" << bits << " tile " << tile;
        }
      }
    }
  }
}

TEST(Q8Backends, RowRangeAndStrideWriteOnlyTheirEntries) {
  std::mt19937 rng(14);
  const int rows = 40, cols = 300, tokens = 13, ldy = 45;
  RandomBlock rb = MakeRandomBlock(rows, cols, rng);
  const Q8Luts luts = MakeQ8Luts(rb.block);
  auto x = RandomX(tokens, cols, rng);
  Acts a(x, tokens, cols);
  PageLists pages = rb.block.Pages(16);
  for (int tok : {1, 3, 9, tokens}) {
    Q8Acts sub = a.acts;
    sub.tokens = tok;
    for (Backend be : {Backend::kScalar, Backend::kAvx2, Backend::kAvx512, Backend::kAmx}) {
      if (!Q8BackendAvailable(be)) continue;
      for (int bits : {3, 4, 8}) {
        std::vector<float> y(tokens * ldy, kNaN);
        ASSERT_TRUE(ApGemmQ8Rows(be, pages.view(), bits, luts.At(bits), sub, y.data(), ldy, 11, 29).ok());
        for (int t = 0; t < tokens; ++t) {
          for (int r = 0; r < ldy; ++r) {
            EXPECT_EQ(std::isnan(y[t * ldy + r]), t >= tok || r < 11 || r >= 29)
                << BackendName(be) << " b" << bits << " t" << t << " r" << r;
          }
        }
      }
    }
  }
}

TEST(Q8Api, RejectsBadArguments) {
  std::mt19937 rng(15);
  RandomBlock rb = MakeRandomBlock(4, 40, rng);
  const Q8Luts luts = MakeQ8Luts(rb.block);
  auto x = RandomX(1, 40, rng);
  Acts a(x, 1, 40);
  PageLists pages = rb.block.Pages(4);
  std::vector<float> y(4);
  const BlockView& v = pages.view();
  EXPECT_FALSE(ApGemmQ8Rows(Backend::kScalar, v, 2, luts.At(3), a.acts, y.data(), 4, 0, 4).ok());
  EXPECT_FALSE(ApGemmQ8Rows(Backend::kScalar, v, 3, Q8Lut{}, a.acts, y.data(), 4, 0, 4).ok());
  EXPECT_FALSE(ApGemmQ8Rows(Backend::kScalar, v, 3, luts.At(3), Q8Acts{}, y.data(), 4, 0, 4).ok());
  Q8Acts wrong = a.acts;
  wrong.cols = 41;
  EXPECT_FALSE(ApGemmQ8Rows(Backend::kScalar, v, 3, luts.At(3), wrong, y.data(), 4, 0, 4).ok());
  EXPECT_FALSE(ApGemmQ8Rows(Backend::kScalar, v, 3, luts.At(3), a.acts, y.data(), 4, 0, 5).ok());
  EXPECT_FALSE(ApGemmQ8Rows(Backend::kScalar, v, 3, luts.At(3), a.acts, y.data(), 3, 0, 4).ok());
  EXPECT_FALSE(ApGemmQ8Rows(Backend::kScalar, v, 3, luts.At(3), a.acts, nullptr, 4, 0, 4).ok());
}

// ---- Dense int8 matrices ----

std::vector<uint16_t> RandomBf16(int rows, int cols, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 0.05f);
  std::vector<uint16_t> w(static_cast<size_t>(rows) * cols);
  for (auto& v : w) v = F32ToBf16(d(rng));
  return w;
}

float Bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct DenseQ8 {
  std::vector<int8_t> values;
  std::vector<float> scales;
  Q8Matrix m;
  DenseQ8(const std::vector<uint16_t>& w, int rows, int cols, int max_value = 127)
      : values(Q8MatrixValueBytes(rows, cols), 99), scales(rows) {
    EXPECT_TRUE(QuantizeBf16Rows(w.data(), rows, cols, values.data(), scales.data(), max_value).ok());
    m = {rows, cols, values.data(), scales.data(), max_value};
  }
};

TEST(Q8Dense, QuantizesRowsInActivationOrderAndTracksBf16Product) {
  std::mt19937 rng(21);
  const int rows = 11, cols = 700, tokens = 2;
  auto w = RandomBf16(rows, cols, rng);
  DenseQ8 q(w, rows, cols);
  const int stride = Q8ActStride(cols);
  for (int r = 0; r < rows; ++r) {
    float amax = 0;
    for (int c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(Bf16(w[r * cols + c])));
    EXPECT_FLOAT_EQ(q.scales[r], amax / 127.f);
    std::vector<int> seen(stride, 0);
    for (int c = 0; c < cols; ++c) {
      const int i = Q8ActIndex(c);
      ++seen[i];
      EXPECT_LE(std::fabs(q.values[r * stride + i] * q.scales[r] - Bf16(w[r * cols + c])), 0.5f * q.scales[r] * (1 + 1e-5f));
    }
    for (int i = 0; i < stride; ++i) {
      if (seen[i] == 0) {
        EXPECT_EQ(q.values[r * stride + i], 0) << "padding byte " << i;
      }
    }
  }
  // Scalar product against the fp32 product of the bf16 weights, within the rounding bound.
  auto x = RandomX(tokens, cols, rng);
  Acts a(x, tokens, cols);
  std::vector<float> y(tokens * rows, kNaN);
  ASSERT_TRUE(DenseQ8Rows(Backend::kScalar, q.m, a.acts, y.data(), rows, 0, rows).ok());
  for (int t = 0; t < tokens; ++t) {
    for (int r = 0; r < rows; ++r) {
      double want = 0, bound = 0;
      for (int c = 0; c < cols; ++c) {
        const double wv = Bf16(w[r * cols + c]), xv = x[t * cols + c];
        const double dw = 0.5 * q.scales[r], dx = 0.5 * a.acts.scales[t * Q8ActGroups(cols) + c / 256];
        want += wv * xv;
        bound += dw * std::fabs(xv) + std::fabs(wv) * dx + dw * dx;
      }
      EXPECT_LE(std::fabs(y[t * rows + r] - want), bound + 1e-6) << "t" << t << " r" << r;
    }
  }
  std::vector<uint16_t> bad(8, 0);
  bad[5] = 0x7F80;  // +inf
  std::vector<int8_t> v(Q8MatrixValueBytes(1, 8));
  float sc;
  EXPECT_FALSE(QuantizeBf16Rows(bad.data(), 1, 8, v.data(), &sc).ok());
  // The narrower range AVX2 multiplies in pairs: scale max |w| / 63, values within it; a range
  // outside 1..127 is refused.
  DenseQ8 narrow(w, rows, cols, kDenseQ8PairMax);
  for (int r = 0; r < rows; ++r) {
    EXPECT_FLOAT_EQ(narrow.scales[r], q.scales[r] * 127.f / 63.f);
    for (int i = 0; i < stride; ++i) EXPECT_LE(std::abs(narrow.values[r * stride + i]), 63);
  }
  std::vector<uint16_t> one(8, F32ToBf16(0.5f));
  EXPECT_FALSE(QuantizeBf16Rows(one.data(), 1, 8, v.data(), &sc, 0).ok());
  EXPECT_FALSE(QuantizeBf16Rows(one.data(), 1, 8, v.data(), &sc, 128).ok());
  EXPECT_EQ(DenseQ8Max(Backend::kAvx2), kDenseQ8PairMax);
  EXPECT_EQ(DenseQ8Max(Backend::kScalar), kDenseQ8PairMax);
  EXPECT_EQ(DenseQ8Max(Backend::kAvx512), 127);
  EXPECT_EQ(DenseQ8Max(Backend::kAmx), 127);
}

// The range a process quantizes its dense matrices to: this CPU's fast path's unless the
// kernels.dense_q8_max knob (or PW_DENSE_Q8_MAX) says otherwise; a knob outside 1..127 is an
// error naming it.
TEST(Q8Dense, TheRangeFollowsTheBackendUnlessTheKnobSetsIt) {
  const char* env = std::getenv("PW_DENSE_Q8_MAX");
  if (env != nullptr) GTEST_SKIP() << "PW_DENSE_Q8_MAX is set in this environment";
  EXPECT_EQ(*DenseQ8Range(), DenseQ8Max(BestQ8Backend()));
  cpu::KernelSettings k;
  k.dense_q8_max = 100;
  cpu::SetKernelSettings(k);
  EXPECT_EQ(*DenseQ8Range(), 100);
  setenv("PW_DENSE_Q8_MAX", "128", 1);
  auto bad = DenseQ8Range();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("PW_DENSE_Q8_MAX '128'"), std::string::npos) << bad.status().message();
  unsetenv("PW_DENSE_Q8_MAX");
  cpu::SetKernelSettings(cpu::KernelSettings{});
  EXPECT_EQ(*DenseQ8Range(), DenseQ8Max(BestQ8Backend()));
}

// Every weight at the range's bound and every activation at 127 with the same or the opposite
// sign: each backend's int16 steps at their largest. At 63 the AVX2 kernel adds two slices'
// pair sums before widening (2 * 2 * 63 * 127 = 32004); at 127 it must not (a 127-range matrix
// multiplied in pairs fails here).
TEST(Q8Dense, LargestProductsAtEitherRangeMatchReference) {
  const auto backends = Q8SimdBackends();
  if (backends.empty()) GTEST_SKIP() << "no SIMD fast path on this CPU";
  const int rows = 5, cols = 1000;
  for (int range : {kDenseQ8PairMax, 127}) {
    for (float wsign : {1.f, -1.f}) {
      DenseQ8 q(std::vector<uint16_t>(static_cast<size_t>(rows) * cols, F32ToBf16(wsign)), rows, cols, range);
      EXPECT_EQ(q.values[0], wsign * range);
      for (float xsign : {1.f, -1.f}) {
        for (int tokens : {1, 8}) {
          std::vector<float> x(static_cast<size_t>(tokens) * cols, xsign);
          Acts a(x, tokens, cols);
          std::vector<float> want(static_cast<size_t>(tokens) * rows, kNaN);
          ASSERT_TRUE(DenseQ8Rows(Backend::kScalar, q.m, a.acts, want.data(), rows, 0, rows).ok());
          EXPECT_NEAR(want[0], wsign * xsign * cols, 1e-3 * cols);
          for (Backend be : backends) {
            std::vector<float> y(want.size(), kNaN);
            ASSERT_TRUE(DenseQ8Rows(be, q.m, a.acts, y.data(), rows, 0, rows).ok());
            for (size_t i = 0; i < y.size(); ++i) {
              EXPECT_NEAR(y[i], want[i], 1e-5 * cols) << BackendName(be) << " range " << range << " t" << tokens
                                                       << " i" << i;
            }
          }
        }
      }
    }
  }
}

TEST(Q8Dense, BackendsMatchReferenceOnAwkwardShapes) {
  const auto backends = Q8SimdBackends();
  if (backends.empty()) GTEST_SKIP() << "no SIMD fast path on this CPU";
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  const Shape shapes[] = {{1, 1}, {37, 50}, {5, 256}, {33, 513}, {9, 768}, {6, 1024}, {7, 2049}};
  for (const Shape& s : shapes) {
    for (int range : {127, kDenseQ8PairMax}) {
      SCOPED_TRACE("range " + std::to_string(range));
      auto w = RandomBf16(s.rows, s.cols, rng);
      DenseQ8 q(w, s.rows, s.cols, range);
      for (int tokens : {1, 3, 37, 64}) {
        auto x = RandomX(tokens, s.cols, rng);
        Acts a(x, tokens, s.cols);
        std::vector<float> want(static_cast<size_t>(tokens) * s.rows, kNaN);
        ASSERT_TRUE(DenseQ8Rows(Backend::kScalar, q.m, a.acts, want.data(), s.rows, 0, s.rows).ok());
        for (Backend be : backends) {
          std::vector<float> y(want.size(), kNaN);
          ASSERT_TRUE(DenseQ8Rows(be, q.m, a.acts, y.data(), s.rows, 0, s.rows).ok());
          for (size_t i = 0; i < y.size(); ++i) {
            const int t = static_cast<int>(i) / s.rows, r = static_cast<int>(i) % s.rows;
            double mag = 0;
            for (int c = 0; c < s.cols; ++c) {
              mag += (std::fabs(q.values[r * Q8ActStride(s.cols) + Q8ActIndex(c)]) + 128) * q.scales[r] *
                     std::fabs(a.acts.q[t * Q8ActStride(s.cols) + Q8ActIndex(c)] *
                               a.acts.scales[t * Q8ActGroups(s.cols) + c / 256]);
            }
            ASSERT_LE(std::fabs(static_cast<double>(y[i]) - want[i]), 1e-5 * mag + 1e-30)
                << BackendName(be) << " " << s.rows << "x" << s.cols << " t" << tokens << " i" << i
                << " seed " << seed;
          }
          // A row range writes only its rows.
          std::vector<float> part(want.size(), kNaN);
          ASSERT_TRUE(DenseQ8Rows(be, q.m, a.acts, part.data(), s.rows, s.rows / 2, s.rows).ok());
          for (size_t i = 0; i < part.size(); ++i) {
            EXPECT_EQ(std::isnan(part[i]), static_cast<int>(i) % s.rows < s.rows / 2);
          }
        }
      }
    }
  }
  DenseQ8 q(RandomBf16(4, 40, rng), 4, 40);
  auto x = RandomX(1, 41, rng);
  Acts a(x, 1, 41);
  std::vector<float> y(4);
  EXPECT_FALSE(DenseQ8Rows(Backend::kScalar, q.m, a.acts, y.data(), 4, 0, 4).ok());  // cols differ
  EXPECT_FALSE(DenseQ8Rows(Backend::kScalar, Q8Matrix{}, a.acts, y.data(), 4, 0, 4).ok());
  Acts a40(RandomX(1, 40, rng), 1, 40);
  Q8Matrix out_of_range = q.m;
  out_of_range.max_value = 128;
  EXPECT_FALSE(DenseQ8Rows(Backend::kScalar, out_of_range, a40.acts, y.data(), 4, 0, 4).ok());
}

}  // namespace
}  // namespace pw::anyprec
