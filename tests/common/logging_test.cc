#include "common/logging.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace pw {
namespace {

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([this](std::string_view line) { lines_.emplace_back(line); });
    saved_ = GetLogLevel();
  }
  void TearDown() override {
    SetLogSink(nullptr);
    SetLogLevel(saved_);
    SetLogProcessTag("pw");
  }
  std::vector<std::string> lines_;  // written under the log mutex
  LogLevel saved_ = LogLevel::kInfo;
};

TEST_F(LoggingTest, FormatsOneLineWithTimestampTagAndLocation) {
  SetLogLevel(LogLevel::kInfo);
  SetLogProcessTag("router");
  PW_LOG(INFO) << "hello " << 42;
  ASSERT_EQ(lines_.size(), 1u);
  std::regex re(
      R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z I router \d+:\d+ logging_test\.cc:\d+\] hello 42\n$)");
  EXPECT_TRUE(std::regex_match(lines_[0], re)) << lines_[0];
}

TEST_F(LoggingTest, DropsBelowLevelWithoutEvaluatingArguments) {
  SetLogLevel(LogLevel::kWarning);
  int evaluated = 0;
  auto side_effect = [&] { return ++evaluated; };
  PW_LOG(INFO) << side_effect();
  PW_LOG(DEBUG) << side_effect();
  EXPECT_EQ(evaluated, 0);
  EXPECT_TRUE(lines_.empty());
  PW_LOG(WARNING) << side_effect();
  PW_LOG(ERROR) << "e";
  EXPECT_EQ(evaluated, 1);
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_NE(lines_[0].find(" W "), std::string::npos);
  EXPECT_NE(lines_[1].find(" E "), std::string::npos);
}

TEST_F(LoggingTest, WorksInIfElseWithoutBraces) {
  SetLogLevel(LogLevel::kDebug);
  bool flag = false;
  if (flag)
    PW_LOG(INFO) << "then";
  else
    PW_LOG(INFO) << "else";
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find("] else"), std::string::npos);
}

TEST_F(LoggingTest, ConcurrentLinesNeverInterleave) {
  SetLogLevel(LogLevel::kInfo);
  constexpr int kThreads = 4, kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kPerThread; ++i) PW_LOG(INFO) << "thread " << t << " msg " << i << " end";
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(lines_.size(), static_cast<size_t>(kThreads * kPerThread));
  std::regex re(R"(.*\] thread \d msg \d+ end\n$)");
  for (const auto& l : lines_) ASSERT_TRUE(std::regex_match(l, re)) << l;
}

TEST(LogSafe, KeepsPrintableAsciiAndEscapesEveryOtherByte) {
  EXPECT_EQ(LogSafe("decode-0"), "decode-0");
  EXPECT_EQ(LogSafe(std::string("a\nb\x00" "c\x7f\xe9'", 8)), "a\\x0ab\\x00c\\x7f\\xe9'");
  EXPECT_EQ(LogSafe("back\\slash"), "back\\x5cslash");  // no '\' left to read as an escape
  EXPECT_EQ(LogSafe(""), "");
}

TEST_F(LoggingTest, AForgedLineBreakStaysInsideItsLine) {
  SetLogLevel(LogLevel::kInfo);
  PW_LOG(INFO) << "peer '" << LogSafe("x\n2026-01-01T00:00:00.000000Z E router 1:1 a.cc:1] forged") << "'";
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_EQ(lines_[0].find('\n'), lines_[0].size() - 1) << lines_[0];
}

TEST(LogLevelParse, AcceptsKnownNamesOnly) {
  LogLevel l;
  EXPECT_TRUE(ParseLogLevel("DEBUG", &l));
  EXPECT_EQ(l, LogLevel::kDebug);
  EXPECT_TRUE(ParseLogLevel("Warn", &l));
  EXPECT_EQ(l, LogLevel::kWarning);
  EXPECT_TRUE(ParseLogLevel("error", &l));
  EXPECT_EQ(l, LogLevel::kError);
  EXPECT_FALSE(ParseLogLevel("verbose", &l));
  EXPECT_FALSE(ParseLogLevel("", &l));
}

// The level comes from PW_LOG_LEVEL at first use; each case runs in a fresh process.
TEST(LogLevelEnvDeathTest, ReadFromEnvironmentAtFirstUse) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("PW_LOG_LEVEL", "ERROR", 1);
        std::exit(GetLogLevel() == LogLevel::kError ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        setenv("PW_LOG_LEVEL", "debug", 1);
        PW_LOG(DEBUG) << "debug-line-visible";
        std::exit(GetLogLevel() == LogLevel::kDebug ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "debug-line-visible");
  EXPECT_EXIT(
      {
        setenv("PW_LOG_LEVEL", "loud", 1);
        std::exit(GetLogLevel() == LogLevel::kInfo ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "PW_LOG_LEVEL=loud is not one of");
}

}  // namespace
}  // namespace pw
