// The tiled inner products of attention (kernels/cpu/attention_tiles.h) give every pair the
// bits of the table's own dot and axpy, on every CPU table this machine has, for head
// dimensions that take the tiled path (multiples of 16) and one that does not, and for query
// and key counts around each backend's tile shape.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/dense.h"

namespace pw {
namespace {

std::vector<float> Random(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<const kernels::DenseKernels*> Tables() {
  std::vector<const kernels::DenseKernels*> out;
  for (kernels::Backend b : kernels::kAllBackends) {
    if (!kernels::IsCpuBackend(b) || !kernels::BackendSupported(b)) continue;
    for (bool invariant : {false, true})
      for (bool bf16 : {false, true}) out.push_back(&cpu::KernelsFor(b, invariant, bf16));
  }
  return out;
}

TEST(AttentionTiles, DotsAreEachPairsDotBitForBit) {
  std::mt19937 rng(7);
  const float scale = 0.0883883f;
  for (const kernels::DenseKernels* k : Tables()) {
    for (size_t D : {16, 24, 64, 128, 256}) {
      for (size_t nq : {1, 2, 3, 4, 5, 8, 9, 16}) {
        for (size_t ns : {1, 2, 3, 4, 5, 7, 16}) {
          const size_t ldq = D * 3, lds = ns + 5;  // strided, as a head of a token's queries
          const auto q = Random(rng, nq * ldq), keys = Random(rng, ns * D);
          std::vector<float> got(nq * lds, -1.f);
          cpu::AttentionDots(*k, q.data(), ldq, nq, keys.data(), ns, D, scale, got.data(), lds);
          for (size_t i = 0; i < nq; ++i) {
            for (size_t s = 0; s < ns; ++s) {
              const float want = k->dot(q.data() + i * ldq, keys.data() + s * D, D) * scale;
              ASSERT_EQ(got[i * lds + s], want) << "D " << D << " nq " << nq << " ns " << ns << " at " << i << "," << s;
            }
            for (size_t s = ns; s < lds; ++s) ASSERT_EQ(got[i * lds + s], -1.f) << "wrote past ns";
          }
        }
      }
    }
  }
}

TEST(AttentionTiles, AxpysAreTheAxpysInOrderBitForBit) {
  std::mt19937 rng(8);
  for (const kernels::DenseKernels* k : Tables()) {
    for (size_t D : {16, 24, 64, 128, 144, 256}) {
      for (size_t ns : {1, 2, 5, 16}) {
        const auto a = Random(rng, ns), values = Random(rng, ns * D), start = Random(rng, D + 1);
        std::vector<float> got = start, want = start;
        cpu::AttentionAxpys(*k, a.data(), ns, values.data(), D, got.data());
        for (size_t s = 0; s < ns; ++s) k->axpy(a[s], values.data() + s * D, D, want.data());
        for (size_t d = 0; d <= D; ++d) ASSERT_EQ(got[d], want[d]) << "D " << D << " ns " << ns << " column " << d;
      }
    }
  }
}

}  // namespace
}  // namespace pw
