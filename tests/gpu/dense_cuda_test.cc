// The CUDA dense table (cuda::Kernels(), kernels/cuda/dense.cuh) against the scalar CPU
// reference (kernels/cpu) on larger awkward shapes than the op x backend cases
// (op_backend_cuda_test.cc): matmul_bf16 over whole weight matrices and rms_norm row by row over
// a batch of tokens, on the legacy default stream. Skips when no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/dense.h"
#include "kernels/cuda/dense.cuh"

namespace pw {
namespace {

bool HaveGpu() { return kernels::BackendSupported(kernels::Backend::kCuda); }

template <typename T>
T* ToDevice(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

struct Shape {
  int rows, cols, tokens;
};

class CudaDense : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaDense, MatmulBf16MatchesScalarReference) {
  const Shape s = GetParam();
  std::mt19937 rng(1234 + s.rows * 7 + s.cols);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> w(static_cast<size_t>(s.rows) * s.cols);
  std::vector<float> x(static_cast<size_t>(s.tokens) * s.cols);
  for (auto& v : w) v = cpu::ToBf16Bits(nd(rng));
  for (auto& v : x) v = nd(rng);
  std::vector<float> ref(static_cast<size_t>(s.tokens) * s.rows, NAN);
  cpu::kScalarKernels.matmul_bf16(x.data(), s.cols, s.tokens, w.data(), s.cols, 0, s.rows,
                                  ref.data(), s.rows);
  uint16_t* dw = ToDevice(w);
  float* dx = ToDevice(x);
  std::vector<float> got(ref.size(), NAN);  // poisoned: every output must be written
  float* dy = ToDevice(got);
  cuda::Kernels().matmul_bf16(dx, s.cols, s.tokens, dw, s.cols, 0, s.rows, dy, s.rows);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data(), dy, got.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  // Tolerance: fp32 sums in a different order; bound relative to sum |w||x| ~ sqrt(cols).
  const float tol = 1e-5f * s.cols + 1e-4f;
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], tol) << "at " << i;
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dy);
}

TEST_P(CudaDense, RmsNormMatchesScalarReference) {
  const Shape s = GetParam();
  const int dim = s.cols;
  std::mt19937 rng(99 + dim);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> w(dim), x(static_cast<size_t>(s.tokens) * dim);
  for (auto& v : w) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  std::vector<float> ref(x.size(), NAN);
  for (int t = 0; t < s.tokens; ++t) {
    cpu::kScalarKernels.rms_norm(&x[static_cast<size_t>(t) * dim], w.data(), dim, 1e-6f,
                                 &ref[static_cast<size_t>(t) * dim]);
  }
  float* dx = ToDevice(x);
  float* dw = ToDevice(w);
  std::vector<float> got(x.size(), NAN);
  float* dy = ToDevice(got);
  // One row per call, as the table's rms_norm is: a token's row of x into the same row of y.
  for (int t = 0; t < s.tokens; ++t) {
    const size_t row = static_cast<size_t>(t) * dim;
    cuda::Kernels().rms_norm(dx + row, dw, dim, 1e-6f, dy + row);
  }
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data(), dy, got.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_NEAR(got[i], ref[i], 1e-4f * (1.f + std::fabs(ref[i]))) << "at " << i;
  }
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
}

INSTANTIATE_TEST_SUITE_P(AwkwardShapes, CudaDense,
                         ::testing::Values(Shape{1, 1, 1}, Shape{37, 50, 3}, Shape{129, 65, 37},
                                           Shape{1024, 2048, 1}, Shape{733, 1002, 4}));

}  // namespace
}  // namespace pw
