// What a worker logs about its CPU kernels: the line and the wide-block warning.
#include "services/workers/common/kernel_report.h"

#include <gtest/gtest.h>

#include "kernels/anyprec/q8.h"
#include "kernels/cpu/dense.h"

namespace pw::workers {
namespace {

TEST(KernelReport, TheLineNamesEveryBackendThisProcessRuns) {
  const std::string line = KernelBackendsLine();
  EXPECT_NE(line.find(std::string("dense ") + kernels::BackendName(cpu::BestIsa())),
            std::string::npos)
      << line;
  EXPECT_NE(line.find(std::string("fast path ") + kernels::BackendName(anyprec::BestQ8Backend())),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("prefetch"), std::string::npos) << line;
  EXPECT_EQ(line.find("bf16 activations") != std::string::npos, cpu::Bf16ActivationsRequested()) << line;
  EXPECT_EQ(line.find("exact fp32 activations") != std::string::npos,
            !cpu::Bf16ActivationsRequested()) << line;
}

TEST(KernelReport, OnlyAByteShuffleFastPathLimitsTheWidth) {
  EXPECT_EQ(anyprec::FastWidthLimit(kernels::Backend::kAvx512), 8);
  EXPECT_EQ(anyprec::FastWidthLimit(kernels::Backend::kAmx), 8);
  EXPECT_EQ(anyprec::FastWidthLimit(kernels::Backend::kAvx2), 5);
  EXPECT_EQ(anyprec::FastWidthLimit(kernels::Backend::kScalar), 5);
}

TEST(KernelReport, AWarningOnlyWhenThePlannerMayRaiseAboveTheLimit) {
  EXPECT_EQ(WideBlockWarning(kernels::Backend::kAvx512, 8), "");
  EXPECT_EQ(WideBlockWarning(kernels::Backend::kAvx2, 5), "");
  EXPECT_EQ(WideBlockWarning(kernels::Backend::kAvx2, 3), "");
  const std::string w = WideBlockWarning(kernels::Backend::kAvx2, 8);
  EXPECT_NE(w.find("avx2"), std::string::npos) << w;
  EXPECT_NE(w.find("above 5 bits"), std::string::npos) << w;
  EXPECT_NE(w.find("max_bits to 5"), std::string::npos) << w;
  EXPECT_NE(WideBlockWarning(kernels::Backend::kAvx2, 6), "");
}

}  // namespace
}  // namespace pw::workers
