// CUDA dense kernels used by the engine's non-expert path (attention projections, lm_head,
// norms). Host launchers take raw device pointers, sizes and the stream last, return
// cudaError_t and never allocate. The scalar CPU reference in kernels/cpu defines correct;
// tests/gpu/ checks these against it on a machine with a GPU.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace pw::cuda {

// y[t, r] = sum_c bf16(w[r, c]) * x[t, c], fp32 accumulation.
//   w: [rows, cols] bf16 bits (uint16), row-major
//   x: [tokens, cols] fp32;  y: [tokens, rows] fp32
// One warp per (row, token); any rows/cols/tokens (no alignment required).
cudaError_t Bf16Gemm(const uint16_t* w, const float* x, float* y, int rows, int cols, int tokens,
                     cudaStream_t stream);

// out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * bf16(weight[:]).
//   x, out: [tokens, dim] fp32 (may alias); weight: [dim] bf16 bits.
cudaError_t RmsNorm(const float* x, const uint16_t* weight, float* out, int tokens, int dim,
                    float eps, cudaStream_t stream);

}  // namespace pw::cuda
