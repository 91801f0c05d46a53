// Every kernel op on every backend this machine has, against the scalar reference: one table of
// ops, one test per (op, backend) pair (OpBackend/<op>_<backend>). A backend the CPU lacks is
// listed as skipped. The per-family tests (dense_test, anyprec_kernels_test, q8_kernels_test)
// go deeper on each family's edge cases; this table is where a new op or a new backend is
// added so that nothing runs unchecked.
//
// Inputs are random (fixed seed) with awkward sizes; outputs are poisoned with NaN first.
// Tolerances: products |y - ref| <= 1e-5 * sum |x w| + 1e-6 (fp32 sums in another order);
// the int8 fast path 1e-4 * sum |x w| + 1e-5 (the integer sums are exact, the group sums fp32);
// norms, softmax, SiLU*mul, paged attention 2e-5 relative to the magnitude of the result.
// The scalar paged attention is itself checked against attention computed in double over the
// same K and V laid out contiguously.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <ostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/anyprec/anyprec.h"
#include "kernels/anyprec/pack.h"
#include "kernels/anyprec/q8.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/paged_attention.h"
#include "tests/anyprec/random_block.h"

namespace pw {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> Random(std::mt19937& rng, size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> RandomBf16(std::mt19937& rng, size_t n) {
  std::vector<uint16_t> v(n);
  const auto f = Random(rng, n);
  for (size_t i = 0; i < n; ++i) v[i] = cpu::ToBf16Bits(f[i]);
  return v;
}

// |got - want| <= tol for every entry, naming the first that is not.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << ": entry " << i << " not written";
    ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), tol[i])
        << what << ": entry " << i << " is " << got[i] << ", reference " << want[i];
  }
}

// ---- dense ops over a DenseKernels table --------------------------------------------------

using DenseCheck = std::function<void(const kernels::DenseKernels& k, const kernels::DenseKernels& ref,
                                      std::mt19937& rng)>;

void MatmulBf16(const kernels::DenseKernels& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  for (size_t T : {1, 3, 5, 17}) {
    for (size_t K : {1, 33, 257}) {
      const size_t N = 19;
      const auto x = Random(rng, T * K);
      const auto w = RandomBf16(rng, N * K);
      std::vector<float> y(T * N, kNaN), want(T * N, kNaN);
      std::vector<double> tol(T * N);
      k.matmul_bf16(x.data(), K, T, w.data(), K, 0, N, y.data(), N);
      ref.matmul_bf16(x.data(), K, T, w.data(), K, 0, N, want.data(), N);
      for (size_t t = 0; t < T; ++t) {
        for (size_t n = 0; n < N; ++n) {
          double mag = 0;
          for (size_t c = 0; c < K; ++c) mag += std::fabs(x[t * K + c] * cpu::Bf16Bits(w[n * K + c]));
          tol[t * N + n] = 1e-5 * mag + 1e-6;
        }
      }
      ExpectClose(y, want, tol, "matmul_bf16 T=" + std::to_string(T) + " K=" + std::to_string(K));
    }
  }
}

void MatmulF32(const kernels::DenseKernels& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  const size_t T = 5, K = 70, N = 21;
  const auto x = Random(rng, T * K), w = Random(rng, N * K);
  std::vector<float> y(T * N, kNaN), want(T * N, kNaN);
  std::vector<double> tol(T * N);
  k.matmul_f32(x.data(), K, T, w.data(), K, 0, N, y.data(), N);
  ref.matmul_f32(x.data(), K, T, w.data(), K, 0, N, want.data(), N);
  for (size_t t = 0; t < T; ++t) {
    for (size_t n = 0; n < N; ++n) {
      double mag = 0;
      for (size_t c = 0; c < K; ++c) mag += std::fabs(x[t * K + c] * w[n * K + c]);
      tol[t * N + n] = 1e-5 * mag + 1e-6;
    }
  }
  ExpectClose(y, want, tol, "matmul_f32");
}

void RelativeTol(const std::vector<float>& want, double rel, std::vector<double>* tol) {
  tol->resize(want.size());
  for (size_t i = 0; i < want.size(); ++i) (*tol)[i] = rel * (std::fabs(want[i]) + 1e-3);
}

void RmsNorm(const kernels::DenseKernels& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  for (size_t dim : {1, 7, 64, 1000}) {
    const auto x = Random(rng, dim), w = Random(rng, dim);
    std::vector<float> y(dim, kNaN), want(dim, kNaN);
    std::vector<double> tol;
    k.rms_norm(x.data(), w.data(), dim, 1e-6f, y.data());
    ref.rms_norm(x.data(), w.data(), dim, 1e-6f, want.data());
    RelativeTol(want, 2e-5, &tol);
    ExpectClose(y, want, tol, "rms_norm dim=" + std::to_string(dim));
  }
}

void Softmax(const kernels::DenseKernels& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  for (size_t n : {1, 9, 100, 1025}) {
    auto y = Random(rng, n, -8.f, 8.f);
    auto want = y;
    std::vector<double> tol;
    k.softmax(y.data(), n);
    ref.softmax(want.data(), n);
    RelativeTol(want, 2e-5, &tol);
    ExpectClose(y, want, tol, "softmax n=" + std::to_string(n));
  }
}

void SiluMul(const kernels::DenseKernels& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  const size_t n = 333;
  const auto g = Random(rng, n, -6.f, 6.f), u = Random(rng, n);
  std::vector<float> y(n, kNaN), want(n, kNaN);
  std::vector<double> tol;
  k.silu_mul(g.data(), u.data(), n, y.data());
  ref.silu_mul(g.data(), u.data(), n, want.data());
  RelativeTol(want, 2e-5, &tol);
  ExpectClose(y, want, tol, "silu_mul");
}

void DotAxpy(const kernels::DenseKernels& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  for (size_t n : {1, 15, 16, 129}) {
    const auto a = Random(rng, n), b = Random(rng, n);
    double mag = 0;
    for (size_t i = 0; i < n; ++i) mag += std::fabs(a[i] * b[i]);
    ExpectClose({k.dot(a.data(), b.data(), n)}, {ref.dot(a.data(), b.data(), n)},
                {1e-5 * mag + 1e-6}, "dot n=" + std::to_string(n));
    auto y = b, want = b;
    k.axpy(0.37f, a.data(), n, y.data());
    ref.axpy(0.37f, a.data(), n, want.data());
    std::vector<double> tol;
    RelativeTol(want, 1e-6, &tol);
    ExpectClose(y, want, tol, "axpy n=" + std::to_string(n));
  }
}

// A small paged KV cache: `blocks` pages of one layer in shuffled order, two sequences.
struct PagedCase {
  int kv_heads = 2, heads = 4, D = 24, bs = 5;
  cpu::KvElement element;
  std::vector<std::vector<uint8_t>> page_bytes;
  std::vector<const uint8_t*> pages;
  std::vector<std::vector<int32_t>> tables;  // per sequence
  std::vector<int32_t> positions;            // per query token
  std::vector<const int32_t*> token_tables;
  std::vector<float> q;
  // Contiguous copy for the double reference: [seq][c][h][pos][d], as the kernel reads it.
  std::vector<std::vector<float>> flat;

  PagedCase(cpu::KvElement e, std::mt19937& rng) : element(e) {
    const int seq_len[2] = {13, 7};
    const int num_blocks = 6;
    const size_t elem = e == cpu::KvElement::kF32 ? 4 : 2;
    const size_t per_page = 2ull * kv_heads * bs * D;
    page_bytes.assign(num_blocks, std::vector<uint8_t>(per_page * elem));
    for (auto& p : page_bytes) pages.push_back(p.data());
    tables = {{4, 1, 5}, {0, 3}};  // not in order: the kernel follows the table
    flat.resize(2);
    for (int s = 0; s < 2; ++s) {
      flat[s].assign(2ull * kv_heads * seq_len[s] * D, 0.f);
      for (int c = 0; c < 2; ++c)
        for (int h = 0; h < kv_heads; ++h)
          for (int p = 0; p < seq_len[s]; ++p)
            for (int d = 0; d < D; ++d) {
              float v = Random(rng, 1)[0];
              if (e == cpu::KvElement::kBf16) v = cpu::Bf16Bits(cpu::ToBf16Bits(v));
              flat[s][((static_cast<size_t>(c) * kv_heads + h) * seq_len[s] + p) * D + d] = v;
              uint8_t* page = page_bytes[tables[s][p / bs]].data();
              const size_t at = ((static_cast<size_t>(c) * kv_heads + h) * bs + p % bs) * D + d;
              if (e == cpu::KvElement::kF32) {
                reinterpret_cast<float*>(page)[at] = v;
              } else {
                reinterpret_cast<uint16_t*>(page)[at] = cpu::ToBf16Bits(v);
              }
            }
    }
    // Query tokens: a prompt chunk of sequence 0 (positions 9..12) and a decode token of 1.
    for (int p = 9; p < 13; ++p) positions.push_back(p);
    positions.push_back(6);
    for (size_t t = 0; t < positions.size(); ++t) {
      token_tables.push_back(tables[t < 4 ? 0 : 1].data());
    }
    q = Random(rng, positions.size() * heads * D);
  }
  cpu::PagedKvView View() const {
    return {pages.data(), 1, element, kv_heads, bs, D};
  }
  cpu::AttentionQueries Queries() const {
    return {q.data(), positions.size(), heads, positions.data(), token_tables.data(),
            1.f / std::sqrt(static_cast<float>(D))};
  }
  std::vector<float> Run(const kernels::DenseKernels& k) const {
    const auto qs = Queries();
    const auto kv = View();
    std::vector<float> out(qs.T * heads * D, kNaN);
    std::vector<float> scores(cpu::PagedAttentionScoreFloats(12));
    std::vector<float> widen(cpu::PagedAttentionWidenFloats(kv) + 1);
    // Two calls over halves of the jobs, as two threads would split them.
    const size_t jobs = qs.T * heads;
    cpu::PagedAttention(k, kv, qs, 0, jobs / 2, scores.data(), widen.data(), out.data());
    cpu::PagedAttention(k, kv, qs, jobs / 2, jobs, scores.data(), widen.data(), out.data());
    return out;
  }
  std::vector<float> Exact() const {
    std::vector<float> out(positions.size() * heads * D);
    const int seq_len[2] = {13, 7};
    for (size_t t = 0; t < positions.size(); ++t) {
      const int s = t < 4 ? 0 : 1, n = positions[t] + 1;
      for (int h = 0; h < heads; ++h) {
        const int kvh = h / (heads / kv_heads);
        auto at = [&](int c, int p, int d) {
          return flat[s][((static_cast<size_t>(c) * kv_heads + kvh) * seq_len[s] + p) * D + d];
        };
        std::vector<double> sc(n);
        double mx = -1e300, sum = 0;
        for (int p = 0; p < n; ++p) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += static_cast<double>(q[(t * heads + h) * D + d]) * at(0, p, d);
          sc[p] = dot / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, sc[p]);
        }
        for (int p = 0; p < n; ++p) sum += (sc[p] = std::exp(sc[p] - mx));
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (int p = 0; p < n; ++p) o += sc[p] / sum * at(1, p, d);
          out[(t * heads + h) * D + d] = static_cast<float>(o);
        }
      }
    }
    return out;
  }
};

DenseCheck PagedAttentionCheck(cpu::KvElement e) {
  return [e](const kernels::DenseKernels& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
    const PagedCase c(e, rng);
    const auto want = c.Run(ref);
    std::vector<double> tol(want.size(), 2e-5);
    ExpectClose(want, c.Exact(), tol, "paged_attention reference vs double");
    ExpectClose(c.Run(k), want, tol, "paged_attention");
  };
}

// ---- any-precision ops ---------------------------------------------------------------------

using anyprec::MakeRandomBlock;
using anyprec::RandomBlock;
using anyprec::RandomX;

// sum_c |x w| per (token, row) of the exact product at `bits`, for tolerances.
std::vector<double> Magnitudes(const RandomBlock& rb, int bits, const std::vector<float>& x,
                               int tokens) {
  const int rows = rb.block.rows, cols = rb.block.cols;
  std::vector<double> mag(static_cast<size_t>(tokens) * rows);
  for (int t = 0; t < tokens; ++t)
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const int code = rb.codes[static_cast<size_t>(r) * cols + c] >> (8 - bits);
        mag[t * rows + r] +=
            std::fabs(x[t * cols + c] * F16ToF32(rb.block.luts[bits][(r << bits) + code]));
      }
  return mag;
}

void ApGemmExact(kernels::Backend b, std::mt19937& rng) {
  const int rows = 21, cols = 300, tokens = 3;
  const RandomBlock rb = MakeRandomBlock(rows, cols, rng);
  const auto x = RandomX(tokens, cols, rng);
  anyprec::PageLists pages = rb.block.Pages(8);
  anyprec::AlignedBuffer ws(anyprec::ApGemmWorkspaceBytes(cols, tokens));
  for (int bits = anyprec::kMinBits; bits <= anyprec::kMaxBits; ++bits) {
    std::vector<float> y(tokens * rows, kNaN), want(tokens * rows, kNaN);
    ASSERT_TRUE(anyprec::ApGemm(b, pages.view(), bits, x.data(), tokens, y.data(), ws.ws()).ok());
    ASSERT_TRUE(anyprec::ApGemm(kernels::Backend::kScalar, pages.view(), bits, x.data(), tokens,
                                want.data(), ws.ws()).ok());
    auto tol = Magnitudes(rb, bits, x, tokens);
    for (double& t : tol) t = 1e-5 * t + 1e-6;
    ExpectClose(y, want, tol, "ap_gemm bits=" + std::to_string(bits));
  }
}

void ApGemmFast(kernels::Backend b, std::mt19937& rng) {
  for (int tokens : {1, 12}) {
    const int rows = 19, cols = 520;
    const RandomBlock rb = MakeRandomBlock(rows, cols, rng);
    const auto x = RandomX(tokens, cols, rng);
    anyprec::PageLists pages = rb.block.Pages(7);
    anyprec::AlignedBuffer abuf(anyprec::Q8ActsBytes(tokens, cols));
    anyprec::Q8Acts acts;
    ASSERT_TRUE(anyprec::QuantizeActs(x.data(), cols, tokens, cols, abuf.ws(), &acts).ok());
    for (int bits = anyprec::kMinBits; bits <= anyprec::kMaxBits; ++bits) {
      std::vector<int8_t> values(anyprec::Q8LutValueBytes(rows, bits));
      std::vector<float> scales(rows);
      ASSERT_TRUE(anyprec::QuantizeLut(rb.block.luts[bits].data(), rows, bits, values.data(),
                                       scales.data()).ok());
      const anyprec::Q8Lut lut{values.data(), scales.data()};
      std::vector<float> y(tokens * rows, kNaN), want(tokens * rows, kNaN);
      ASSERT_TRUE(anyprec::ApGemmQ8Rows(b, pages.view(), bits, lut, acts, y.data(), rows, 0, rows).ok());
      ASSERT_TRUE(anyprec::ApGemmQ8Rows(kernels::Backend::kScalar, pages.view(), bits, lut, acts,
                                        want.data(), rows, 0, rows).ok());
      auto tol = Magnitudes(rb, bits, x, tokens);
      for (double& t : tol) t = 1e-4 * t + 1e-5;
      ExpectClose(y, want, tol,
                  "ap_gemm_q8 bits=" + std::to_string(bits) + " tokens=" + std::to_string(tokens));
    }
  }
}

void DenseQ8(kernels::Backend b, std::mt19937& rng) {
  const int rows = 23, cols = 300, tokens = 4;
  const auto w = RandomBf16(rng, static_cast<size_t>(rows) * cols);
  std::vector<int8_t> values(anyprec::Q8MatrixValueBytes(rows, cols));
  std::vector<float> scales(rows);
  ASSERT_TRUE(anyprec::QuantizeBf16Rows(w.data(), rows, cols, values.data(), scales.data()).ok());
  const anyprec::Q8Matrix m{rows, cols, values.data(), scales.data()};
  const auto x = RandomX(tokens, cols, rng);
  anyprec::AlignedBuffer abuf(anyprec::Q8ActsBytes(tokens, cols));
  anyprec::Q8Acts acts;
  ASSERT_TRUE(anyprec::QuantizeActs(x.data(), cols, tokens, cols, abuf.ws(), &acts).ok());
  std::vector<float> y(tokens * rows, kNaN), want(tokens * rows, kNaN);
  ASSERT_TRUE(anyprec::DenseQ8Rows(b, m, acts, y.data(), rows, 0, rows).ok());
  ASSERT_TRUE(
      anyprec::DenseQ8Rows(kernels::Backend::kScalar, m, acts, want.data(), rows, 0, rows).ok());
  std::vector<double> tol(want.size());
  for (int t = 0; t < tokens; ++t)
    for (int r = 0; r < rows; ++r) {
      double mag = 0;
      for (int c = 0; c < cols; ++c) mag += std::fabs(x[t * cols + c] * cpu::Bf16Bits(w[r * cols + c]));
      tol[t * rows + r] = 1e-4 * mag + 1e-5;
    }
  ExpectClose(y, want, tol, "dense_q8");
}

// ---- the table -----------------------------------------------------------------------------

struct OpCase {
  std::string name;  // <op>_<backend>
  std::function<void(std::mt19937&)> run;
};

std::vector<OpCase> AllCases() {
  std::vector<OpCase> out;
  const std::vector<std::pair<const char*, DenseCheck>> dense = {
      {"matmul_bf16", MatmulBf16},   {"matmul_f32", MatmulF32},
      {"rms_norm", RmsNorm},         {"softmax", Softmax},
      {"silu_mul", SiluMul},         {"dot_axpy", DotAxpy},
      {"paged_attention_f32", PagedAttentionCheck(cpu::KvElement::kF32)},
      {"paged_attention_bf16", PagedAttentionCheck(cpu::KvElement::kBf16)},
  };
  for (kernels::Backend isa : {kernels::Backend::kScalar, kernels::Backend::kAvx2, kernels::Backend::kAvx512, kernels::Backend::kAmx}) {
    if (!kernels::BackendSupported(isa)) {
      std::printf("[ SKIPPED  ] dense backend %s: this CPU does not support it\n", kernels::BackendName(isa));
      continue;
    }
    // Each backend's default, batch-invariant and bf16-activation tables are distinct code.
    struct Variant {
      const char* suffix;
      bool invariant, bf16_acts;
    };
    for (const Variant v : {Variant{"", false, false}, Variant{"_invariant", true, false},
                            Variant{"_bf16acts", false, true}}) {
      const kernels::DenseKernels* k = &cpu::KernelsFor(isa, v.invariant, v.bf16_acts);
      const kernels::DenseKernels* ref = &cpu::KernelsFor(kernels::Backend::kScalar, false, v.bf16_acts);
      if (v.suffix[0] != '\0' && k == &cpu::KernelsFor(isa)) continue;  // same table
      for (const auto& [op, check] : dense) {
        out.push_back({std::string(op) + "_" + kernels::BackendName(isa) + v.suffix,
                       [k, ref, check](std::mt19937& rng) { check(*k, *ref, rng); }});
      }
    }
  }
  for (kernels::Backend b : {kernels::Backend::kScalar, kernels::Backend::kAvx2,
                             kernels::Backend::kAvx512, kernels::Backend::kAmx}) {
    if (anyprec::BackendAvailable(b)) {
      out.push_back({std::string("ap_gemm_") + kernels::BackendName(b),
                     [b](std::mt19937& rng) { ApGemmExact(b, rng); }});
    }
    if (anyprec::Q8BackendAvailable(b)) {
      out.push_back({std::string("ap_gemm_q8_") + kernels::BackendName(b),
                     [b](std::mt19937& rng) { ApGemmFast(b, rng); }});
      out.push_back({std::string("dense_q8_") + kernels::BackendName(b),
                     [b](std::mt19937& rng) { DenseQ8(b, rng); }});
    }
  }
  return out;
}

// gtest prints a parameter in the test's listing: the case's name, not its bytes.
void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

class OpBackend : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpBackend, MatchesTheScalarReference) {
  std::mt19937 rng(20261204);
  GetParam().run(rng);
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpBackend, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; });

}  // namespace
}  // namespace pw
