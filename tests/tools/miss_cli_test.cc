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
  EXPECT_EQ(sv["trace_complete"], "1");
  EXPECT_EQ(sv["trace_torn_bytes"], "0");
  EXPECT_EQ(s.output.find("cut short"), std::string::npos) << s.output;

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
  // ... also when the file is cut short after the damage: only the cut end may be incomplete.
  std::filesystem::resize_file(eval_trace, std::filesystem::file_size(eval_trace) - 48 - 7);
  bad = RunCommand(Bin("pw-sim") + " --trace " + eval_trace + " --residency 0.5");
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find("checksum mismatch"), std::string::npos) << bad.output;
  for (const std::string& f : {gen_trace, eval_trace}) std::filesystem::remove(f);
}

// The expert-miss paper's setting: a synthetic qwen3_next of 512 experts top-10 (made by the
// built make_synthetic_moe at a small hidden size, 3 of its 4 layers Gated DeltaNet, the
// embedded model's tokenizer beside it): pw-generate records a trace pw-sim replays at 25 %
// residency (128 of 512 resident); pw-eval runs the miss policies, and LYNX at batch 4 (k/N =
// 10/512 gives its bins) with the miss hook after it, which counts exactly 10 experts a token
// and layer in what LYNX returned.
TEST(MissCli, Qwen3NextOf512ExpertsRunsThroughSimMissesAndLynx) {
  const std::string tokenizer = std::string(PW_SOURCE_DIR) + "/models/tiny-moe/tokenizer.json";
  const std::string dir = ::testing::TempDir() + "/pw_miss_cli_qwen3_next";
  std::filesystem::remove_all(dir);
  CommandResult m = RunCommand(Bin("make_synthetic_moe") + " --out " + dir +
                               " --type qwen3_next --layers 4 --hidden 64 --expert-ffn 16 --vocab 4096"
                               " --linear-key-heads 2 --linear-value-heads 4 --linear-head-dim 16");
  ASSERT_EQ(m.status, 0) << m.output;
  std::filesystem::copy_file(tokenizer, dir + "/tokenizer.json");
  const std::string trace = dir + "/gen.trace";
  CommandResult g = RunCommand(Bin("pw-generate") + " --model " + dir +
                               " --prompt 'In the beginning' --max-tokens 12 --record-trace " + trace);
  ASSERT_EQ(g.status, 0) << g.output;
  CommandResult s = RunCommand(Bin("pw-sim") + " --trace " + trace + " --residency 0.25 --miss-policy speed-first");
  ASSERT_EQ(s.status, 0) << s.output;
  EXPECT_NE(s.output.find("512 experts top-10"), std::string::npos) << s.output;
  auto sv = Values(s.output);
  EXPECT_EQ(sv["capacity"], "128");
  EXPECT_EQ(sv["trace_complete"], "1");
  EXPECT_EQ(std::stoll(sv["slots"]), std::stoll(sv["tokens"]) * 4 * 10) << s.output;
  EXPECT_GT(std::stoll(sv["substitutions"]), 0);

  const std::string text = Text();
  const std::string eval = Bin("pw-eval") + " ppl --model " + dir + " --text " + text + " --ctx 64";
  CommandResult q = RunCommand(eval + " --residency 0.25 --miss-policy quality-first");
  ASSERT_EQ(q.status, 0) << q.output;
  auto qv = Values(q.output);
  EXPECT_EQ(qv["resident_per_layer"], "128");
  EXPECT_EQ(std::stoll(qv["misses_slots"]), std::stoll(qv["misses_token_layers"]) * 10);
  EXPECT_GT(std::stoll(qv["misses_substitutions"]), 0);

  CommandResult l = RunCommand(eval + " --batch 4 --lynx --residency 0.25 --miss-policy fetch-every-miss");
  ASSERT_EQ(l.status, 0) << l.output;
  auto lv = Values(l.output);
  EXPECT_NE(lv["remap"].find("default from k/N"), std::string::npos) << l.output;
  EXPECT_GT(std::stoll(lv["remapped_layer_calls"]), 0) << l.output;
  EXPECT_GT(std::stoll(lv["misses_token_layers"]), 0);
  EXPECT_EQ(std::stoll(lv["misses_slots"]), std::stoll(lv["misses_token_layers"]) * 10) << l.output;
  std::filesystem::remove_all(dir);
}

// A trace cut inside its last layer record (a writer stopped by a full disk or killed) replays
// its whole records: exit 0, a warning on stderr naming the torn record, and the output's
// trace_complete 0 / trace_layer_records / trace_torn_bytes; the same in a sweep (stderr).
TEST(MissCli, TornTraceReplaysItsWholeRecords) {
  if (!std::filesystem::exists(Tiny() + "/model.safetensors")) GTEST_SKIP() << "no tiny model";
  const std::string trace = ::testing::TempDir() + "/pw_miss_cli_torn.trace";
  CommandResult g =
      RunCommand(Bin("pw-generate") + " --model " + Tiny() +
                 " --prompt 'In the beginning' --max-tokens 12 --record-trace " + trace);
  ASSERT_EQ(g.status, 0) << g.output;
  const std::string sim =
      Bin("pw-sim") + " --trace " + trace + " --residency 0.25 --miss-policy speed-first";
  CommandResult whole = RunCommand(sim);
  ASSERT_EQ(whole.status, 0) << whole.output;
  auto wv = Values(whole.output);
  ASSERT_EQ(wv["trace_complete"], "1");
  const long long records = std::stoll(wv["trace_layer_records"]);
  ASSERT_GT(records, 1);
  // The end record is 48 bytes: 7 more cut into the last layer record (decode steps of one
  // token: 16 + 16 + 12 + 2 * 32 + 6 * 4 = 132 bytes).
  const auto size = std::filesystem::file_size(trace);
  std::filesystem::resize_file(trace, size - 48 - 7);
  CommandResult torn = RunCommand(sim);
  ASSERT_EQ(torn.status, 0) << torn.output;
  auto tv = Values(torn.output);
  EXPECT_EQ(tv["trace_complete"], "0");
  EXPECT_EQ(tv["trace_layer_records"], std::to_string(records - 1));
  EXPECT_EQ(tv["trace_torn_bytes"], std::to_string(132 - 7));
  EXPECT_GT(std::stoll(tv["slots"]), 0);
  EXPECT_LT(std::stoll(tv["slots"]), std::stoll(wv["slots"]));
  const std::string warn =
      "pw-sim: warning: " + trace +
      ": cut short (no end record; the writer did not finish): " + std::to_string(records - 1) +
      " whole layer records read (" + std::to_string(size - 48 - 132) + " bytes); record " +
      std::to_string(records - 1) + " at byte " + std::to_string(size - 48 - 132) +
      " is torn (125 of 132 bytes), ignored";
  EXPECT_NE(torn.output.find(warn), std::string::npos) << torn.output;
  CommandResult sweep =
      RunCommand(Bin("pw-sim") + " --trace " + trace + " --sweep --residencies 0.5");
  EXPECT_EQ(sweep.status, 0) << sweep.output;
  EXPECT_NE(sweep.output.find(warn), std::string::npos) << sweep.output;
  // Cut inside the header: nothing to replay.
  std::filesystem::resize_file(trace, 40);
  CommandResult none = RunCommand(sim);
  EXPECT_EQ(none.status, 1) << none.output;
  EXPECT_NE(none.output.find("smaller than the 64-byte router trace header"), std::string::npos)
      << none.output;
  std::filesystem::remove(trace);
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
  EXPECT_NE(r.output.find(cfg + ":3:1: evictoin: unknown key"), std::string::npos) << r.output;
  r = RunCommand(eval + " --miss-config /nonexistent/m.yaml");
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("/nonexistent/m.yaml"), std::string::npos) << r.output;
  r = RunCommand(Bin("pw-sim") + " --trace /nonexistent/x.trace --residency 0.25");
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("/nonexistent/x.trace"), std::string::npos) << r.output;
  // A bound below any trace with a record is refused as the flags are parsed; one that fits
  // another model's record but not the tiny model's (244 bytes) when the writer starts.
  r = RunCommand(Bin("pw-generate") + " --model " + Tiny() + " --prompt hi --record-trace " +
                 ::testing::TempDir() + "/pw_miss_cli_small.trace --trace-max-mb 0.0001");
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("--trace-max-mb"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("holds no record"), std::string::npos) << r.output;
  r = RunCommand(Bin("pw-generate") + " --model " + Tiny() + " --prompt hi --record-trace " +
                 ::testing::TempDir() + "/pw_miss_cli_small.trace --trace-max-mb 0.0002");
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("a bound of 200 bytes holds no record"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("takes 244 bytes"), std::string::npos) << r.output;
  r = RunCommand(Bin("pw-generate") + " --model " + Tiny() + " --prompt hi --record-trace /nonexistent/dir/t.trace");
  EXPECT_GT(r.status, 0);
  EXPECT_NE(r.output.find("/nonexistent/dir/t.trace"), std::string::npos) << r.output;
}

// A --miss-config file is read through the declared miss options (policies/misses/
// miss_options.h) as a node file's `misses:` map is: a bad key, type or value is refused with
// file:line:col. Flags given on the command line win over the file, key by key; a budget flag
// replaces the file's budget; a file may leave the budget to a flag. Over a synthetic trace
// (16 experts, top-2, 2 layers of 3 * 64 * 32 bf16 weights: 12288 bytes an expert), no model.
TEST(MissCli, MissConfigFileIsCheckedAndFlagsWin) {
  const std::string dir = ::testing::TempDir();
  const std::string trace = dir + "/pw_miss_cli_synth.trace";
  CommandResult g = RunCommand(Bin("pw-sim") + " --synthesize " + trace +
                               " --layers 2 --experts 16 --top-k 2 --hidden 64 --ffn 32 --steps 200");
  ASSERT_EQ(g.status, 0) << g.output;
  const std::string sim = Bin("pw-sim") + " --trace " + trace + " --miss-config ";
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  // Refusals, each naming the file, line and column and the key.
  struct Bad {
    const char* text;
    const char* want;
  };
  for (const Bad& b : {
           Bad{"policy: speed-first\nresidency: 0.25\nevictoin: lru\n",
               ":3:1: evictoin: unknown key (known keys: policy, eviction, threshold,"},
           Bad{"policy: speed-first\nthreshold: high\nresidency: 0.25\n",
               ":2:12: threshold: expected a number, got 'high'"},
           Bad{"policy: speed-first\nresidency_bytes: lots\n",
               ":2:18: residency_bytes: expected an integer"},
           Bad{"residency: 1.5\n", ":1:12: residency: 1.5 is out of range"},
           Bad{"eviction: fifo\nresidency: 0.5\n",
               ":1:11: eviction: 'fifo' is not one of: lfu, lru, score-ema"},
           Bad{"residency: 0.5\nresidency_bytes: 100000\n",
               ":1:1: (root): residency and residency_bytes exclude each other"},
       }) {
    const std::string cfg = write("pw_miss_cli_bad.yaml", b.text);
    CommandResult r = RunCommand(sim + cfg);
    EXPECT_EQ(r.status, 1) << b.text << r.output;
    EXPECT_NE(r.output.find(cfg + b.want), std::string::npos) << b.text << r.output;
  }

  // The file alone.
  const std::string cfg =
      write("pw_miss_cli_flags.yaml", "policy: speed-first\neviction: lru\nresidency: 0.5\n");
  CommandResult r = RunCommand(sim + cfg);
  ASSERT_EQ(r.status, 0) << r.output;
  auto v = Values(r.output);
  EXPECT_EQ(v["capacity"], "8");
  const std::string file_policy = v["policy"];
  EXPECT_NE(file_policy.find(" lru"), std::string::npos) << file_policy;
  // Flags win, key by key: the budget and the eviction from flags, the preset from the file.
  r = RunCommand(sim + cfg + " --residency 0.25 --miss-eviction score-ema");
  ASSERT_EQ(r.status, 0) << r.output;
  v = Values(r.output);
  EXPECT_EQ(v["capacity"], "4");
  EXPECT_NE(v["policy"].find(" score-ema("), std::string::npos) << v["policy"];
  EXPECT_EQ(v["policy"].substr(0, v["policy"].find(' ')), file_policy.substr(0, file_policy.find(' ')));
  // A budget flag of the other kind replaces the file's budget: 4 experts of each of 2 layers.
  r = RunCommand(sim + cfg + " --residency-bytes " + std::to_string(4 * 2 * 12288));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(Values(r.output)["capacity"], "4");
  // A file that names a policy may leave its budget to a flag.
  r = RunCommand(sim + write("pw_miss_cli_nobudget.yaml", "policy: speed-first\n") + " --residency 0.25");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(Values(r.output)["capacity"], "4");
  std::filesystem::remove(trace);
}

}  // namespace
