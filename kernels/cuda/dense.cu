#include "kernels/cuda/dense.cuh"

namespace pw::cuda {
namespace {

__device__ __forceinline__ float Bf16ToF32(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

constexpr int kWarpsPerBlock = 8;

// grid: (ceil(rows / kWarpsPerBlock), tokens); each warp reduces one output row.
__global__ void Bf16GemmKernel(const uint16_t* __restrict__ w, const float* __restrict__ x,
                               float* __restrict__ y, int rows, int cols) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + warp;
  const int t = blockIdx.y;
  if (row >= rows) return;
  const uint16_t* wr = w + static_cast<size_t>(row) * cols;
  const float* xt = x + static_cast<size_t>(t) * cols;
  float acc = 0.f;
  for (int c = lane; c < cols; c += 32) acc += Bf16ToF32(wr[c]) * xt[c];
  acc = WarpSum(acc);
  if (lane == 0) y[static_cast<size_t>(t) * rows + row] = acc;
}

// grid: tokens; block: 256 threads reduce one row.
__global__ void RmsNormKernel(const float* __restrict__ x, const uint16_t* __restrict__ weight,
                              float* out, int dim, float eps) {
  __shared__ float partial[32];
  const float* xt = x + static_cast<size_t>(blockIdx.x) * dim;
  float* ot = out + static_cast<size_t>(blockIdx.x) * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xt[i] * xt[i];
  ss = WarpSum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.f;
    v = WarpSum(v);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  const float inv = rsqrtf(partial[0] / dim + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ot[i] = xt[i] * inv * Bf16ToF32(weight[i]);
}

}  // namespace

cudaError_t Bf16Gemm(const uint16_t* w, const float* x, float* y, int rows, int cols, int tokens,
                     cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || tokens <= 0) return cudaErrorInvalidValue;
  dim3 grid((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, tokens);
  Bf16GemmKernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(w, x, y, rows, cols);
  return cudaGetLastError();
}

cudaError_t RmsNorm(const float* x, const uint16_t* weight, float* out, int tokens, int dim,
                    float eps, cudaStream_t stream) {
  if (tokens <= 0 || dim <= 0) return cudaErrorInvalidValue;
  RmsNormKernel<<<tokens, 256, 0, stream>>>(x, weight, out, dim, eps);
  return cudaGetLastError();
}

}  // namespace pw::cuda
