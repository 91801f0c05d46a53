#include "services/workers/common/kernel_options.h"

#include "kernels/cpu/prefetch_distance.h"

namespace pw::workers {

void DeclareKernelOptions(options::OptionSet* s, cpu::KernelSettings* k) {
  s->Add("kernels.cpu_isa", &k->cpu_isa, "dense kernels' ISA at most (PW_CPU_ISA overrides)")
      .Shared().NonEmpty().OneOf({"scalar", "avx2", "avx512", "amx"});
  s->Add("kernels.batch_invariant", &k->batch_invariant,
         "batch-invariant dense kernels (PW_BATCH_INVARIANT=1 overrides)")
      .Shared();
  s->Add("kernels.bf16_activations", &k->bf16_activations,
         "bf16 activations in the dense kernels (the default); false or the flag: the exact "
         "fp32 activations (PW_BF16_ACTIVATIONS=0|1 overrides)")
      .Shared().Flag("--kernels-exact-activations").FlagSets(false);
  s->Add("kernels.anyprec_backend", &k->anyprec_backend,
         "any-precision kernels' backend (PW_ANYPREC_BACKEND overrides)")
      .Shared().NonEmpty().OneOf({"scalar", "avx2", "avx512", "amx"});
  s->Add("kernels.prefetch_bytes", &k->prefetch_bytes,
         "dense kernels' software prefetch distance, -1: by the CPU (PW_PREFETCH_BYTES overrides)")
      .Shared().Range(-1, static_cast<double>(cpu::kMaxPrefetchBytes));
  s->Add("kernels.prefetch_level", &k->prefetch_level,
         "cache level the any-precision kernels prefetch their plane streams into, l1 or l2; "
         "by the CPU when not set (PW_PREFETCH_LEVEL overrides)")
      .Shared().NonEmpty().OneOf({"l1", "l2"});
  s->Add("kernels.pool_spin_us", &k->pool_spin_us,
         "thread pool's polling window in us, -1: its default (PW_POOL_SPIN_US overrides)")
      .Shared().Range(-1, 1000000);
  s->Add("kernels.dense_q8_max", &k->dense_q8_max,
         "range of the int8 dense matrices (dense: int8), 1..127; -1: the fast path's (63 on "
         "AVX2, 127 with AVX-512; PW_DENSE_Q8_MAX overrides)")
      .Shared().Range(-1, 127);
}

cpu::KernelSettings ApplyKernelOptions(const cpu::KernelSettings& k) {
  cpu::SetKernelSettings(k);
  return cpu::EffectiveKernelSettings();
}

}  // namespace pw::workers
