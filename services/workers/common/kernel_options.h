// The kernel knobs (kernels/cpu/kernel_settings.h) as declared options (common/formats/options.h):
// the node file's `kernels:` map at the root, shared by the node's workers, and the flags
// --kernels-<knob>. ApplyKernelOptions sets them at process start; an environment variable,
// when set, overrides its key:
//   kernels:
//     cpu_isa: avx2             # PW_CPU_ISA: scalar | avx2 | avx512 | amx (lowers the best)
//     batch_invariant: true     # PW_BATCH_INVARIANT=1
//     bf16_activations: true    # PW_BF16_ACTIVATIONS=0|1; false (or the flag
//                               # --kernels-exact-activations): exact fp32 activations
//     anyprec_backend: avx2     # PW_ANYPREC_BACKEND: scalar | avx2 | avx512 | amx
//     prefetch_bytes: 0         # PW_PREFETCH_BYTES (-1: by the CPU)
//     prefetch_level: l2        # PW_PREFETCH_LEVEL: l1 | l2 (not set: by the CPU)
//     pool_spin_us: 500         # PW_POOL_SPIN_US (-1: the pool's default)
#pragma once

#include "common/formats/options.h"
#include "kernels/cpu/kernel_settings.h"

namespace pw::workers {

void DeclareKernelOptions(options::OptionSet* s, cpu::KernelSettings* k);

// Sets the knobs (before any kernel runs) and returns those in effect: `k` with each knob whose
// environment variable is set replaced by the variable's value.
cpu::KernelSettings ApplyKernelOptions(const cpu::KernelSettings& k);

}  // namespace pw::workers
