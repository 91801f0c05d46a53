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

// A warning for the log when blocks may be raised above anyprec::FastWidthLimit(backend)
// (max_bits is the planner's ceiling); empty when they may not.
std::string WideBlockWarning(kernels::Backend backend, int max_bits);

}  // namespace pw::workers
