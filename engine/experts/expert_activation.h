// ExpertActivationOp: the one place an ExpertActivation (engine/models/moe_kinds.h) becomes the
// elementwise op the CPU expert runners apply between an expert's gate_up and down blocks
// (RunBf16Experts, RunQ8Experts, RunExpertsByBlock, and through them every provider). A runner
// resolves the op once per ExpertLayerCall, then applies it per row.
#pragma once

#include <cstddef>

#include "common/status.h"
#include "engine/models/moe_kinds.h"
#include "kernels/cpu/dense.h"

namespace pw::engine {

// out[i] = act(gate[i], up[i]) for i < n, over one row; out may equal gate or up.
using ExpertActivationFn = void (*)(const float* gate, const float* up, size_t n, float* out);

// gpt-oss's clamped SwiGLU (ExpertActivation::kClampedSwiGlu), scalar fp32 as HF computes it.
void ClampedSwiGlu(const float* gate, const float* up, size_t n, float* out);

// gelu_pytorch_tanh(gate) * up (ExpertActivation::kGeluTanh), scalar fp32 as HF computes it.
void GeluTanhMul(const float* gate, const float* up, size_t n, float* out);

// The op of `kind` from the kernel table `k` (kSwiGlu: k.silu_mul; kClampedSwiGlu:
// ClampedSwiGlu; kGeluTanh: GeluTanhMul). kUnsupported, naming the
// kind, for one the CPU runners do not implement.
Result<ExpertActivationFn> ExpertActivationOp(ExpertActivation kind,
                                              const kernels::DenseKernels& k);

}  // namespace pw::engine
