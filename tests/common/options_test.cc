// OptionSet: one declaration gives a flag and a YAML key with the same bounds; a flag overrides
// the file, the file overrides the default; bad keys and types name file:line:col.
#include "common/formats/options.h"

#include <gtest/gtest.h>

#include <memory>

#include <CLI/CLI.hpp>
#include <optional>

namespace pw::options {
namespace {

enum class Pace { kFree, kSteps };

struct DemoOptions {
  std::string model_dir;
  int port = 8000;
  double low = 0.05;
  bool fast = false;
  bool routing = true;
  uint64_t pool_bytes = 0;
  std::vector<int> layers;
  std::optional<double> residency;
  Pace pace = Pace::kFree;
  std::string endpoint;
};

void DeclareDemo(OptionSet* s, DemoOptions* o) {
  s->Add("model_dir", &o->model_dir, "model directory").Flag("--model").Shared().Required();
  s->Add("port", &o->port, "HTTP port").Range(1, 65535);
  s->Add("planner.low_watermark", &o->low, "low watermark").Flag("--planner-low").Range(0, 1);
  s->Add("fast", &o->fast, "go fast");
  s->Add("planner.use_routing", &o->routing, "routing statistics").Flag("--planner-no-routing").FlagSets(false);
  s->Add("pool_mb", &o->pool_bytes, "pool").Flag("--pool-bytes").Scale(int64_t{1} << 20);
  s->Add("lynx.exempt_layers", &o->layers, "exempt layers").Flag("--lynx-exempt").Range(0, 100);
  s->Add("misses.residency", &o->residency, "resident fraction").Flag("--residency").Range(0, 1);
  s->AddChoice("pace", &o->pace, {{"free", Pace::kFree}, {"steps", Pace::kSteps}}, "pacing");
  s->Add("endpoint", &o->endpoint, "derived endpoint").NoKey();
  s->AddCheck("planner", [](const config::ConfigValue& v) -> std::string {
    return v.Has("low_watermark") && v["low_watermark"].AsDouble() > 0.5 ? "low_watermark above 0.5" : "";
  });
}

config::Schema FileSchema(const OptionSet& s) {
  auto fields = s.SharedFields();
  fields.emplace_back("demo", s.SectionSchema({{"metrics_port", config::Schema::Int()}}));
  return config::Schema::Map(std::move(fields));
}

// Parses `args` as flags, then applies `yaml` (its `demo` section); returns the status.
Status Load(DemoOptions* o, OptionSet* s, std::vector<std::string> args, const std::string& yaml) {
  DeclareDemo(s, o);
  // The set asks the app's options later (Derive, CheckRequired): the app lives as long as the
  // test binary, as a process's app lives as long as main().
  static std::vector<std::unique_ptr<CLI::App>> apps;
  CLI::App& app = *apps.emplace_back(std::make_unique<CLI::App>());
  s->AddToCli(&app);
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::ParseError& e) {
    return InvalidArgument(std::string("flags: ") + e.what());
  }
  if (!yaml.empty()) {
    PW_ASSIGN_OR_RETURN(config::ConfigValue root, config::ParseYamlConfig(yaml, "demo.yaml", FileSchema(*s)));
    PW_RETURN_IF_ERROR(s->ApplyFile(root, root["demo"]));
  }
  return s->CheckRequired();
}

TEST(OptionSet, OneDeclarationGivesTheFlagAndTheKey) {
  DemoOptions a;
  OptionSet sa;
  ASSERT_TRUE(Load(&a, &sa, {"--model", "m", "--port", "9000", "--planner-low", "0.1", "--fast",
                             "--planner-no-routing", "--pool-bytes", "4096", "--lynx-exempt", "1,3",
                             "--residency", "0.25", "--pace", "steps"},
                   "")
                  .ok());
  DemoOptions b;
  OptionSet sb;
  Status st = Load(&b, &sb, {},
                   "model_dir: m\n"
                   "demo:\n"
                   "  port: 9000\n"
                   "  planner: {low_watermark: 0.1, use_routing: false}\n"
                   "  fast: true\n"
                   "  pool_mb: 2\n"
                   "  lynx: {exempt_layers: [1, 3]}\n"
                   "  misses: {residency: 0.25}\n"
                   "  pace: steps\n"
                   "  metrics_port: 9101\n");
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (const DemoOptions* o : {&a, &b}) {
    EXPECT_EQ(o->model_dir, "m");
    EXPECT_EQ(o->port, 9000);
    EXPECT_DOUBLE_EQ(o->low, 0.1);
    EXPECT_TRUE(o->fast);
    EXPECT_FALSE(o->routing);
    EXPECT_EQ(o->layers, (std::vector<int>{1, 3}));
    ASSERT_TRUE(o->residency.has_value());
    EXPECT_DOUBLE_EQ(*o->residency, 0.25);
    EXPECT_EQ(o->pace, Pace::kSteps);
  }
  EXPECT_EQ(a.pool_bytes, 4096u);           // the flag in the field's unit
  EXPECT_EQ(b.pool_bytes, 2u << 20);        // the key in MiB
  EXPECT_EQ(sb.Find("port")->source(), Option::Source::kFile);
  EXPECT_EQ(sb.Find("fast")->flag_names(), "--fast");
}

TEST(OptionSet, FlagsOverrideTheFileWhichOverridesDefaults) {
  DemoOptions o;
  OptionSet s;
  Status st = Load(&o, &s, {"--port", "7000"}, "model_dir: m\ndemo: {port: 9000, fast: true}\n");
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(o.port, 7000);
  EXPECT_TRUE(o.fast);
  EXPECT_DOUBLE_EQ(o.low, 0.05);  // neither: the struct's default
  EXPECT_EQ(s.Find("port")->source(), Option::Source::kFlag);
  EXPECT_EQ(s.Find("low_watermark"), nullptr);
  EXPECT_EQ(s.Find("planner.low_watermark")->source(), Option::Source::kDefault);
  // A derived value fills what neither gave.
  ASSERT_TRUE(s.Derive("endpoint", config::ConfigValue("tcp://h:1")).ok());
  EXPECT_EQ(o.endpoint, "tcp://h:1");
}

TEST(OptionSet, BoundsHoldForFlagsAndKeys) {
  {
    DemoOptions o;
    OptionSet s;
    Status st = Load(&o, &s, {"--model", "m", "--port", "70000"}, "");
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("--port"), std::string::npos) << st.ToString();
  }
  {
    DemoOptions o;
    OptionSet s;
    Status st = Load(&o, &s, {}, "model_dir: m\ndemo:\n  port: 70000\n");
    EXPECT_EQ(st.message(), "demo.yaml:3:9: demo.port: 70000 is out of range [1, 65535]") << st.ToString();
  }
  {
    DemoOptions o;
    OptionSet s;
    Status st = Load(&o, &s, {"--model", "m", "--pace", "later"}, "");
    EXPECT_FALSE(st.ok());
  }
  {
    DemoOptions o;
    OptionSet s;
    Status st = Load(&o, &s, {}, "model_dir: m\ndemo: {pace: later}\n");
    EXPECT_NE(st.message().find("demo.yaml:2:14: demo.pace: 'later' is not one of: free, steps"), std::string::npos)
        << st.ToString();
  }
}

TEST(OptionSet, BadKeysTypesAndChecksNameFileLineColumn) {
  struct Case {
    const char* yaml;
    const char* expect;
  } cases[] = {
      {"model_dir: m\ndemo:\n  prot: 1\n", "demo.yaml:3:3: demo.prot: unknown key"},
      {"model_dir: m\ndemo:\n  port: eighty\n", "demo.yaml:3:9: demo.port: expected an integer, got 'eighty'"},
      {"model_dir: m\ndemo:\n  fast: 3\n", "demo.yaml:3:9: demo.fast: expected true or false"},
      {"model_dir: m\ndemo:\n  planner: {low_watermark: 0.7}\n", "demo.yaml:3:12: demo.planner: low_watermark above 0.5"},
      {"model_dir: m\ndemo:\n  endpoint: x\n", "demo.yaml:3:3: demo.endpoint: unknown key"},  // NoKey
      {"demo: {}\n", "model_dir: required key is missing"},
  };
  for (const auto& c : cases) {
    DemoOptions o;
    OptionSet s;
    Status st = Load(&o, &s, {}, c.yaml);
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << c.yaml << "\n" << st.ToString();
  }
  // Required: neither the flag nor the key.
  DemoOptions o;
  OptionSet s;
  Status st = Load(&o, &s, {"--port", "1"}, "");
  EXPECT_NE(st.message().find("model_dir is required (--model or the key model_dir"), std::string::npos)
      << st.ToString();
}

TEST(OptionSet, DumpShowsEffectiveValuesNested) {
  DemoOptions o;
  OptionSet s;
  ASSERT_TRUE(Load(&o, &s, {"--model", "m", "--lynx-exempt", "2"}, "").ok());
  const std::string y = s.DumpYaml();
  EXPECT_NE(y.find("model_dir: m\n"), std::string::npos) << y;
  EXPECT_NE(y.find("port: 8000\n"), std::string::npos) << y;
  EXPECT_NE(y.find("planner:\n  low_watermark: 0.05\n  use_routing: true\n"), std::string::npos) << y;
  EXPECT_NE(y.find("lynx:\n  exempt_layers: [2]\n"), std::string::npos) << y;
  EXPECT_NE(y.find("pace: free\n"), std::string::npos) << y;
  EXPECT_EQ(y.find("residency"), std::string::npos) << "an unset optional is left out\n" << y;
  // The dump reads back through the same declarations.
  DemoOptions back;
  OptionSet sb;
  std::string indented;
  for (size_t pos = 0; pos < y.size();) {
    size_t nl = y.find('\n', pos);
    indented += "  " + y.substr(pos, nl - pos + 1);
    pos = nl + 1;
  }
  // endpoint has no key: drop it before reading back.
  std::string text = "model_dir: m\ndemo:\n";
  for (size_t pos = 0; pos < indented.size();) {
    size_t nl = indented.find('\n', pos);
    std::string line = indented.substr(pos, nl - pos + 1);
    if (line.find("model_dir") == std::string::npos && line.find("endpoint") == std::string::npos) text += line;
    pos = nl + 1;
  }
  Status st = Load(&back, &sb, {}, text);
  ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << text;
  EXPECT_EQ(back.layers, std::vector<int>{2});
}

}  // namespace
}  // namespace pw::options
