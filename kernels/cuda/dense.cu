// The CUDA dense op table: host entries with the table's signatures, each launching one kernel.
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/dense.cuh"

namespace pw::cuda {
namespace {

thread_local cudaStream_t t_stream = nullptr;

// Aborts with the call site and the runtime's message when `err` is not cudaSuccess: the table's
// entries return nothing, so a refused launch is a broken invariant of the caller.
void Check(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: CUDA %s: %s\n", file, line, what, cudaGetErrorString(err));
  std::abort();
}
#define PW_CUDA_CHECK(expr, what) Check((expr), (what), __FILE__, __LINE__)

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kBlock = 256;  // threads of the one-block-per-row kernels
constexpr unsigned kMaxGridY = 65535;

__device__ __forceinline__ float Bf16ToF32(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}
__device__ __forceinline__ float ToF32(uint16_t v) { return Bf16ToF32(v); }
__device__ __forceinline__ float ToF32(float v) { return v; }

__device__ __forceinline__ float WarpSum(float v) {
  for (int off = kWarp / 2; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int off = kWarp / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, off));
  return v;
}

// The sum (kMax false) or maximum (kMax true) of v over a block of kBlock threads, returned to
// every thread. `scratch` holds kBlock / kWarp floats; the call ends with a barrier, so the next
// reduction may reuse it.
template <bool kMax>
__device__ float BlockReduce(float v, float* scratch) {
  v = kMax ? WarpMax(v) : WarpSum(v);
  if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
  __syncthreads();
  if (threadIdx.x < kWarp) {
    const float identity = kMax ? -INFINITY : 0.f;
    float w = threadIdx.x < kBlock / kWarp ? scratch[threadIdx.x] : identity;
    w = kMax ? WarpMax(w) : WarpSum(w);
    if (threadIdx.x == 0) scratch[0] = w;
  }
  __syncthreads();
  const float out = scratch[0];
  __syncthreads();
  return out;
}

// grid: (ceil((n_end - n_begin) / kWarpsPerBlock), min(T, kMaxGridY)); each warp reduces one
// output row n for the tokens t = blockIdx.y, blockIdx.y + gridDim.y, ...
template <typename W>
__global__ void MatmulKernel(const float* __restrict__ x, size_t ldx, size_t T,
                             const W* __restrict__ w, size_t K, size_t n_begin, size_t n_end,
                             float* __restrict__ y, size_t ldy) {
  const size_t n = n_begin + static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const unsigned lane = threadIdx.x % kWarp;
  if (n >= n_end) return;
  const W* wn = w + n * K;
  for (size_t t = blockIdx.y; t < T; t += gridDim.y) {
    const float* xt = x + t * ldx;
    float acc = 0.f;
    for (size_t k = lane; k < K; k += kWarp) acc += xt[k] * ToF32(wn[k]);
    acc = WarpSum(acc);
    if (lane == 0) y[t * ldy + n] = acc;
  }
}

// One block: y = w * (x / sqrt(mean x^2 + eps)). Each thread reads x[i] before it writes y[i],
// and the sum of squares is complete before any write, so y may equal x.
__global__ void RmsNormKernel(const float* x, const float* __restrict__ w, size_t dim, float eps,
                              float* y) {
  __shared__ float scratch[kBlock / kWarp];
  float ss = 0.f;
  for (size_t i = threadIdx.x; i < dim; i += kBlock) ss += x[i] * x[i];
  ss = BlockReduce<false>(ss, scratch);
  const float r = 1.f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (size_t i = threadIdx.x; i < dim; i += kBlock) y[i] = w[i] * (x[i] * r);
}

// One block, in place: x = exp(x - max) / sum exp(x - max).
__global__ void SoftmaxKernel(float* x, size_t n) {
  __shared__ float scratch[kBlock / kWarp];
  float mx = -INFINITY;
  for (size_t i = threadIdx.x; i < n; i += kBlock) mx = fmaxf(mx, x[i]);
  mx = BlockReduce<true>(mx, scratch);
  float sum = 0.f;
  for (size_t i = threadIdx.x; i < n; i += kBlock) {
    const float e = expf(x[i] - mx);
    x[i] = e;
    sum += e;
  }
  const float inv = 1.f / BlockReduce<false>(sum, scratch);
  for (size_t i = threadIdx.x; i < n; i += kBlock) x[i] *= inv;
}

// Element-wise kernels: a grid-stride loop, so any n runs on a bounded grid.
__global__ void SiluMulKernel(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.f + expf(-g)) * up[i];
  }
}

__global__ void AxpyKernel(float alpha, const float* __restrict__ x, size_t n,
                           float* __restrict__ y) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] += alpha * x[i];
  }
}

// One block: *out = sum a[i] * b[i].
__global__ void DotKernel(const float* __restrict__ a, const float* __restrict__ b, size_t n,
                          float* out) {
  __shared__ float scratch[kBlock / kWarp];
  float s = 0.f;
  for (size_t i = threadIdx.x; i < n; i += kBlock) s += a[i] * b[i];
  s = BlockReduce<false>(s, scratch);
  if (threadIdx.x == 0) *out = s;
}

unsigned ElementwiseBlocks(size_t n) {
  const size_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
}

template <typename W>
void Matmul(const float* x, size_t ldx, size_t T, const W* w, size_t K, size_t n_begin,
            size_t n_end, float* y, size_t ldy) {
  if (T == 0 || n_begin >= n_end) return;
  const size_t rows = n_end - n_begin;
  const dim3 grid(static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>(T < kMaxGridY ? T : kMaxGridY));
  MatmulKernel<W>
      <<<grid, kWarpsPerBlock * kWarp, 0, t_stream>>>(x, ldx, T, w, K, n_begin, n_end, y, ldy);
  PW_CUDA_CHECK(cudaGetLastError(), "matmul launch");
}

void MatmulBf16(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K, size_t n_begin,
                size_t n_end, float* y, size_t ldy) {
  Matmul(x, ldx, T, w, K, n_begin, n_end, y, ldy);
}

void MatmulF32(const float* x, size_t ldx, size_t T, const float* w, size_t K, size_t n_begin,
               size_t n_end, float* y, size_t ldy) {
  Matmul(x, ldx, T, w, K, n_begin, n_end, y, ldy);
}

void RmsNorm(const float* x, const float* w, size_t dim, float eps, float* y) {
  if (dim == 0) return;
  RmsNormKernel<<<1, kBlock, 0, t_stream>>>(x, w, dim, eps, y);
  PW_CUDA_CHECK(cudaGetLastError(), "rms_norm launch");
}

void Softmax(float* x, size_t n) {
  if (n == 0) return;
  SoftmaxKernel<<<1, kBlock, 0, t_stream>>>(x, n);
  PW_CUDA_CHECK(cudaGetLastError(), "softmax launch");
}

void SiluMul(const float* gate, const float* up, size_t n, float* out) {
  if (n == 0) return;
  SiluMulKernel<<<ElementwiseBlocks(n), kBlock, 0, t_stream>>>(gate, up, n, out);
  PW_CUDA_CHECK(cudaGetLastError(), "silu_mul launch");
}

void Axpy(float alpha, const float* x, size_t n, float* y) {
  if (n == 0) return;
  AxpyKernel<<<ElementwiseBlocks(n), kBlock, 0, t_stream>>>(alpha, x, n, y);
  PW_CUDA_CHECK(cudaGetLastError(), "axpy launch");
}

// The calling thread's one float of device memory for dot's result.
class DotScratch {
 public:
  ~DotScratch() {
    if (ptr_ != nullptr) cudaFree(ptr_);  // at thread exit; an error then has no one to tell
  }
  float* Get() {
    if (ptr_ == nullptr) PW_CUDA_CHECK(cudaMalloc(&ptr_, sizeof(float)), "dot scratch");
    return ptr_;
  }

 private:
  float* ptr_ = nullptr;
};

float Dot(const float* a, const float* b, size_t n) {
  if (n == 0) return 0.f;
  thread_local DotScratch scratch;
  float* d_out = scratch.Get();
  DotKernel<<<1, kBlock, 0, t_stream>>>(a, b, n, d_out);
  PW_CUDA_CHECK(cudaGetLastError(), "dot launch");
  float out = 0.f;
  PW_CUDA_CHECK(cudaMemcpyAsync(&out, d_out, sizeof out, cudaMemcpyDeviceToHost, t_stream),
                "dot copy back");
  PW_CUDA_CHECK(cudaStreamSynchronize(t_stream), "dot");
  return out;
}

const kernels::DenseKernels kCudaKernels = {
    MatmulBf16, MatmulF32, RmsNorm, Softmax, SiluMul, Dot, Axpy,
};

}  // namespace

void SetStream(cudaStream_t stream) { t_stream = stream; }

cudaStream_t Stream() { return t_stream; }

const kernels::DenseKernels& Kernels() { return kCudaKernels; }

bool DevicePresent() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace pw::cuda
