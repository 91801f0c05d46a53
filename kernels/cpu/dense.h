// Dense CPU kernels: bf16-weight x fp32-activation matmul, RMSNorm, softmax, SiLU*mul, dot, axpy.
//
// One interface, several backends (docs/STYLE): the op table kernels::DenseKernels
// (kernels/dense_ops.h), whose scalar CPU backend here is the reference that defines "correct";
// the AVX2/FMA, AVX-512 and AMX backends are checked against it by
// tests/kernels_cpu/op_backend_test.cc on random inputs and awkward shapes (CUDA's table,
// kernels/cuda, by its twin tests/gpu/op_backend_cuda_test.cc). The backend is chosen at run time
// (BestIsa() asks the CPU through __builtin_cpu_supports), so one binary runs everywhere.
//
// The contracts every kernel keeps (views, layouts, fp32 accumulation) are the table's:
// kernels/dense_ops.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/backend.h"
#include "kernels/dense_ops.h"

namespace pw::cpu {

// The backend enum is the kernels layer's (kernels/backend.h): the CPU tables here exist for
// kScalar, kAvx2, kAvx512 and kAmx (the AVX-512 backend with the bf16 matmul of five tokens and
// more on AMX-BF16 tiles, each fp32 activation split exactly into three bf16 parts, so the
// products are fp32's: dense_amx.cc); kernels::BackendSupported() says which this CPU runs.
// Fastest supported CPU level; the environment variable PW_CPU_ISA=scalar|avx2|avx512|amx lowers
// it (never raises it past what the CPU supports). kAmx needs AMX-TILE, AMX-BF16 and AVX512-BF16
// and the kernel's leave to use the tile state (asked once, arch_prctl ARCH_REQ_XCOMP_PERM).
kernels::Backend BestIsa();

// bf16 <-> fp32 by bits: bf16 is the top 16 bits of an fp32. Rounding to bf16 is
// round-to-nearest-even; NaN stays NaN.
inline float Bf16Bits(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint16_t ToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The table type is the kernels layer's (kernels/dense_ops.h): one signature per op, shared
// with the CUDA backend. The CPU tables below take host pointers and have finished on return.

// The table of one CPU backend. Requires kernels::BackendSupported(isa) and isa not kCuda (aborts
// otherwise: a broken invariant; CUDA's table is cuda::Kernels(), kernels/cuda/dense.cuh).
// With `batch_invariant`, every kernel computes each token (row of x) in one summation order
// whatever T is, so a token's result is the same bits however it is batched: the avx512 and
// avx2 backends then skip their few-token GEMV (whose order differs from their tiles'), and the
// amx backend runs every token count on tiles with one column chunking. The scalar backend is
// invariant already. Costs speed where a backend switches kernels by token count (docs/benchmarks.md).
//
// With `bf16_activations`, matmul_bf16 rounds each activation to bf16 (nearest, ties to even)
// before multiplying: the arithmetic of bf16 inference (llama.cpp's bf16 type, torch in bf16),
// run on AVX512-BF16's vdpbf16ps where the CPU has it and isa is kAvx512 or kAmx (1.3-1.7x the
// fp32 kernel at 8-16 tokens on an AMD Zen 4, the same at one token; denormal activations count
// as 0 there), else the AVX2 table with its fp32 tile on the rounded values (the scalar table
// for kScalar). vdpbf16ps and the scalar table run one kernel at every token count, so they are
// batch-invariant; the AVX2 table's one token goes through its GEMV unless `batch_invariant`.
// Kernels() runs them by default (KernelSettings::bf16_activations): about 3 significant bits
// less per activation, no perplexity change measured (docs/quality.md); the engine's checks
// against HF transformers' float32 logits (tests/engine) select the exact fp32 activations.
const kernels::DenseKernels& KernelsFor(kernels::Backend isa, bool batch_invariant = false,
                                        bool bf16_activations = false);
// True when `k` is the table whose matmul_bf16 runs vdpbf16ps (AVX512-BF16).
bool UsesAvx512Bf16(const kernels::DenseKernels& k);
// True when the environment asks for batch-invariant kernels: PW_BATCH_INVARIANT=1. Served
// outputs then do not depend on what a request was batched with (a greedy completion is the
// same under any load), as tests comparing a cluster with an in-process engine need.
bool BatchInvariantRequested();
// True unless the exact fp32 activations are selected (PW_BF16_ACTIVATIONS=0, or
// KernelSettings::bf16_activations false).
bool Bf16ActivationsRequested();
// The table of BestIsa() (batch-invariant when requested, bf16 activations unless the exact
// ones are), resolved once.
const kernels::DenseKernels& Kernels();

// Per-backend tables, defined in dense_<isa>.cc. Use KernelsFor() instead.
extern const kernels::DenseKernels kScalarKernels;
extern const kernels::DenseKernels kAvx2Kernels;
extern const kernels::DenseKernels kAvx2InvariantKernels;
extern const kernels::DenseKernels kAvx512Kernels;
extern const kernels::DenseKernels kAmxKernels;
extern const kernels::DenseKernels kAvx512InvariantKernels;
extern const kernels::DenseKernels kAmxInvariantKernels;
extern const kernels::DenseKernels kScalarBf16ActsKernels;
extern const kernels::DenseKernels kAvx2Bf16ActsKernels;
extern const kernels::DenseKernels kAvx2Bf16ActsInvariantKernels;
extern const kernels::DenseKernels kAvx512Bf16ActsKernels;

}  // namespace pw::cpu
