// Stop sequences over streamed text, checked against a direct oracle on random splits.
#include "services/router/stop_matcher.h"

#include <gtest/gtest.h>

#include <random>

namespace pw::router {
namespace {

// Oracle: scan end positions in order; at the first end where some stop sequence ends, cut
// before the longest one ending there.
std::string Cut(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t cut = std::string::npos;
    for (const auto& s : stops) {
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) {
        cut = std::min(cut, end - s.size());
      }
    }
    if (cut != std::string::npos) return text.substr(0, cut);
  }
  return text;
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("abc"), "abc");
  EXPECT_EQ(m.Flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, HoldsAPossiblePrefixUntilDecided) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.Push("abcE"), "abc");
  EXPECT_EQ(m.Push("N"), "");
  EXPECT_EQ(m.Push("x"), "ENx");  // not a stop after all
  EXPECT_EQ(m.Push("yEN"), "y");
  EXPECT_EQ(m.Push("D tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Push("more"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcher, FirstToCompleteWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.Push("hello world"), "hel");
  EXPECT_TRUE(m.stopped());
  // "bc" completes before "abcd" does: generation stops there.
  StopMatcher n({"abcd", "bc"});
  EXPECT_EQ(n.Push("xab"), "x");
  EXPECT_EQ(n.Push("cd"), "a");
  EXPECT_TRUE(n.stopped());
}

TEST(StopMatcher, FlushReleasesHeldText) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.Push("abST"), "ab");
  EXPECT_EQ(m.Flush(), "ST");
}

TEST(StopMatcher, RandomSplitsMatchOracle) {
  const uint32_t seed = 1234;
  std::mt19937 rng(seed);
  const std::string alphabet = "abAB \xc3\xa9";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    int len = rng() % 40;
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops;
    int ns = rng() % 3;
    for (int k = 0; k < ns; ++k) {
      std::string s;
      int sl = 1 + rng() % 3;
      for (int i = 0; i < sl; ++i) s += "abAB "[rng() % 5];
      stops.push_back(s);
    }
    StopMatcher m(stops);
    std::string out;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t n = 1 + rng() % 4;
      out += m.Push(text.substr(pos, n));
      pos += n;
    }
    out += m.Flush();
    ASSERT_EQ(out, Cut(text, stops))
        << "seed " << seed << " iter " << iter << " text '" << text << "'";
  }
}

}  // namespace
}  // namespace pw::router
