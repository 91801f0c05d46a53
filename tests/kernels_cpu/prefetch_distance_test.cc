// The software prefetch distance: the CPU's choice and the PW_PREFETCH_BYTES override.
#include "kernels/cpu/prefetch_distance.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace pw::cpu {
namespace {

// Sets PW_PREFETCH_BYTES for one scope and restores what was there.
class ScopedEnv {
 public:
  explicit ScopedEnv(const char* value) {
    if (const char* old = getenv("PW_PREFETCH_BYTES")) old_ = old, had_ = true;
    if (value != nullptr) {
      setenv("PW_PREFETCH_BYTES", value, 1);
    } else {
      unsetenv("PW_PREFETCH_BYTES");
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv("PW_PREFETCH_BYTES", old_.c_str(), 1);
    } else {
      unsetenv("PW_PREFETCH_BYTES");
    }
  }

 private:
  std::string old_;
  bool had_ = false;
};

TEST(PrefetchDistance, TheCpusChoiceIsNoneOrTwoKiB) {
  ScopedEnv env(nullptr);
  const size_t b = DefaultPrefetchBytes();
  EXPECT_TRUE(b == 0 || b == 2048) << b;
}

TEST(PrefetchDistance, TheOverrideIsTakenWhenValid) {
  {
    ScopedEnv env("4096");
    EXPECT_EQ(DefaultPrefetchBytes(), 4096u);
  }
  {
    ScopedEnv env("0");
    EXPECT_EQ(DefaultPrefetchBytes(), 0u);
  }
}

TEST(PrefetchDistance, ABadOverrideFallsBackToTheCpusChoice) {
  size_t chosen;
  {
    ScopedEnv env(nullptr);
    chosen = DefaultPrefetchBytes();
  }
  for (const char* bad : {"-1", "12kb", "99999999999999999999", "65537", " 64"}) {
    ScopedEnv env(bad);
    EXPECT_EQ(DefaultPrefetchBytes(), chosen) << bad;
  }
}

}  // namespace
}  // namespace pw::cpu
