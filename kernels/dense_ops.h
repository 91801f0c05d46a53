// The dense op table: one signature per op, shared by every backend of kernels/backend.h.
//
// A backend is one DenseKernels value: the CPU backends' tables are in kernels/cpu/dense.h
// (cpu::KernelsFor), CUDA's in kernels/cuda/dense.cuh (cuda::Kernels()). The scalar CPU table
// is the reference that defines correct; tests/kernels_cpu/op_backend_test.cc and its CUDA twin
// tests/gpu/op_backend_cuda_test.cc run every op of the table on every backend the machine has
// against it (tests/kernels_cpu/dense_op_cases.h).
//
// Contracts shared by every backend:
// - Pointers live in the backend's memory: host memory for the CPU backends, device memory for
//   kCuda. A table never copies between the two.
// - Arguments are non-owning views (pointers, sizes, strides in elements). Kernels never
//   allocate, never keep a pointer after returning, and never read outside the stated ranges.
// - Weights are row-major [N, K] (one output row per weight row, K contiguous), as a torch
//   nn.Linear stores them. bf16 is the upper half of an IEEE fp32 (raw uint16_t bits).
// - All accumulation is fp32. Backends may sum in a different order than the reference, so
//   results agree to rounding, not bit for bit (tolerances are in the tests).
// - Output ranges may not overlap input ranges unless an op says so.
// - When the work is done: a CPU entry has finished when it returns. A CUDA entry is queued on
//   the calling thread's stream (cuda::SetStream) and returns without waiting, except dot, whose
//   result is a host value: it waits for the stream (kernels/cuda/dense.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pw::kernels {

// Function table of one backend. Every entry is a pure function of its arguments.
struct DenseKernels {
  // y[t*ldy + n] = sum_{k<K} x[t*ldx + k] * W[n*K + k]   for t < T, n_begin <= n < n_end.
  // x: fp32 [T, ldx] (ldx >= K); w: bf16 [N, K] with N >= n_end; y: fp32 [T, ldy] (ldy >= n_end).
  // Only y[t*ldy + n] for n in [n_begin, n_end) is written, so threads may split rows.
  void (*matmul_bf16)(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                      size_t n_begin, size_t n_end, float* y, size_t ldy);
  // Same as matmul_bf16 with fp32 weights w: [N, K].
  void (*matmul_f32)(const float* x, size_t ldx, size_t T, const float* w, size_t K, size_t n_begin,
                     size_t n_end, float* y, size_t ldy);
  // One row: y[i] = w[i] * (x[i] / sqrt(mean_j x[j]^2 + eps)), i < dim (HF RMSNorm order:
  // normalise in fp32, then scale by the weight). y may equal x (in place).
  void (*rms_norm)(const float* x, const float* w, size_t dim, float eps, float* y);
  // In place over x[0..n): x[i] = exp(x[i] - max) / sum_j exp(x[j] - max). n >= 1.
  // -inf entries become 0; at least one entry must be finite.
  void (*softmax)(float* x, size_t n);
  // out[i] = silu(gate[i]) * up[i] with silu(g) = g / (1 + exp(-g)). out may equal gate or up.
  void (*silu_mul)(const float* gate, const float* up, size_t n, float* out);
  // Returns sum_i a[i] * b[i].
  float (*dot)(const float* a, const float* b, size_t n);
  // y[i] += alpha * x[i].
  void (*axpy)(float alpha, const float* x, size_t n, float* y);
};

}  // namespace pw::kernels
