// Device memory for the op x backend cases (tests/kernels_cpu/dense_op_cases.h): the CUDA
// backend's ops read and write device memory, so a case's inputs go in and its outputs come back
// through here. Lives with the GPU tests so that the CPU-only build has no CUDA dependency.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "kernels/cuda/dense.cuh"
#include "tests/kernels_cpu/dense_op_cases.h"

namespace pw::op_cases {

class CudaMemory : public OpMemory {
 public:
  void* Alloc(size_t bytes) override {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    return p;
  }
  void Free(void* p) override { EXPECT_EQ(cudaFree(p), cudaSuccess); }
  // Both copies are queued on the thread's stream (cuda::SetStream), behind and ahead of the
  // table's entries, and waited for: a case's inputs are on the device before an op reads them,
  // and its outputs are read back only after the ops queued before have written them.
  void CopyIn(void* dst, const void* src, size_t bytes) override {
    EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda::Stream()),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(cuda::Stream()), cudaSuccess);
  }
  void CopyOut(void* dst, const void* src, size_t bytes) override {
    EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda::Stream()),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(cuda::Stream()), cudaSuccess);
  }
};

}  // namespace pw::op_cases
