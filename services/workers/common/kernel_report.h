// What a worker tells its operator about the CPU kernels it runs, once at start.
#pragma once

#include <string>

#include "kernels/anyprec/anyprec.h"

namespace pw::workers {

// One line naming the dense kernels' ISA, the any-precision fast path's backend and the dense
// kernels' software prefetch distance, e.g.
//   "kernels: dense avx512, any-precision fast path avx512, dense prefetch 0 B",
// and the activations: bf16 (the default) or exact fp32 (kernels.bf16_activations false).
std::string KernelBackendsLine();

// Widest width the fast path `backend` runs at least as fast as the bf16 GEMV at one token:
// 8 with a byte permute of 64+ entries (AVX-512 VBMI, AMX); 5 on AVX2, where a 2^b-entry
// lookup costs 2^(b-4) shuffles and as many blends (docs/benchmarks.md, "The AVX2 fast path at
// 5-8 bits": 8 bits measured 0.41-0.49x bf16, 6 bits 0.9-1.2x). The scalar backend gets the
// same 5 (not measured against bf16: no CPU of this project lacks AVX2).
int FastWidthLimit(kernels::Backend backend);

// A warning for the log when blocks may be raised above FastWidthLimit(backend) (max_bits is
// the planner's ceiling); empty when they may not.
std::string WideBlockWarning(kernels::Backend backend, int max_bits);

}  // namespace pw::workers
