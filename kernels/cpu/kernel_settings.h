// KernelSettings: the process-wide kernel knobs. A process sets them once at its start, before
// any kernel runs (the serving workers apply their node file's `kernels:` section,
// services/workers/common/kernel_options.h); each environment variable, when set, overrides its
// setting (tools, benchmarks and tests set the knobs that way). A process that sets nothing
// runs this struct's defaults. The kernels read a knob once, at its first use, through
// KernelKnob.
#pragma once

#include <cstdint>
#include <string>

namespace pw::cpu {

struct KernelSettings {
  std::string cpu_isa;            // PW_CPU_ISA: scalar | avx2 | avx512 | amx, lowers the best
                                  // dense backend (dense.h); "" = the best
  bool batch_invariant = false;   // PW_BATCH_INVARIANT=1 (dense.h)
  // bf16 activations in the bf16 matmuls (dense.h), the serving default: the arithmetic of
  // llama.cpp's bf16 type and of torch in bf16. false = exact fp32 activations, the mode the
  // HF-parity checks select (docs/quality.md, "bf16 activations"). PW_BF16_ACTIVATIONS=0 or 1.
  bool bf16_activations = true;
  std::string anyprec_backend;    // PW_ANYPREC_BACKEND: scalar | avx2 | avx512 | amx
                                  // (kernels/anyprec); "" = the best
  int64_t prefetch_bytes = -1;    // PW_PREFETCH_BYTES (prefetch_distance.h); -1 = by the CPU
  std::string prefetch_level;     // PW_PREFETCH_LEVEL: l1 | l2, the any-precision streams'
                                  // prefetch level (prefetch_distance.h); "" = by the CPU
  int64_t pool_spin_us = -1;      // PW_POOL_SPIN_US (thread_pool.h); -1 = kDefaultSpinMicros
  int64_t dense_q8_max = -1;      // PW_DENSE_Q8_MAX: the int8 dense matrices' range, 1..127
                                  // (kernels/anyprec/q8.h DenseQ8Range); -1 = the backend's
};

// Sets the knobs (before the first kernel call; later calls do not change knobs already read).
void SetKernelSettings(const KernelSettings& s);

// Knob `env_name` ("PW_CPU_ISA", ... as above) as the kernels read it: the environment variable
// when set, else the setting (SetKernelSettings's, or the defaults above) in the variable's form
// ("1" for a true flag, "0" for a false one), else nullptr.
const char* KernelKnob(const char* env_name);

// The settings in effect: the environment variables over SetKernelSettings's.
KernelSettings EffectiveKernelSettings();

}  // namespace pw::cpu
