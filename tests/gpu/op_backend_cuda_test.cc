// The op x backend cases (tests/kernels_cpu/dense_op_cases.h) on kCuda: every op of the dense
// table run by cuda::Kernels() on device memory against the scalar CPU reference, with the same
// inputs, sizes and tolerances as tests/kernels_cpu/op_backend_test.cc runs on the CPU backends.
// The entries run on a non-blocking stream of the test's own (cuda::SetStream), so a kernel that
// ignored the thread's stream would be read back before it finished. Skipped (with the reason)
// where no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/dense.h"
#include "kernels/cuda/dense.cuh"
#include "tests/gpu/cuda_memory.h"
#include "tests/kernels_cpu/dense_op_cases.h"

namespace pw {
namespace {

struct CudaCase {
  std::string name;  // <op>_cuda
  op_cases::DenseCheck check;
};

void PrintTo(const CudaCase& c, std::ostream* os) { *os << c.name; }

std::vector<CudaCase> AllCases() {
  std::vector<CudaCase> out;
  for (const auto& op : op_cases::DenseOps()) {
    out.push_back(
        {std::string(op.name) + "_" + kernels::BackendName(kernels::Backend::kCuda), op.check});
  }
  return out;
}

class OpBackend : public ::testing::TestWithParam<CudaCase> {
 protected:
  void SetUp() override {
    if (!kernels::BackendSupported(kernels::Backend::kCuda)) {
      GTEST_SKIP() << "backend cuda: no CUDA device on this machine";
    }
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    cuda::SetStream(stream_);
  }
  void TearDown() override {
    cuda::SetStream(nullptr);
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    }
  }

 private:
  cudaStream_t stream_ = nullptr;
};

TEST_P(OpBackend, MatchesTheScalarReference) {
  std::mt19937 rng(20261204);
  op_cases::CudaMemory memory;
  const op_cases::DenseTarget target{&cuda::Kernels(), &memory};
  GetParam().check(target, cpu::KernelsFor(kernels::Backend::kScalar), rng);
}

INSTANTIATE_TEST_SUITE_P(CudaOps, OpBackend, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<CudaCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace pw
