// The miss and trace options as declared once (policies/misses/miss_options.h, trace_options.h):
// a --miss-config file is checked against the declaration's schema (file:line:col), flags win
// over it key by key and a budget flag replaces its budget; a node file's `misses:` map needs
// its budget; a trace bound must hold a record, as a flag or in a file.
#include "policies/misses/miss_options.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "policies/misses/trace_options.h"
#include "policies/misses/trace_replay.h"

namespace pw::misses {
namespace {

// Parses `args` as the tools' flags, then reads a --miss-config file holding `yaml` (none when
// empty); returns the settings or the error.
Result<MissSettings> Tool(std::vector<std::string> args, const std::string& yaml) {
  if (!yaml.empty()) {
    const std::string path = ::testing::TempDir() + "/miss_options_test.yaml";
    std::ofstream(path) << yaml;
    args.push_back("--miss-config");
    args.push_back(path);
  }
  MissToolOptions o;
  options::OptionSet s;
  DeclareMissToolOptions(&s, &o);
  // The set asks the app's options whether a flag was given: the app outlives it (as main's).
  static std::vector<std::unique_ptr<CLI::App>> apps;
  CLI::App& app = *apps.emplace_back(std::make_unique<CLI::App>());
  s.AddToCli(&app);
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::ParseError& e) {
    return InvalidArgument(std::string("flags: ") + e.what());
  }
  PW_RETURN_IF_ERROR(LoadMissToolOptions(&s, &o));
  return o.settings;
}

TEST(MissOptions, FileGivesPresetAndOverrides) {
  auto s = ParseMissSettingsYaml(
      "policy: quality-first\neviction: lru\nadmission_beta: 0.7\nresidency: 0.25\n", "m.yaml");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto c = ToMissConfig(*s);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rule, MissRule::kThreshold);
  EXPECT_EQ(c->eviction, Eviction::kLru);
  EXPECT_FLOAT_EQ(c->admission_beta, 0.7f);
  EXPECT_DOUBLE_EQ(*s->residency, 0.25);
  EXPECT_FALSE(s->residency_bytes);
  EXPECT_DOUBLE_EQ(ToBudget(*s).fraction, 0.25);
  auto empty = ParseMissSettingsYaml("", "e.yaml");  // all defaults
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->policy, "");
  EXPECT_FALSE(empty->residency);
  // A policy without a budget: the tool's budget may come from a flag.
  EXPECT_TRUE(ParseMissSettingsYaml("policy: speed-first\n", "m.yaml").ok());
  // Values each key accepts but their combination does not: refused by the config's check.
  auto zero_decay = ParseMissSettingsYaml("policy: first-choice\ndecay: 0\n", "m.yaml");
  ASSERT_TRUE(zero_decay.ok()) << zero_decay.status().ToString();
  EXPECT_FALSE(ToMissConfig(*zero_decay).ok());
}

TEST(MissOptions, BadFileNamesLineAndColumn) {
  struct Bad {
    const char* text;
    const char* want;  // the message's start
  };
  for (const Bad& b : {
           Bad{"policy: speed-first\nevict: lru\n",
               "m.yaml:2:1: evict: unknown key (known keys: policy,"},
           Bad{"threshold: high\n", "m.yaml:1:12: threshold: expected a number, got 'high'"},
           Bad{"admission_delay: 1.5\n", "m.yaml:1:18: admission_delay: expected an integer"},
           Bad{"residency: 1.5\n", "m.yaml:1:12: residency: 1.5 is out of range [0, 1]"},
           Bad{"decay: 1.5\n", "m.yaml:1:8: decay: 1.5 is out of range [0, 1]"},
           Bad{"eviction: fifo\n",
               "m.yaml:1:11: eviction: 'fifo' is not one of: lfu, lru, score-ema"},
           Bad{"policy: \"\"\n", "m.yaml:1:9: policy: must not be empty"},
           Bad{"residency: 0.5\nresidency_bytes: 100\n",
               "m.yaml:1:1: (root): residency and residency_bytes exclude"},
           Bad{"[1, 2]\n", "m.yaml:1:1: (root): expected a map"},
           Bad{"misses:\n  policy: speed-first\n", "m.yaml:1:1: misses: unknown key"},
       }) {
    auto s = ParseMissSettingsYaml(b.text, "m.yaml");
    ASSERT_FALSE(s.ok()) << b.text;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << b.text;
    EXPECT_EQ(s.status().message().rfind(b.want, 0), 0u)
        << b.text << " -> " << s.status().message();
  }
  auto yaml = ParseMissSettingsYaml("policy: [\n", "m.yaml");
  ASSERT_FALSE(yaml.ok());
  EXPECT_NE(yaml.status().message().find("m.yaml:"), std::string::npos) << yaml.status().message();
  EXPECT_NE(yaml.status().message().find("bad YAML"), std::string::npos) << yaml.status().message();
}

TEST(MissOptions, FlagsWinOverTheFile) {
  const std::string file = "policy: quality-first\neviction: lru\nthreshold: 0.2\nresidency: 0.5\n";
  auto f = Tool({}, file);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(*f->eviction, "lru");
  // Key by key: the flags' eviction and fraction, the file's preset and threshold.
  auto s = Tool({"--miss-eviction", "score-ema", "--residency", "0.25"}, file);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->policy, "quality-first");
  EXPECT_EQ(*s->eviction, "score-ema");
  EXPECT_FLOAT_EQ(*s->threshold, 0.2f);
  EXPECT_DOUBLE_EQ(*s->residency, 0.25);
  // A budget flag of the other kind replaces the file's budget.
  s = Tool({"--residency-bytes", "1000000"}, file);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE(s->residency);
  EXPECT_EQ(*s->residency_bytes, 1000000u);
  EXPECT_EQ(ToBudget(*s).bytes, 1000000u);
  // A file that leaves its budget to a flag.
  s = Tool({"--residency", "0.25"}, "policy: speed-first\n");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->policy, "speed-first");
  EXPECT_DOUBLE_EQ(*s->residency, 0.25);
  // Both budgets as flags: refused by name, file or not.
  for (const std::string& yaml : {std::string(), file}) {
    s = Tool({"--residency", "0.25", "--residency-bytes", "1000"}, yaml);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("--residency and --residency-bytes"), std::string::npos)
        << s.status().message();
  }
  // The file is still checked where a flag gives the key.
  s = Tool({"--miss-eviction", "lru"}, "eviction: fifo\n");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(":1:11: eviction:"), std::string::npos)
      << s.status().message();
  // A file that cannot be read is named.
  MissToolOptions o;
  options::OptionSet set;
  DeclareMissToolOptions(&set, &o);
  o.config_file = "/nonexistent/m.yaml";
  const Status missing = LoadMissToolOptions(&set, &o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("/nonexistent/m.yaml"), std::string::npos) << missing.message();
}

// A node file's `misses:` map (the decode worker's declaration) must give a policy's budget.
TEST(MissOptions, NodeMapNeedsItsBudget) {
  MissSettings m;
  options::OptionSet s;
  DeclareMissOptions(&s, &m, "misses.");
  const config::Schema schema = s.SectionSchema();
  EXPECT_TRUE(
      config::ParseYamlConfig("misses: {policy: speed-first, residency: 0.25}\n", "n.yaml", schema)
          .ok());
  auto r = config::ParseYamlConfig("misses: {policy: speed-first}\n", "n.yaml", schema);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("n.yaml:1:9: misses: a policy needs a budget"),
            std::string::npos)
      << r.status().message();
}

TEST(TraceOptions, BoundHoldsARecord) {
  TraceOptions t;
  options::OptionSet s;
  DeclareTraceOptions(&s, &t);
  CLI::App app;
  s.AddToCli(&app);
  std::vector<std::string> args = {"t.trace", "--record-trace", "4", "--trace-sample"};
  app.parse(args);  // reversed, as CLI11 takes them: --trace-sample 4 --record-trace t.trace
  EXPECT_EQ(t.path, "t.trace");
  EXPECT_EQ(t.sample, 4);
  EXPECT_FALSE(t.max_mb);  // unbounded
  EXPECT_EQ(t.max_bytes(), 0u);
  EXPECT_TRUE(CheckTraceOptions(t).ok());
  t.max_mb = 0.000164;
  EXPECT_TRUE(CheckTraceOptions(t).ok());
  EXPECT_EQ(t.max_bytes(), 164u);
  for (double mb : {0.0001, 0.0}) {
    t.max_mb = mb;
    const Status st = CheckTraceOptions(t);
    ASSERT_FALSE(st.ok()) << mb;
    EXPECT_EQ(st.message().rfind("--trace-max-mb ", 0), 0u) << st.message();
    EXPECT_NE(st.message().find("holds no record"), std::string::npos) << st.message();
  }
  // In a file: the key is named with its place; a trace map needs its path.
  const config::Schema schema = s.SectionSchema();
  auto r = config::ParseYamlConfig("trace: {path: x, max_mb: 0.0001}\n", "n.yaml", schema);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(
      r.status().message().find("n.yaml:1:26: trace.max_mb: 0.0001 MB (100 bytes) holds no record"),
      std::string::npos)
      << r.status().message();
  r = config::ParseYamlConfig("trace: {sample: 2}\n", "n.yaml", schema);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("trace: a trace needs its path"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace pw::misses
