// The quantizer's per-row steps (kernels/anyprec/quantizer_rows.h) against their references:
// the radix sort against std::sort with the comparison the quantizer used, the AVX2 cut search
// and damage sums bit for bit against the scalar ones, the row packer against bit-by-bit
// packing; and QuantizeBlock's bytes on a fixed block against those of the implementation
// before these steps (a hash recorded from it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/anyprec/pack.h"
#include "kernels/anyprec/quantizer.h"
#include "kernels/anyprec/quantizer_rows.h"

namespace pw::anyprec {
namespace {

using internal::RowLuts;

std::vector<int> ReferenceOrder(const std::vector<float>& w) {
  std::vector<int> order(w.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return w[a] < w[b] || (w[a] == w[b] && a < b); });
  return order;
}

std::vector<int> RadixOrder(const std::vector<float>& w) {
  const int n = static_cast<int>(w.size());
  std::vector<int> order(n), tmp(n);
  std::vector<uint32_t> keys(n), tmp_keys(n);
  internal::SortOrder(w.data(), n, order.data(), keys.data(), tmp.data(), tmp_keys.data());
  return order;
}

// Rows of the kinds the quantizer sees: bf16 values (many ties), full fp32, signed zeros,
// denormals, one value, a constant row, huge magnitudes.
std::vector<std::vector<float>> TestRows() {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<std::vector<float>> rows;
  for (int n : {1, 2, 3, 17, 256, 2048}) {
    std::vector<float> fp32(n), bf16(n);
    for (int i = 0; i < n; ++i) {
      fp32[i] = nd(rng);
      bf16[i] = Bf16ToF32(F32ToBf16(nd(rng)));
    }
    rows.push_back(fp32);
    rows.push_back(bf16);
  }
  std::vector<float> zeros(300);
  for (size_t i = 0; i < zeros.size(); ++i) zeros[i] = (i % 3 == 0) ? -0.f : (i % 3 == 1) ? 0.f : (i % 7 == 0 ? -1e-3f : 1e-3f);
  rows.push_back(zeros);
  rows.push_back(std::vector<float>(100, 0.25f));
  std::vector<float> odd = {1e-40f, -1e-40f, 3e38f, -3e38f, 1e-45f, -0.f, 0.f, 1.f, -1.f, 1e-40f};
  rows.push_back(odd);
  return rows;
}

TEST(QuantizerRows, RadixOrderIsTheComparisonSortOrder) {
  for (const auto& w : TestRows()) EXPECT_EQ(RadixOrder(w), ReferenceOrder(w)) << "n " << w.size();
}

// A sorted row with its prefix sums, as QuantizeRow builds it.
struct SortedRow {
  std::vector<double> sv, sh, s0, s1;
};
SortedRow Sorted(const std::vector<float>& w, std::mt19937& rng) {
  std::uniform_real_distribution<float> ud(0.1f, 3.f);
  const std::vector<int> order = ReferenceOrder(w);
  const int n = static_cast<int>(w.size());
  SortedRow r{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n + 1), std::vector<double>(n + 1)};
  for (int i = 0; i < n; ++i) {
    r.sv[i] = w[order[i]];
    r.sh[i] = ud(rng);
    r.s0[i + 1] = r.s0[i] + r.sh[i];
    r.s1[i + 1] = r.s1[i] + r.sh[i] * r.sv[i];
  }
  return r;
}

TEST(QuantizerRows, Avx2CutIsTheScalarCut) {
  if (!BackendAvailable(kernels::Backend::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(11);
  int checked = 0;
  for (const auto& w : TestRows()) {
    const int n = static_cast<int>(w.size());
    if (n < 2) continue;
    const SortedRow r = Sorted(w, rng);
    std::uniform_int_distribution<int> pick(0, n);
    for (int t = 0; t < 200; ++t) {
      int a = pick(rng), b = pick(rng);
      if (a > b) std::swap(a, b);
      if (b - a < 2) continue;
      EXPECT_EQ(internal::BestCutAvx2(r.sv.data(), r.s0.data(), r.s1.data(), a, b),
                internal::BestCutScalar(r.sv.data(), r.s0.data(), r.s1.data(), a, b))
          << "n " << n << " [" << a << ", " << b << ")";
      ++checked;
    }
    EXPECT_EQ(internal::BestCutAvx2(r.sv.data(), r.s0.data(), r.s1.data(), 0, n),
              internal::BestCutScalar(r.sv.data(), r.s0.data(), r.s1.data(), 0, n));
  }
  EXPECT_GT(checked, 1000);
}

TEST(QuantizerRows, Avx2DamageIsTheScalarDamageBitForBit) {
  if (!BackendAvailable(kernels::Backend::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(13);
  for (const auto& w : TestRows()) {
    const int n = static_cast<int>(w.size());
    const SortedRow r = Sorted(w, rng);
    // Nested codes: leaf codes non-decreasing along the sorted row.
    std::vector<uint8_t> leaf(n);
    for (int i = 0; i < n; ++i) leaf[i] = static_cast<uint8_t>(static_cast<int64_t>(i) * 256 / n);
    std::vector<double> lut[kMaxBits + 1], lut64[kMaxBits + 1];
    RowLuts luts{};
    std::normal_distribution<double> nd(0, 0.02);
    for (int b = kMinBits; b <= kMaxBits; ++b) {
      lut64[b].resize(1u << b);
      lut[b].resize(1u << b);
      for (int c = 0; c < (1 << b); ++c) {
        lut64[b][c] = nd(rng);
        lut[b][c] = F16ToF32(F32ToF16(static_cast<float>(lut64[b][c])));
      }
      luts.lut[b] = lut[b].data();
      luts.lut64[b] = lut64[b].data();
    }
    double d_ref[kMaxBits + 1] = {}, d64_ref[kMaxBits + 1] = {}, d[kMaxBits + 1] = {}, d64[kMaxBits + 1] = {};
    internal::RowDamageScalar(r.sv.data(), r.sh.data(), leaf.data(), n, luts, d_ref, d64_ref);
    internal::RowDamageAvx2(r.sv.data(), r.sh.data(), leaf.data(), n, luts, d, d64);
    EXPECT_EQ(std::memcmp(d, d_ref, sizeof(d)), 0) << "n " << n;
    EXPECT_EQ(std::memcmp(d64, d64_ref, sizeof(d64)), 0) << "n " << n;
    EXPECT_GT(d_ref[kMinBits], 0.0) << "n " << n;
  }
}

// Bit-by-bit packing (PlaneBitPosition), the layout's definition.
void ReferencePack(const uint8_t* codes, int rows, int cols, uint8_t* planes) {
  const size_t plane_bytes = PlaneBytes(rows, cols), row_bytes = PlaneRowBytes(cols);
  std::memset(planes, 0, kNumPlanes * plane_bytes);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const BitPosition pos = PlaneBitPosition(c);
      for (int p = 0; p < kNumPlanes; ++p) {
        if ((codes[static_cast<size_t>(r) * cols + c] >> (kNumPlanes - 1 - p)) & 1) {
          planes[p * plane_bytes + r * row_bytes + pos.byte] |= static_cast<uint8_t>(1u << pos.bit);
        }
      }
    }
  }
}

TEST(QuantizerRows, Avx2HalfLutIsTheScalarHalfLut) {
  if (!BackendAvailable(kernels::Backend::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  // Centroids at every scale: half subnormals (below 2^-14) and their ties, values exactly
  // between two halves, the largest half and past it (to infinity), signed zeros.
  std::vector<double> mu = {0.0, -0.0, 5.960464477539063e-8, 2.98023223876953125e-8, 8.940696716308594e-8,
                            -6.1e-5, 6.103515625e-5, 1.0009765625 / 2 + 1.0 / 4096, 1.00048828125,
                            1.00146484375, 65504.0, 65519.99, 65520.0, -70000.0, 1e-300, 3.0e38,
                            0.1, -0.333333333333, 1234.5678};
  std::mt19937 rng(13);
  for (double scale : {1e-8, 1e-6, 1e-4, 0.02, 1.0, 300.0, 60000.0}) {
    std::normal_distribution<double> nd(0.0, scale);
    for (int i = 0; i < 64; ++i) mu.push_back(nd(rng));
  }
  while (mu.size() % 8 != 0) mu.push_back(0.5);
  const int n = static_cast<int>(mu.size());
  std::vector<uint16_t> h_ref(n), h_avx(n);
  std::vector<double> b_ref(n), b_avx(n);
  internal::HalfLutScalar(mu.data(), n, h_ref.data(), b_ref.data());
  internal::HalfLutAvx2(mu.data(), n, h_avx.data(), b_avx.data());
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(h_avx[i], h_ref[i]) << "mu " << mu[i];
    EXPECT_EQ(std::memcmp(&b_avx[i], &b_ref[i], sizeof(double)), 0) << "mu " << mu[i];
  }
}

TEST(QuantizerRows, PackedRowsAreTheBitByBitLayout) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> code(0, 255);
  for (int cols : {1, 31, 32, 33, 255, 256, 257, 1000, 2048}) {
    const int rows = 3;
    std::vector<uint8_t> codes(static_cast<size_t>(rows) * cols);
    for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
    std::vector<uint8_t> ref(kNumPlanes * PlaneBytes(rows, cols)), got(ref.size(), 0xA5);
    ReferencePack(codes.data(), rows, cols, ref.data());
    PackCodes(codes.data(), rows, cols, got.data());
    EXPECT_EQ(got, ref) << "cols " << cols;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        ASSERT_EQ(UnpackCode(got.data(), rows, cols, r, c), codes[static_cast<size_t>(r) * cols + c]);
      }
    }
  }
}

// FNV-1a 64 over planes, LUTs and both damage tables.
uint64_t BlockHash(const QuantizedBlock& q) {
  uint64_t h = 1469598103934665603ull;
  auto add = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  add(q.block.planes.data(), q.block.planes.size());
  for (int b = kMinBits; b <= kMaxBits; ++b) add(q.block.luts[b].data(), q.block.luts[b].size() * 2);
  add(q.damage, sizeof(q.damage));
  add(q.damage_fp64, sizeof(q.damage_fp64));
  add(q.split_gain, sizeof(q.split_gain));
  return h;
}

// The bytes of a block of bf16 weights (2048 columns, as an OLMoE expert's gate_up rows) and
// of one of fp32 weights with an odd width are those the comparison-sort implementation gave
// (hashes recorded from it), whichever backend runs.
TEST(QuantizerRows, QuantizeBlockGivesTheEarlierBytes) {
  struct Case {
    int rows, cols;
    bool bf16;
    uint64_t expected;
  };
  for (const Case& k : {Case{24, 2048, true, 0xa9a60af50f57fd18ull}, Case{7, 301, false, 0xdff72ddaa816aad7ull}}) {
    std::mt19937 rng(19);
    std::normal_distribution<float> nd(0.f, 0.02f);
    std::uniform_real_distribution<float> ud(0.05f, 4.f);
    std::vector<float> w(static_cast<size_t>(k.rows) * k.cols), h(k.cols);
    for (auto& v : w) v = k.bf16 ? Bf16ToF32(F32ToBf16(nd(rng))) : nd(rng);
    for (size_t i = 0; i < w.size(); i += 89) w[i] *= 10.f;
    for (auto& v : h) v = ud(rng);
    QuantizeOptions opt;
    opt.threads = 2;
    auto q = QuantizeBlock(w.data(), k.rows, k.cols, h.data(), opt);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(BlockHash(*q), k.expected) << std::hex << "0x" << BlockHash(*q) << " for " << k.rows << "x" << k.cols;
  }
}

}  // namespace
}  // namespace pw::anyprec
