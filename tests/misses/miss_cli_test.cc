// pw-eval, pw-generate and pw-sim with the miss and trace flags, run as built binaries on the
// tiny model: a trace recorded by pw-generate and pw-eval replays in pw-sim; pw-eval's
// fetch-every-miss emulation scores the all-resident perplexity; bad flags and a damaged trace
// are refused with a message naming the problem.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "tests/common/run_command.h"

namespace {

using pw::testing::CommandResult;
using pw::testing::RunCommand;

std::string Bin(const char* name) { return std::string(PW_BINARY_DIR) + "/bin/" + name; }
std::string Tiny() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }

// "key value" lines.
std::map<std::string, std::string> Values(const std::string& out) {
  std::map<std::string, std::string> m;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t sp = line.find(' ');
    if (sp != std::string::npos) m[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return m;
}

std::string Text() {
  const std::string path = ::testing::TempDir() + "/pw_miss_cli.txt";
  std::ofstream f(path);
  for (int i = 0; i < 30; ++i) {
    f << "The quick brown fox jumps over the lazy dog, and the dog sleeps in the sun. "
         "int main(void) { return 0; }\n";
  }
  return path;
}

TEST(MissCli, RecordReplayAndEmulate) {
  if (!std::filesystem::exists(Tiny() + "/model.safetensors")) GTEST_SKIP() << "no tiny model";
  const std::string dir = ::testing::TempDir();
  const std::string gen_trace = dir + "/pw_miss_cli_gen.trace", eval_trace = dir + "/pw_miss_cli_eval.trace";
  CommandResult g = RunCommand(Bin("pw-generate") + " --model " + Tiny() +
                      " --prompt 'In the beginning' --max-tokens 12 --record-trace " + gen_trace);
  ASSERT_EQ(g.status, 0) << g.output;
  CommandResult s = RunCommand(Bin("pw-sim") + " --trace " + gen_trace + " --residency 0.25 --miss-policy speed-first");
  ASSERT_EQ(s.status, 0) << s.output;
  auto sv = Values(s.output);
  EXPECT_EQ(sv["capacity"], "8");
  EXPECT_GT(std::stoll(sv["slots"]), 0);

  const std::string text = Text();
  CommandResult base = RunCommand(Bin("pw-eval") + " ppl --model " + Tiny() + " --text " + text +
                         " --ctx 64 --record-trace " + eval_trace);
  ASSERT_EQ(base.status, 0) << base.output;
  auto bv = Values(base.output);
  CommandResult fem = RunCommand(Bin("pw-eval") + " ppl --model " + Tiny() + " --text " + text +
                        " --ctx 64 --residency 0.25 --miss-policy fetch-every-miss");
  ASSERT_EQ(fem.status, 0) << fem.output;
  auto fv = Values(fem.output);
  EXPECT_EQ(fv["ppl"], bv["ppl"]);  // bf16 fetches are exact
  EXPECT_EQ(fv["misses_substitutions"], "0");
  // The same run from a --miss-config file, the flag overriding the file's eviction.
  const std::string cfg = dir + "/pw_miss_cli_ok.yaml";
  std::ofstream(cfg) << "policy: quality-first\nresidency: 0.25\neviction: score-ema\n";
  CommandResult qf = RunCommand(Bin("pw-eval") + " ppl --model " + Tiny() + " --text " + text +
                       " --ctx 64 --miss-config " + cfg + " --miss-eviction lru");
  ASSERT_EQ(qf.status, 0) << qf.output;
  auto qv = Values(qf.output);
  EXPECT_EQ(qv["resident_per_layer"], "8");
  EXPECT_NE(qv["ppl"], bv["ppl"]);
  EXPECT_EQ(qv["misses_first_choice_substitutions"], "0");
  EXPECT_NE(qv["miss_policy"].find("lru"), std::string::npos) << qv["miss_policy"];

  // A sweep over the eval trace writes CSV, JSON and SVG.
  CommandResult sw = RunCommand(Bin("pw-sim") + " --trace " + eval_trace + " --sweep --residencies 0.25,0.5 --csv " +
                       dir + "/pw_miss_cli.csv --json " + dir + "/pw_miss_cli.json --svg " + dir + "/pw_miss_cli.svg");
  ASSERT_EQ(sw.status, 0) << sw.output;
  std::ifstream csv(dir + "/pw_miss_cli.csv");
  int lines = 0;
  for (std::string l; std::getline(csv, l);) ++lines;
  EXPECT_EQ(lines, 1 + 2 * 6);  // header + 2 budgets x 6 presets
  EXPECT_TRUE(std::filesystem::file_size(dir + "/pw_miss_cli.svg") > 0);

  // A damaged trace is refused by name.
  {
    std::fstream f(eval_trace, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x55');
  }
  CommandResult bad = RunCommand(Bin("pw-sim") + " --trace " + eval_trace + " --residency 0.5");
  EXPECT_GT(bad.status, 0) << bad.output;
  EXPECT_NE(bad.output.find("checksum mismatch"), std::string::npos) << bad.output;
  std::filesystem::resize_file(gen_trace, std::filesystem::file_size(gen_trace) - 5);
  bad = RunCommand(Bin("pw-sim") + " --trace " + gen_trace + " --residency 0.5");
  EXPECT_GT(bad.status, 0) << bad.output;
  EXPECT_NE(bad.output.find("truncated"), std::string::npos) << bad.output;
  for (const std::string& f : {gen_trace, eval_trace}) std::filesystem::remove(f);
}

TEST(MissCli, RejectsBadFlags) {
  if (!std::filesystem::exists(Tiny() + "/model.safetensors")) GTEST_SKIP() << "no tiny model";
  const std::string text = Text();
  const std::string eval = Bin("pw-eval") + " ppl --model " + Tiny() + " --text " + text + " --ctx 64";
  CommandResult r = RunCommand(eval + " --miss-policy quality-first");
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("needs --residency"), std::string::npos) << r.output;
  r = RunCommand(eval + " --residency 0.05 --miss-policy quality-first");  // 2 experts < top-4
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("outside [top_k, experts]"), std::string::npos) << r.output;
  r = RunCommand(eval + " --residency 0.25 --miss-policy fastest");
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("quality-first"), std::string::npos) << r.output;  // lists the presets
  r = RunCommand(eval + " --residency 0.25 --miss-eviction fifo");
  EXPECT_GT(r.status, 0) << r.output;
  const std::string cfg = ::testing::TempDir() + "/pw_miss_cli.yaml";
  std::ofstream(cfg) << "policy: speed-first\nresidency: 0.25\nevictoin: lru\n";
  r = RunCommand(eval + " --miss-config " + cfg);
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("unknown key 'evictoin'"), std::string::npos) << r.output;
  r = RunCommand(eval + " --miss-config /nonexistent/m.yaml");
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("/nonexistent/m.yaml"), std::string::npos) << r.output;
  r = RunCommand(Bin("pw-sim") + " --trace /nonexistent/x.trace --residency 0.25");
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("/nonexistent/x.trace"), std::string::npos) << r.output;
  r = RunCommand(Bin("pw-generate") + " --model " + Tiny() + " --prompt hi --record-trace /nonexistent/dir/t.trace");
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("/nonexistent/dir/t.trace"), std::string::npos) << r.output;
}

}  // namespace
