// API key sources and the constant-time comparison.
#include "services/router/api_keys.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

namespace pw::router {
namespace {

TEST(ApiKeys, CombinesFlagsFileAndEnvironment) {
  const std::string path = ::testing::TempDir() + "/pw_api_keys.txt";
  {
    std::ofstream f(path);
    f << "# operators\nfile-key-1\n\n  file-key-2  \nflag-key\n";
  }
  auto keys = LoadApiKeys({"flag-key"}, path, " env-a , env-b,");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(*keys,
            (std::vector<std::string>{"flag-key", "file-key-1", "file-key-2", "env-a", "env-b"}));
  std::remove(path.c_str());
  auto none = LoadApiKeys({}, "", nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(ApiKeys, BadKeysAreRefusedWithoutRepeatingThem) {
  auto missing = LoadApiKeys({}, "/nonexistent/keys", nullptr);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/keys"), std::string::npos);
  auto spaced = LoadApiKeys({"secret with space"}, "", nullptr);
  ASSERT_FALSE(spaced.ok());
  EXPECT_EQ(spaced.status().message().find("secret"), std::string::npos);
  EXPECT_NE(spaced.status().message().find("--api-key #1"), std::string::npos);
  EXPECT_FALSE(LoadApiKeys({""}, "", nullptr).ok());
  auto ctl = LoadApiKeys({}, "", "ok-key,bad\x01key");
  ASSERT_FALSE(ctl.ok());
  EXPECT_NE(ctl.status().message().find("PW_API_KEY entry 2"), std::string::npos);
}

TEST(ApiKeys, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("sk-abc", "sk-abc"));
  EXPECT_FALSE(ConstantTimeEquals("sk-abd", "sk-abc"));
  EXPECT_FALSE(ConstantTimeEquals("sk-ab", "sk-abc"));    // prefix
  EXPECT_FALSE(ConstantTimeEquals("sk-abcd", "sk-abc"));  // longer
  EXPECT_FALSE(ConstantTimeEquals("", "sk-abc"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("sk-abc\0", 7), "sk-abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

// The work done does not depend on where the first difference is: a presented key differing
// in its first byte and one differing in its last take the same number of comparisons. Timed
// as the minimum over many rounds of many calls so scheduling noise falls out; the bound is
// loose (a early-exit compare differs by the key length, ~100x here).
TEST(ApiKeys, ComparisonTimeDoesNotDependOnWhereKeysDiffer) {
  const std::string key(4096, 'k');
  std::string first = key, last = key;
  first.front() = 'x';
  last.back() = 'x';
  auto time_of = [&](const std::string& presented) {
    double best = 1e30;
    for (int round = 0; round < 30; ++round) {
      auto t0 = std::chrono::steady_clock::now();
      bool any = false;
      for (int i = 0; i < 200; ++i) any |= ConstantTimeEquals(presented, key);
      auto t1 = std::chrono::steady_clock::now();
      EXPECT_FALSE(any);
      best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    }
    return best;
  };
  const double t_first = time_of(first), t_last = time_of(last);
  EXPECT_LT(t_last / t_first, 3.0) << t_first << " s vs " << t_last << " s";
  EXPECT_LT(t_first / t_last, 3.0) << t_first << " s vs " << t_last << " s";
}

}  // namespace
}  // namespace pw::router
