#include "common/formats/yaml_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "tests/common/test_util.h"

namespace pw::config {
namespace {

using ::testing::HasSubstr;

// A schema shaped like the cluster launcher's (deploy/local.yaml).
Schema ClusterSchema() {
  auto distinct_ports = [](const ConfigValue& workers) -> std::string {
    std::set<int64_t> seen;
    for (const auto& w : workers.Items()) {
      if (!seen.insert(w["port"].AsInt()).second) {
        return "port " + std::to_string(w["port"].AsInt()) + " is used twice";
      }
    }
    return "";
  };
  return Schema::Map({
      {"router", Schema::Map({
                     {"host", Schema::String().Default("127.0.0.1")},
                     {"port", Schema::Int().Range(1, 65535).Default(8000)},
                     {"max_queue", Schema::Int().Min(1).Default(256)},
                 })},
      {"workers",
       Schema::List(Schema::Map({
                        {"kind", Schema::String().OneOf({"prefill", "decode"}).Required()},
                        {"port", Schema::Int().Range(1, 65535).Required()},
                        {"threads", Schema::Int().Range(1, 256).Default(2)},
                    }))
           .Size(1, 64)
           .Check(distinct_ports)
           .Required()},
      {"broker", Schema::Map({
                     {"port", Schema::Int().Range(1, 65535).Required()},
                     {"host_store_gib", Schema::Double().Range(0.0, 1024.0).Default(4.0)},
                 })},
      {"model_dir", Schema::String().NonEmpty().Required()},
      {"kv_blocks", Schema::Int().Min(1).Default(4096)},
      {"verbose", Schema::Bool().Default(false)},
      {"bits", Schema::MapOf(Schema::Int().Range(3, 8))},
  });
}

const char* kGood = R"(# one node
router:
  port: 8080
workers:
  - kind: prefill
    port: 9001
  - kind: decode
    port: 9002
    threads: 4
broker:
  port: 9100
  host_store_gib: 2
model_dir: models/tiny-moe
verbose: yes
bits:
  layer0: 4
  layer1: 8
)";

Status ParseError(const std::string& text) {
  auto r = ParseYamlConfig(text, "local.yaml", ClusterSchema());
  EXPECT_FALSE(r.ok()) << "accepted:\n" << text;
  return r.ok() ? Status::Ok() : r.status();
}

TEST(YamlConfigTest, ParsesValuesAndFillsDefaults) {
  auto r = ParseYamlConfig(kGood, "local.yaml", ClusterSchema());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ConfigValue& c = *r;
  EXPECT_EQ(c["router"]["port"].AsInt(), 8080);
  EXPECT_EQ(c["router"]["host"].AsString(), "127.0.0.1");  // default
  EXPECT_EQ(c["router"]["max_queue"].AsInt(), 256);
  ASSERT_EQ(c["workers"].size(), 2u);
  EXPECT_EQ(c["workers"][0]["kind"].AsString(), "prefill");
  EXPECT_EQ(c["workers"][0]["threads"].AsInt(), 2);
  EXPECT_EQ(c["workers"][1]["threads"].AsInt(), 4);
  EXPECT_DOUBLE_EQ(c["broker"]["host_store_gib"].AsDouble(), 2.0);  // int accepted for double
  EXPECT_EQ(c["model_dir"].AsString(), "models/tiny-moe");
  EXPECT_EQ(c["kv_blocks"].AsInt(), 4096);
  EXPECT_TRUE(c["verbose"].AsBool());
  ASSERT_EQ(c["bits"].size(), 2u);
  EXPECT_EQ(c["bits"].Entries()[1].first, "layer1");
  EXPECT_EQ(c["bits"]["layer1"].AsInt(), 8);

  // Origins: path and 1-based line/column; defaults have line 0.
  EXPECT_EQ(c["workers"][1]["port"].path(), "workers[1].port");
  EXPECT_EQ(c["workers"][1]["port"].line(), 8);
  EXPECT_EQ(c["workers"][1]["port"].column(), 11);
  EXPECT_EQ(c["router"]["host"].line(), 0);
  Status e = c["model_dir"].Error("no such directory");
  EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.message(), "local.yaml:13:12: model_dir: no such directory");
}

TEST(YamlConfigTest, AbsentOptionalMapGetsDefaultsOrStaysAbsent) {
  const char* text = "workers: [{kind: decode, port: 1}]\nmodel_dir: m\n";
  auto r = ParseYamlConfig(text, "local.yaml", ClusterSchema());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["router"]["port"].AsInt(), 8000);  // router map filled from defaults
  EXPECT_FALSE(r->Has("broker"));                   // broker has a required key, so it stays absent
  EXPECT_FALSE(r->Has("bits"));
  // A null value counts as absent.
  auto n = ParseYamlConfig(std::string(text) + "kv_blocks:\n", "local.yaml", ClusterSchema());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ((*n)["kv_blocks"].AsInt(), 4096);
}

TEST(YamlConfigTest, OutOfRangeNamesPathAndLine) {
  std::string text = kGood;
  text.replace(text.find("9002"), 4, "70000");
  Status s = ParseError(text);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "local.yaml:8:11: workers[1].port: 70000 is out of range [1, 65535]");
}

TEST(YamlConfigTest, UnknownKey) {
  std::string text = kGood;
  text.replace(text.find("  port: 8080"), 11, "  prot: 8080");
  Status s = ParseError(text);
  EXPECT_EQ(s.message(),
            "local.yaml:3:3: router.prot: unknown key (known keys: host, port, max_queue)");
  s = ParseError(std::string(kGood) + "extra: 1\n");
  EXPECT_THAT(s.message(), HasSubstr("local.yaml:18:1: extra: unknown key"));
}

TEST(YamlConfigTest, WrongTypes) {
  std::string text = kGood;
  text.replace(text.find("8080"), 4, "\"8080\"");
  EXPECT_THAT(ParseError(text).message(),
              HasSubstr("local.yaml:3:9: router.port: expected an integer, got the quoted "
                        "string \"8080\""));

  text = kGood;
  text.replace(text.find("8080"), 4, "80.5");
  EXPECT_THAT(ParseError(text).message(),
              HasSubstr("router.port: expected an integer, got '80.5'"));

  text = kGood;
  text.replace(text.find("verbose: yes"), 12, "verbose: maybe");
  EXPECT_THAT(ParseError(text).message(),
              HasSubstr("local.yaml:14:10: verbose: expected true or false, got 'maybe'"));

  text = kGood;
  text.replace(text.find("model_dir: models/tiny-moe"), 26, "model_dir: [a, b]");
  EXPECT_THAT(ParseError(text).message(), HasSubstr("model_dir: expected a string, got a list"));

  EXPECT_THAT(ParseError("router: 5\nworkers: []\nmodel_dir: m\n").message(),
              HasSubstr("local.yaml:1:9: router: expected a map, got '5'"));
  EXPECT_THAT(ParseError("workers: {kind: decode}\nmodel_dir: m\n").message(),
              HasSubstr("workers: expected a list, got a map"));
  EXPECT_THAT(ParseError("- 1\n- 2\n").message(), HasSubstr("(root): expected a map, got a list"));
  EXPECT_THAT(ParseError("broker: {port: 1, host_store_gib: .nan}\n").message(),
              HasSubstr("broker.host_store_gib: expected a number"));
}

TEST(YamlConfigTest, AllowedValuesSizesAndCustomChecks) {
  std::string text = kGood;
  text.replace(text.find("kind: prefill"), 13, "kind: encode");
  EXPECT_THAT(ParseError(text).message(),
              HasSubstr("local.yaml:5:11: workers[0].kind: 'encode' is not one of: prefill, "
                        "decode"));

  EXPECT_THAT(ParseError("workers: []\nmodel_dir: m\n").message(),
              HasSubstr("local.yaml:1:10: workers: has 0 entries, allowed [1, 64]"));

  text = kGood;
  text.replace(text.find("9002"), 4, "9001");
  EXPECT_THAT(ParseError(text).message(),
              HasSubstr("local.yaml:5:3: workers: port 9001 is used twice"));

  text = kGood;
  text.replace(text.find("layer1: 8"), 9, "layer1: 9");
  EXPECT_THAT(ParseError(text).message(), HasSubstr("bits.layer1: 9 is out of range [3, 8]"));

  EXPECT_THAT(ParseError("workers: [{kind: decode, port: 1}]\nmodel_dir: ''\n").message(),
              HasSubstr("model_dir: must not be empty"));
}

TEST(YamlConfigTest, MissingRequired) {
  EXPECT_THAT(ParseError("workers: [{kind: decode, port: 1}]\n").message(),
              HasSubstr("local.yaml:1:1: model_dir: required key is missing"));
  EXPECT_THAT(ParseError("model_dir: m\nworkers:\n  - kind: decode\n").message(),
              HasSubstr("local.yaml:3:5: workers[0].port: required key is missing"));
  EXPECT_THAT(
      ParseError("model_dir: m\nworkers: [{kind: decode, port: 1}]\nbroker: {}\n").message(),
      HasSubstr("broker.port: required key is missing"));
  EXPECT_THAT(ParseError("").message(), HasSubstr("workers: required key is missing"));
}

TEST(YamlConfigTest, BadYamlSyntaxAndDuplicates) {
  Status s = ParseError("router:\n  port: 8000\n   host: x\n");
  EXPECT_THAT(s.message(), HasSubstr("local.yaml:3:"));
  EXPECT_THAT(s.message(), HasSubstr("bad YAML"));

  s = ParseError("workers: [1, 2\n");
  EXPECT_THAT(s.message(), HasSubstr("bad YAML"));

  s = ParseError("model_dir: a\nmodel_dir: b\n");
  EXPECT_THAT(s.message(), HasSubstr("local.yaml:2:1: model_dir: duplicate key"));

  s = ParseError("? [a, b]\n: 1\n");
  EXPECT_THAT(s.message(), HasSubstr("map keys must be plain strings"));

  s = ParseError("workers: [{kind: decode, port: 1}, ~]\nmodel_dir: m\n");
  EXPECT_THAT(s.message(), HasSubstr("workers[1]: list item is null"));
}

TEST(YamlConfigTest, AliasExpansionIsBounded) {
  // l<i> is a list of two aliases of l<i-1>: a few hundred bytes that expand to 2^25 strings.
  std::string text = "l0: &l0 [s, s]\n";
  std::vector<std::pair<std::string, Schema>> fields;
  Schema level = Schema::List(Schema::String());
  fields.emplace_back("l0", level);
  for (int i = 1; i < 25; ++i) {
    std::string prev = "l" + std::to_string(i - 1), cur = "l" + std::to_string(i);
    text += cur + ": &" + cur + " [*" + prev + ", *" + prev + "]\n";
    level = Schema::List(level);
    fields.emplace_back(cur, level);
  }
  auto r = ParseYamlConfig(text, "bomb.yaml", Schema::Map(fields));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("bomb.yaml:"));
  EXPECT_THAT(r.status().message(), HasSubstr("alias expansion"));
}

TEST(YamlConfigTest, DeepNestingIsAnErrorNotACrash) {
  Status s = ParseError(std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = ParseError("workers: " + std::string(100000, '{'));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(YamlConfigTest, LoadFromFile) {
  pw::testing::TempDir tmp;
  auto missing = LoadYamlConfig(tmp.File("none.yaml"), ClusterSchema());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("none.yaml"));

  const std::string path = tmp.File("local.yaml");
  pw::testing::WriteFile(path, kGood);
  auto r = LoadYamlConfig(path, ClusterSchema());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["broker"]["port"].AsInt(), 9100);
  EXPECT_EQ((*r)["broker"]["port"].Error("x").message(), path + ":11:9: broker.port: x");
}

}  // namespace
}  // namespace pw::config
