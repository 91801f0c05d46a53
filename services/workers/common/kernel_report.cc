#include "services/workers/common/kernel_report.h"

#include "kernels/anyprec/q8.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/prefetch_distance.h"

namespace pw::workers {

std::string KernelBackendsLine() {
  std::string line = std::string("kernels: dense ") + kernels::BackendName(cpu::BestIsa()) +
                     ", any-precision fast path " + kernels::BackendName(anyprec::BestQ8Backend()) +
                     ", dense prefetch " + std::to_string(cpu::PrefetchBytes()) +
                     " B, any-precision prefetch into " +
                     (cpu::StreamPrefetchLevel() == cpu::PrefetchLevel::kL2 ? "L2" : "L1");
  if (cpu::Bf16ActivationsRequested()) {
    line += cpu::UsesAvx512Bf16(cpu::Kernels()) ? ", bf16 activations (avx512-bf16 dot products)"
                                                : ", bf16 activations (rounded, fp32 products)";
  } else {
    line += ", exact fp32 activations";
  }
  return line;
}

std::string WideBlockWarning(kernels::Backend backend, int max_bits) {
  const int limit = anyprec::FastWidthLimit(backend);
  if (max_bits <= limit) return "";
  return std::string("the any-precision fast path here is ") + kernels::BackendName(backend) +
         " (no AVX-512 VBMI byte permute, or no VNNI or GFNI beside it): expert blocks above " +
         std::to_string(limit) +
         " bits decode slower than bf16 on this CPU, and the planner may raise them to " +
         std::to_string(max_bits) + "; set planner max_bits to " + std::to_string(limit) +
         " to keep every width faster than bf16";
}

}  // namespace pw::workers
