// The batch-invariant dense tables (KernelsFor(isa, true)): a token's matmul result is the same
// bits whatever T it was computed with and wherever it sits in the batch, for every backend
// the CPU has, on random inputs and awkward shapes (K not a multiple of 32, K past one column
// chunk, row counts not multiples of 16, 1..37 tokens), and within the dense tests' tolerance of
// the exact product; the bf16-activation tables likewise (bits only). Also that the default amx
// table is not (so the invariant one is what makes the difference here).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "kernels/cpu/dense.h"

namespace pw::cpu {
namespace {

using kernels::Backend;
using kernels::BackendName;
using kernels::BackendSupported;
using kernels::DenseKernels;

struct Case {
  std::vector<float> x;
  std::vector<uint16_t> w;
  size_t K, N, ldx;
};

Case MakeCase(size_t T, size_t K, size_t N, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  Case c;
  c.K = K;
  c.N = N;
  c.ldx = K + 5;
  c.x.resize(T * c.ldx);
  for (auto& v : c.x) v = d(rng);
  c.w.resize(N * K);
  for (auto& v : c.w) v = ToBf16Bits(d(rng));
  return c;
}

// y of tokens [t0, t0 + T) of the case, rows [0, N) split at 16-row boundaries as the engine's
// thread pool splits them.
std::vector<float> Matmul(const DenseKernels& k, const Case& c, size_t t0, size_t T) {
  const size_t ldy = c.N + 3;
  std::vector<float> y(T * ldy, NAN);
  for (size_t n0 = 0; n0 < c.N; n0 += 48) {
    const size_t n1 = n0 + 48 < c.N ? n0 + 48 : c.N;
    k.matmul_bf16(c.x.data() + t0 * c.ldx, c.ldx, T, c.w.data(), c.K, n0, n1, y.data(), ldy);
  }
  return y;
}

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Each token of `all` (every token of the case in one call) has the same bits when computed
// in a batch of T starting at t0, for each T and t0 given (t0 = -1: the last T tokens).
void ExpectSameBitsInEveryBatch(const DenseKernels& k, const Case& c, const std::vector<float>& all,
                                std::initializer_list<size_t> batches, std::initializer_list<int> starts) {
  const size_t tokens = c.x.size() / c.ldx, ldy = c.N + 3;
  for (size_t T : batches) {
    for (int start : starts) {
      const size_t t0 = start < 0 ? tokens - T : static_cast<size_t>(start);
      const std::vector<float> part = Matmul(k, c, t0, T);
      for (size_t t = 0; t < T; ++t) {
        ASSERT_TRUE(SameBits(part.data() + t * ldy, all.data() + (t0 + t) * ldy, c.N))
            << "token " << t0 + t << " computed in a batch of " << T;
      }
    }
  }
}

TEST(BatchInvariance, EveryTokenGetsTheSameBitsAtEveryBatchSize) {
  constexpr size_t kTokens = 37;
  for (Backend isa : {Backend::kScalar, Backend::kAvx2, Backend::kAvx512, Backend::kAmx}) {
    if (!BackendSupported(isa)) continue;
    const DenseKernels& k = KernelsFor(isa, /*batch_invariant=*/true);
    for (size_t K : {31, 64, 1057, 2100}) {
      for (size_t N : {15, 33, 100}) {
        SCOPED_TRACE(testing::Message() << BackendName(isa) << " K=" << K << " N=" << N);
        const Case c = MakeCase(kTokens, K, N, static_cast<uint32_t>(K * 131 + N));
        const size_t ldy = N + 3;
        const std::vector<float> all = Matmul(k, c, 0, kTokens);
        // Still the product: within the dense tests' tolerance of the exact sum.
        for (size_t t = 0; t < kTokens; ++t) {
          for (size_t n = 0; n < N; ++n) {
            double exact = 0, mag = 0;
            for (size_t kk = 0; kk < K; ++kk) {
              const double p = double(c.x[t * c.ldx + kk]) * Bf16Bits(c.w[n * K + kk]);
              exact += p;
              mag += std::fabs(p);
            }
            ASSERT_LE(std::fabs(all[t * ldy + n] - exact), 1e-5 * mag + 1e-6) << "t=" << t << " n=" << n;
          }
        }
        ExpectSameBitsInEveryBatch(k, c, all, {1, 2, 3, 4, 5, 16, 17, 33}, {0, -1});
      }
    }
  }
}

// The bf16-activation tables asked for invariance (vdpbf16ps where the CPU has AVX512-BF16, one
// kernel at every token count; the AVX2 and scalar ones otherwise): the same bits for a token
// whatever the batch. Their accuracy is op_backend_test's.
TEST(BatchInvariance, Bf16ActivationTablesGiveEveryTokenTheSameBits) {
  constexpr size_t kTokens = 37;
  for (Backend isa : {Backend::kScalar, Backend::kAvx2, Backend::kAvx512, Backend::kAmx}) {
    if (!BackendSupported(isa)) continue;
    const DenseKernels& k = KernelsFor(isa, /*batch_invariant=*/true, /*bf16_activations=*/true);
    for (size_t K : {31, 64, 1057, 2100}) {
      for (size_t N : {15, 33, 100}) {
        SCOPED_TRACE(testing::Message() << BackendName(isa) << " K=" << K << " N=" << N);
        const Case c = MakeCase(kTokens, K, N, static_cast<uint32_t>(K * 137 + N));
        const std::vector<float> all = Matmul(k, c, 0, kTokens);
        ExpectSameBitsInEveryBatch(k, c, all, {1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 18, 33}, {0, 1, -1});
      }
    }
  }
}

TEST(BatchInvariance, TheDefaultAmxTableDependsOnTheBatch) {
  if (!BackendSupported(Backend::kAmx)) GTEST_SKIP() << "no AMX here";
  const DenseKernels& k = KernelsFor(Backend::kAmx);
  const Case c = MakeCase(8, 2048, 64, 7);
  const std::vector<float> all = Matmul(k, c, 0, 8);
  int differ = 0;
  for (size_t t = 0; t < 8; ++t) {
    differ += SameBits(Matmul(k, c, t, 1).data(), all.data() + t * (c.N + 3), c.N) ? 0 : 1;
  }
  EXPECT_GT(differ, 0) << "the few-token GEMV and the tiles gave the same bits";
}

}  // namespace
}  // namespace pw::cpu
