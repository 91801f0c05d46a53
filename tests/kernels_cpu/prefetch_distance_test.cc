// The software prefetch distance and level: the CPU's choices and the PW_PREFETCH_BYTES and
// PW_PREFETCH_LEVEL overrides.
#include "kernels/cpu/prefetch_distance.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace pw::cpu {
namespace {

// Sets an environment variable (PW_PREFETCH_BYTES unless named) for one scope and restores what
// was there.
class ScopedEnv {
 public:
  explicit ScopedEnv(const char* value, const char* name = "PW_PREFETCH_BYTES") : name_(name) {
    if (const char* old = getenv(name_)) old_ = old, had_ = true;
    if (value != nullptr) {
      setenv(name_, value, 1);
    } else {
      unsetenv(name_);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
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

TEST(PrefetchLevel, TheCpusChoiceIsL2OnAmdAndL1Elsewhere) {
  ScopedEnv env(nullptr, "PW_PREFETCH_LEVEL");
  EXPECT_EQ(DefaultStreamPrefetchLevel(), IsAmdCpu() ? PrefetchLevel::kL2 : PrefetchLevel::kL1);
}

TEST(PrefetchLevel, TheOverrideIsTakenWhenValidAndABadOneFallsBack) {
  PrefetchLevel chosen;
  {
    ScopedEnv env(nullptr, "PW_PREFETCH_LEVEL");
    chosen = DefaultStreamPrefetchLevel();
  }
  {
    ScopedEnv env("l1", "PW_PREFETCH_LEVEL");
    EXPECT_EQ(DefaultStreamPrefetchLevel(), PrefetchLevel::kL1);
  }
  {
    ScopedEnv env("l2", "PW_PREFETCH_LEVEL");
    EXPECT_EQ(DefaultStreamPrefetchLevel(), PrefetchLevel::kL2);
  }
  for (const char* bad : {"L2", "l3", "2", " l1", "l1 "}) {
    ScopedEnv env(bad, "PW_PREFETCH_LEVEL");
    EXPECT_EQ(DefaultStreamPrefetchLevel(), chosen) << bad;
  }
}

}  // namespace
}  // namespace pw::cpu
