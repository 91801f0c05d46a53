// The process-wide kernel knobs: their defaults, the settings a process applies and the
// environment variables over both.
#include "kernels/cpu/kernel_settings.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace pw::cpu {
namespace {

// Restores the variable and the defaults whatever the test did.
class KernelSettingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("PW_BF16_ACTIVATIONS")) saved_ = v, had_ = true;
    unsetenv("PW_BF16_ACTIVATIONS");
  }
  void TearDown() override {
    SetKernelSettings(KernelSettings{});
    if (had_) setenv("PW_BF16_ACTIVATIONS", saved_.c_str(), 1);
  }

 private:
  std::string saved_;
  bool had_ = false;
};

// bf16 activations are the default of every process, whether or not it applies settings; the
// exact fp32 activations are selected by the setting or by PW_BF16_ACTIVATIONS=0.
TEST_F(KernelSettingsTest, Bf16ActivationsAreTheDefaultAndTheExactModeIsSelected) {
  EXPECT_TRUE(KernelSettings{}.bf16_activations);
  ASSERT_NE(KernelKnob("PW_BF16_ACTIVATIONS"), nullptr);
  EXPECT_STREQ(KernelKnob("PW_BF16_ACTIVATIONS"), "1");
  EXPECT_TRUE(EffectiveKernelSettings().bf16_activations);

  KernelSettings exact;
  exact.bf16_activations = false;
  SetKernelSettings(exact);
  EXPECT_STREQ(KernelKnob("PW_BF16_ACTIVATIONS"), "0");
  EXPECT_FALSE(EffectiveKernelSettings().bf16_activations);

  // The variable wins over the setting, both ways.
  setenv("PW_BF16_ACTIVATIONS", "1", 1);
  EXPECT_TRUE(EffectiveKernelSettings().bf16_activations);
  SetKernelSettings(KernelSettings{});
  setenv("PW_BF16_ACTIVATIONS", "0", 1);
  EXPECT_FALSE(EffectiveKernelSettings().bf16_activations);
}

}  // namespace
}  // namespace pw::cpu
