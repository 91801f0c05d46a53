// Any-precision kernels: every backend against the scalar reference, and the reference
// against a plain dequantize-then-multiply on unpacked codes.
//
// Tolerance: |y - y_ref| <= 1e-5 * sum_c |w_rc| |x_tc| + 1e-30 per output (fp32 accumulation
// in a different order than the fp64 reference). Outputs are poisoned with NaN before each run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/anyprec/anyprec.h"
#include "kernels/anyprec/pack.h"
#include "tests/anyprec/random_block.h"

namespace pw::anyprec {
namespace {

using kernels::Backend;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kRelTol = 1e-5;

// sum_c |w_rc| |x_tc| for the tolerance.
std::vector<double> AbsScale(const RandomBlock& rb, int bits, const std::vector<float>& x,
                             int tokens) {
  const int rows = rb.block.rows, cols = rb.block.cols;
  std::vector<double> s(static_cast<size_t>(tokens) * rows, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const int code = rb.codes[static_cast<size_t>(r) * cols + c] >> (8 - bits);
      const double w = std::fabs(F16ToF32(rb.block.luts[bits][(static_cast<size_t>(r) << bits) + code]));
      for (int t = 0; t < tokens; ++t) s[t * rows + r] += w * std::fabs(x[t * cols + c]);
    }
  }
  return s;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::vector<double>& scale, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = kRelTol * scale[i] + 1e-30;
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tol)) {
      if (++bad <= 3) {
        ADD_FAILURE() << what << " index " << i << ": got " << got[i] << " want " << want[i]
                      << " tol " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::vector<Backend> SimdBackends() {
  std::vector<Backend> out;
  for (Backend b : {Backend::kAvx2, Backend::kAvx512}) {
    if (BackendAvailable(b)) {
      out.push_back(b);
    } else {
      std::printf("[ SKIPPED  ] backend %s: this CPU does not support it\n", BackendName(b));
    }
  }
  return out;
}

// The reference itself, checked against dequantize-then-multiply on the unpacked codes.
TEST(AnyPrecScalar, MatchesDequantizedProduct) {
  std::mt19937 rng(1234);
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    RandomBlock rb = MakeRandomBlock(13, 300, rng);
    const int tokens = 3;
    auto x = RandomX(tokens, 300, rng);
    PageLists pl = rb.block.Pages(5);
    std::vector<float> y(tokens * 13, kNaN);
    ASSERT_TRUE(ApGemm(Backend::kScalar, pl.view(), bits, x.data(), tokens, y.data(), {}).ok());
    std::vector<float> want(tokens * 13);
    for (int t = 0; t < tokens; ++t) {
      for (int r = 0; r < 13; ++r) {
        double acc = 0;
        for (int c = 0; c < 300; ++c) {
          const int code = rb.codes[r * 300 + c] >> (8 - bits);
          acc += static_cast<double>(F16ToF32(rb.block.luts[bits][(r << bits) + code])) * x[t * 300 + c];
        }
        want[t * 13 + r] = static_cast<float>(acc);
      }
    }
    ExpectClose(y, want, AbsScale(rb, bits, x, tokens), "scalar b" + std::to_string(bits));
  }
}

TEST(AnyPrecPack, RoundTripsEveryCode) {
  std::mt19937 rng(7);
  RandomBlock rb = MakeRandomBlock(5, 777, rng);
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 777; ++c) {
      ASSERT_EQ(UnpackCode(rb.block.planes.data(), 5, 777, r, c), rb.codes[r * 777 + c]);
    }
  }
}

struct Shape {
  int rows, cols;
};

TEST(AnyPrecBackends, MatchReferenceOnAwkwardShapes) {
  const auto backends = SimdBackends();
  if (backends.empty()) GTEST_SKIP() << "no SIMD backend on this CPU";
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  const Shape shapes[] = {{1, 1}, {37, 50}, {129, 65}, {64, 256}, {33, 513}, {3, 1000}, {2, 4100}};
  const int token_counts[] = {1, 3, 37, 64};
  const int tiles[] = {1, 7, 64};
  for (const Shape& s : shapes) {
    RandomBlock rb = MakeRandomBlock(s.rows, s.cols, rng);
    for (int tokens : token_counts) {
      auto x = RandomX(tokens, s.cols, rng);
      AlignedBuffer ws(ApGemmWorkspaceBytes(s.cols, tokens));
      for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
        const auto scale = AbsScale(rb, bits, x, tokens);
        PageLists ref_pages = rb.block.Pages(s.rows);
        std::vector<float> want(static_cast<size_t>(tokens) * s.rows, kNaN);
        ASSERT_TRUE(ApGemm(Backend::kScalar, ref_pages.view(), bits, x.data(), tokens, want.data(), {}).ok());
        for (int tile : tiles) {
          PageLists pages = rb.block.Pages(tile);
          for (Backend be : backends) {
            std::vector<float> y(want.size(), kNaN);
            Status st = ApGemm(be, pages.view(), bits, x.data(), tokens, y.data(), ws.ws());
            ASSERT_TRUE(st.ok()) << st.ToString();
            ExpectClose(y, want, scale,
                        std::string(BackendName(be)) + " " + std::to_string(s.rows) + "x" +
                            std::to_string(s.cols) + " t" + std::to_string(tokens) + " b" +
                            std::to_string(bits) + " tile" + std::to_string(tile) + " seed " +
                            std::to_string(seed));
          }
        }
      }
    }
  }
}

// Pages scattered in memory (separate allocations, reverse order) and only planes 0..b-1 and
// LUT_b present: the kernels must follow the page list and touch nothing else.
TEST(AnyPrecBackends, FollowPageListAndReadOnlyTopPlanes) {
  std::mt19937 rng(99);
  const int rows = 45, cols = 300, tile = 8, tokens = 2;
  RandomBlock rb = MakeRandomBlock(rows, cols, rng);
  auto x = RandomX(tokens, cols, rng);
  const int num_pages = (rows + tile - 1) / tile;
  const size_t page_bytes = tile * PlaneRowBytes(cols);
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    std::vector<std::unique_ptr<uint8_t[]>> storage;
    std::vector<const uint8_t*> ptrs(kNumPlanes * num_pages, nullptr);
    BlockView v;
    v.rows = rows;
    v.cols = cols;
    v.tile_rows = tile;
    for (int p = 0; p < bits; ++p) {
      for (int i = num_pages - 1; i >= 0; --i) {
        const size_t n = std::min(page_bytes, PlaneBytes(rows, cols) - i * page_bytes);
        storage.emplace_back(new uint8_t[n]);
        std::memcpy(storage.back().get(), rb.block.Plane(p) + i * page_bytes, n);
        ptrs[p * num_pages + i] = storage.back().get();
      }
      v.planes[p] = ptrs.data() + p * num_pages;
    }
    v.luts[bits] = rb.block.luts[bits].data();
    PageLists ref_pages = rb.block.Pages(rows);
    std::vector<float> want(tokens * rows, kNaN);
    ASSERT_TRUE(ApGemm(Backend::kScalar, ref_pages.view(), bits, x.data(), tokens, want.data(), {}).ok());
    const auto scale = AbsScale(rb, bits, x, tokens);
    AlignedBuffer ws(ApGemmWorkspaceBytes(cols, tokens));
    for (Backend be : {Backend::kScalar, Backend::kAvx2, Backend::kAvx512}) {
      if (!BackendAvailable(be)) continue;
      std::vector<float> y(want.size(), kNaN);
      ASSERT_TRUE(ApGemm(be, v, bits, x.data(), tokens, y.data(), ws.ws()).ok());
      ExpectClose(y, want, scale, std::string("paged ") + BackendName(be) + " b" + std::to_string(bits));
    }
  }
}

TEST(AnyPrecBackends, RowRangeWritesOnlyItsRows) {
  std::mt19937 rng(5);
  const int rows = 40, cols = 70, tokens = 3;
  RandomBlock rb = MakeRandomBlock(rows, cols, rng);
  auto x = RandomX(tokens, cols, rng);
  PageLists pages = rb.block.Pages(16);
  AlignedBuffer ws(ApGemmWorkspaceBytes(cols, tokens));
  for (Backend be : {Backend::kScalar, Backend::kAvx2, Backend::kAvx512}) {
    if (!BackendAvailable(be)) continue;
    std::vector<float> y(tokens * rows, kNaN);
    ASSERT_TRUE(ApGemmRows(be, pages.view(), 4, x.data(), tokens, y.data(), 11, 29, ws.ws()).ok());
    for (int t = 0; t < tokens; ++t) {
      for (int r = 0; r < rows; ++r) {
        EXPECT_EQ(std::isnan(y[t * rows + r]), r < 11 || r >= 29) << BackendName(be) << " t" << t << " r" << r;
      }
    }
  }
}

TEST(AnyPrecApi, RejectsBadArguments) {
  std::mt19937 rng(3);
  RandomBlock rb = MakeRandomBlock(4, 40, rng);
  PageLists pages = rb.block.Pages(4);
  auto x = RandomX(65, 40, rng);
  std::vector<float> y(65 * 4);
  AlignedBuffer ws(ApGemmWorkspaceBytes(40, 64));
  EXPECT_FALSE(ApGemm(Backend::kScalar, pages.view(), 2, x.data(), 1, y.data(), ws.ws()).ok());
  EXPECT_FALSE(ApGemm(Backend::kScalar, pages.view(), 9, x.data(), 1, y.data(), ws.ws()).ok());
  EXPECT_FALSE(ApGemm(Backend::kScalar, pages.view(), 4, x.data(), 0, y.data(), ws.ws()).ok());
  EXPECT_FALSE(ApGemm(Backend::kScalar, pages.view(), 4, x.data(), 65, y.data(), ws.ws()).ok());
  EXPECT_FALSE(ApGemmRows(Backend::kScalar, pages.view(), 4, x.data(), 1, y.data(), 2, 5, ws.ws()).ok());
  BlockView missing = pages.view();
  missing.planes[5] = nullptr;
  EXPECT_TRUE(ApGemm(Backend::kScalar, missing, 5, x.data(), 1, y.data(), ws.ws()).ok());
  Status st = ApGemm(Backend::kScalar, missing, 6, x.data(), 1, y.data(), ws.ws());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("plane 5"), std::string::npos) << st.message();
  BlockView no_lut = pages.view();
  no_lut.luts[7] = nullptr;
  EXPECT_FALSE(ApGemm(Backend::kScalar, no_lut, 7, x.data(), 1, y.data(), ws.ws()).ok());
  if (BackendAvailable(Backend::kAvx2)) {
    Workspace small{ws.ptr, 16};
    EXPECT_FALSE(ApGemm(Backend::kAvx2, pages.view(), 4, x.data(), 1, y.data(), small).ok());
    Workspace misaligned{ws.ptr + 4, ws.size - 64};
    EXPECT_FALSE(ApGemm(Backend::kAvx2, pages.view(), 4, x.data(), 1, y.data(), misaligned).ok());
  }
}

// ---- Fused MoE ----

float Silu(float g) { return g / (1.f + std::exp(-g)); }

std::unique_ptr<PageLists> MakePages(const PackedBlock& b, int tile) {
  const uint8_t* bases[kNumPlanes];
  for (int p = 0; p < kNumPlanes; ++p) bases[p] = b.Plane(p);
  const uint16_t* luts[kMaxBits + 1] = {};
  for (int w = kMinBits; w <= kMaxBits; ++w) luts[w] = b.luts[w].data();
  return std::make_unique<PageLists>(bases, luts, b.rows, b.cols, tile);
}

TEST(AnyPrecMoe, MixedWidthsMatchUnfusedReference) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  const int hidden = 70, ffn = 45, num_experts = 6;
  for (int tokens : {1, 3, 37, 70}) {
    std::vector<RandomBlock> gate_up, down;
    std::vector<std::unique_ptr<PageLists>> pages;
    std::vector<MoeExpert> experts(num_experts);
    std::uniform_int_distribution<int> bits_dist(kMinBits, kMaxBits);
    for (int e = 0; e < num_experts; ++e) {
      gate_up.push_back(MakeRandomBlock(2 * ffn, hidden, rng));
      down.push_back(MakeRandomBlock(hidden, ffn, rng));
    }
    for (int e = 0; e < num_experts; ++e) {
      pages.push_back(MakePages(gate_up[e].block, 16));
      experts[e].gate_up = pages.back()->view();
      pages.push_back(MakePages(down[e].block, 9));
      experts[e].down = pages.back()->view();
      experts[e].gate_up_bits = bits_dist(rng);
      experts[e].down_bits = bits_dist(rng);
    }
    // Top-2 of 5 experts per token (expert 5 never used), random gate weights.
    std::vector<MoeAssignment> assigns;
    std::uniform_int_distribution<int> e_dist(0, 4);
    std::uniform_real_distribution<float> w_dist(0.05f, 1.f);
    for (int t = 0; t < tokens; ++t) {
      const int e1 = e_dist(rng);
      const int e2 = (e1 + 1 + e_dist(rng) % 4) % 5;
      assigns.push_back({t, e1, w_dist(rng)});
      assigns.push_back({t, e2, w_dist(rng)});
    }
    // The unused expert's views may be garbage: they must not be read.
    experts[5].gate_up = BlockView{};
    auto x = RandomX(tokens, hidden, rng);
    // Unfused reference: per assignment, scalar gemv, SiLU*up, scalar gemv, weighted sum.
    std::vector<double> want(static_cast<size_t>(tokens) * hidden, 0.0);
    std::vector<double> scale(want.size(), 0.0);
    for (const auto& a : assigns) {
      const MoeExpert& ex = experts[a.expert];
      std::vector<float> h(2 * ffn), act(ffn), yd(hidden);
      ASSERT_TRUE(ApGemm(Backend::kScalar, ex.gate_up, ex.gate_up_bits, x.data() + a.token * hidden, 1, h.data(), {}).ok());
      for (int j = 0; j < ffn; ++j) act[j] = Silu(h[j]) * h[ffn + j];
      ASSERT_TRUE(ApGemm(Backend::kScalar, ex.down, ex.down_bits, act.data(), 1, yd.data(), {}).ok());
      const auto s = AbsScale(down[a.expert], ex.down_bits, act, 1);
      for (int j = 0; j < hidden; ++j) {
        want[a.token * hidden + j] += a.weight * yd[j];
        scale[a.token * hidden + j] += a.weight * (s[j] + std::fabs(yd[j]));
      }
    }
    for (Backend be : {Backend::kScalar, Backend::kAvx2, Backend::kAvx512}) {
      if (!BackendAvailable(be)) continue;
      AlignedBuffer ws(MoeWorkspaceBytes(tokens, static_cast<int>(assigns.size()), num_experts, hidden, ffn));
      std::vector<float> out(want.size(), kNaN);
      Status st = MoeForward(be, experts.data(), num_experts, assigns.data(), static_cast<int>(assigns.size()),
                             x.data(), tokens, hidden, ffn, out.data(), ws.ws());
      ASSERT_TRUE(st.ok()) << st.ToString();
      int bad = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        // Looser than the GEMM tolerance: the gate_up error passes through SiLU*up into down.
        if (!(std::fabs(out[i] - want[i]) <= 1e-4 * scale[i] + 1e-6)) {
          if (++bad <= 3) ADD_FAILURE() << BackendName(be) << " t" << tokens << " i" << i << " got " << out[i] << " want " << want[i];
        }
      }
      EXPECT_EQ(bad, 0) << "seed " << seed;
    }
  }
}

TEST(AnyPrecMoe, RejectsBadAssignmentsBeforeWriting) {
  std::mt19937 rng(11);
  const int hidden = 20, ffn = 12;
  RandomBlock gu = MakeRandomBlock(2 * ffn, hidden, rng);
  RandomBlock dn = MakeRandomBlock(hidden, ffn, rng);
  PageLists gp = gu.block.Pages(8), dp = dn.block.Pages(8);
  MoeExpert ex{gp.view(), 4, dp.view(), 3};
  auto x = RandomX(2, hidden, rng);
  std::vector<float> out(2 * hidden, kNaN);
  AlignedBuffer ws(MoeWorkspaceBytes(2, 2, 1, hidden, ffn));
  MoeAssignment bad_token[] = {{0, 0, 1.f}, {2, 0, 1.f}};
  EXPECT_FALSE(MoeForward(Backend::kScalar, &ex, 1, bad_token, 2, x.data(), 2, hidden, ffn, out.data(), ws.ws()).ok());
  MoeAssignment bad_expert[] = {{0, 1, 1.f}};
  EXPECT_FALSE(MoeForward(Backend::kScalar, &ex, 1, bad_expert, 1, x.data(), 2, hidden, ffn, out.data(), ws.ws()).ok());
  MoeExpert wrong_shape{dp.view(), 4, dp.view(), 3};
  MoeAssignment ok_assign[] = {{1, 0, 1.f}};
  Status st = MoeForward(Backend::kScalar, &wrong_shape, 1, ok_assign, 1, x.data(), 2, hidden, ffn, out.data(), ws.ws());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("gate_up"), std::string::npos) << st.message();
  for (float v : out) EXPECT_TRUE(std::isnan(v));
  ASSERT_TRUE(MoeForward(Backend::kScalar, &ex, 1, ok_assign, 1, x.data(), 2, hidden, ffn, out.data(), ws.ws()).ok());
  for (int j = 0; j < hidden; ++j) EXPECT_EQ(out[j], 0.f);  // token 0 has no assignment
}

}  // namespace
}  // namespace pw::anyprec
