// Every kernel op on every backend this machine has, against the scalar reference: one table of
// ops, one test per (op, backend) pair (OpBackend/<op>_<backend>), over every backend of
// kernels::Backend (kernels/backend.h). A backend the machine lacks is listed as skipped, with
// the reason. The per-family tests (dense_test, anyprec_kernels_test, q8_kernels_test) go deeper
// on each family's edge cases; this table is where a new op or a new backend is added so that
// nothing runs unchecked.
//
// - The dense op table (kernels/dense_ops.h): its cases are tests/kernels_cpu/dense_op_cases.h,
//   shared with tests/gpu/op_backend_cuda_test.cc, which runs them on kCuda (device memory) in a
//   CUDA build on a machine with a GPU. This binary links no CUDA, so it runs them on the CPU
//   backends (each backend's default, batch-invariant and bf16-activation tables) and lists the
//   cuda cases as skipped.
// - CPU only: paged attention (it runs a host table's ops over host pages), the any-precision
//   kernels (ap_gemm) and the int8 fast path (ap_gemm_q8, dense_q8).
//
// Inputs are random (fixed seed) with awkward sizes; outputs are poisoned with NaN first.
// Tolerances: the dense ops' are in dense_op_cases.h; the int8 fast path 1e-4 * sum |x w| + 1e-5
// (the integer sums are exact, the group sums fp32); the exact any-precision path
// 1e-5 * sum |x w| + 1e-6; paged attention 2e-5. The scalar paged attention is itself checked
// against attention computed in double over the same K and V laid out contiguously.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/anyprec/anyprec.h"
#include "kernels/anyprec/pack.h"
#include "kernels/anyprec/q8.h"
#include "kernels/backend.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/dense_ops.h"
#include "tests/anyprec/random_block.h"
#include "tests/kernels_cpu/dense_op_cases.h"

namespace pw {
namespace {

using op_cases::ExpectClose;
using op_cases::kNaN;
using op_cases::Random;
using op_cases::RandomBf16;

// ---- paged attention (CPU tables only) ----------------------------------------------------

// A check of one CPU table against the scalar one, both on host memory.
using TableCheck = std::function<void(const kernels::DenseKernels& k,
                                      const kernels::DenseKernels& ref, std::mt19937& rng)>;

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

  PagedCase(cpu::KvElement e, int head_dim, std::mt19937& rng) : D(head_dim), element(e) {
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
  // The jobs in calls of `per_call` jobs each; 0: two calls over halves, as two threads would
  // split them (1: no tile holds more than one query).
  std::vector<float> Run(const kernels::DenseKernels& k, size_t per_call = 0) const {
    const auto qs = Queries();
    const auto kv = View();
    std::vector<float> out(qs.T * heads * D, kNaN);
    std::vector<float> scores(cpu::PagedAttentionScoreFloats(12));
    std::vector<float> widen(cpu::PagedAttentionWidenFloats(kv) + 1);
    const size_t jobs = qs.T * heads;
    if (per_call == 0) per_call = (jobs + 1) / 2;
    for (size_t j = 0; j < jobs; j += per_call) {
      cpu::PagedAttention(k, kv, qs, j, std::min(jobs, j + per_call), scores.data(), widen.data(), out.data());
    }
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

// head_dim 24 runs one dot and one axpy per pair on every table; 64 (a multiple of 16) the
// tiled inner products of the AVX2 and AVX-512 tables (kernels/cpu/attention_tiles.h).
TableCheck PagedAttentionCheck(cpu::KvElement e, int head_dim) {
  return [e, head_dim](const kernels::DenseKernels& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
    const PagedCase c(e, head_dim, rng);
    const auto want = c.Run(ref);
    std::vector<double> tol(want.size(), 2e-5);
    ExpectClose(want, c.Exact(), tol, "paged_attention reference vs double");
    const auto got = c.Run(k);
    ExpectClose(got, want, tol, "paged_attention");
    // The prompt chunk's four queries run as one tile per head in Run, one by one here: the
    // same arithmetic, bit for bit.
    const auto alone = c.Run(k, 1);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], alone[i]) << "paged_attention tile, element " << i;
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

// The cases of a backend the machine lacks: listed, each skipped with `reason`.
void AddSkipped(kernels::Backend b, const std::vector<std::string>& ops, const std::string& reason,
                std::vector<OpCase>* out) {
  const std::string why = std::string("backend ") + kernels::BackendName(b) + ": " + reason;
  for (const auto& op : ops) {
    out->push_back(
        {op + "_" + kernels::BackendName(b), [why](std::mt19937&) { GTEST_SKIP() << why; }});
  }
}

std::vector<OpCase> AllCases() {
  std::vector<OpCase> out;
  static op_cases::HostMemory host;  // the CPU backends' memory
  const std::vector<op_cases::DenseOp> dense = op_cases::DenseOps();
  const std::vector<std::pair<const char*, TableCheck>> cpu_only = {
      {"paged_attention_f32", PagedAttentionCheck(cpu::KvElement::kF32, 24)},
      {"paged_attention_bf16", PagedAttentionCheck(cpu::KvElement::kBf16, 24)},
      {"paged_attention_f32_d64", PagedAttentionCheck(cpu::KvElement::kF32, 64)},
      {"paged_attention_bf16_d64", PagedAttentionCheck(cpu::KvElement::kBf16, 64)},
  };
  std::vector<std::string> dense_names, cpu_names;
  for (const auto& op : dense) dense_names.push_back(op.name);
  cpu_names = dense_names;
  for (const auto& [op, check] : cpu_only) cpu_names.push_back(op);

  for (kernels::Backend b : kernels::kAllBackends) {
    if (!kernels::IsCpuBackend(b)) {
      AddSkipped(b, dense_names,
                 "this binary links no CUDA kernels; tests/gpu/op_backend_cuda_test runs these "
                 "cases (a PW_CUDA=ON build, on a machine with a GPU)",
                 &out);
      continue;
    }
    if (!kernels::BackendSupported(b)) {
      AddSkipped(b, cpu_names, "this CPU does not support it", &out);
      continue;
    }
    // Each backend's default, batch-invariant and bf16-activation tables are distinct code.
    struct Variant {
      const char* suffix;
      bool invariant, bf16_acts;
    };
    for (const Variant v : {Variant{"", false, false}, Variant{"_invariant", true, false},
                            Variant{"_bf16acts", false, true}}) {
      const kernels::DenseKernels* k = &cpu::KernelsFor(b, v.invariant, v.bf16_acts);
      const kernels::DenseKernels* ref =
          &cpu::KernelsFor(kernels::Backend::kScalar, false, v.bf16_acts);
      if (v.suffix[0] != '\0' && k == &cpu::KernelsFor(b)) continue;  // same table
      const std::string name = std::string("_") + kernels::BackendName(b) + v.suffix;
      for (const auto& op : dense) {
        const op_cases::DenseCheck check = op.check;
        out.push_back({op.name + name, [k, ref, check](std::mt19937& rng) {
                         check(op_cases::DenseTarget{k, &host}, *ref, rng);
                       }});
      }
      for (const auto& [op, check] : cpu_only) {
        out.push_back(
            {op + name, [k, ref, check = check](std::mt19937& rng) { check(*k, *ref, rng); }});
      }
    }
  }
  // The any-precision and int8 kernels have CPU backends only; each family says which it has.
  for (kernels::Backend b : kernels::kAllBackends) {
    if (!kernels::IsCpuBackend(b)) continue;
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
