// YAML configuration files checked against a declared schema.
//
// A program declares what its configuration looks like once, as a Schema, and loads a file
// with LoadYamlConfig. Every problem in the file comes back as a Status whose message starts
// with the file, the line and column, and the path of the offending value:
//
//   deploy/local.yaml:14:11: workers[1].port: 70000 is out of range [1, 65535]
//   deploy/local.yaml:9:3: router.prot: unknown key (known keys: host, port)
//   deploy/local.yaml:4:1: model_dir: required key is missing
//   deploy/local.yaml:7:10: bad YAML: illegal map value
//
// On success the result is a ConfigValue tree in which every value has been checked and every
// absent optional key that has a default holds that default, so reading it cannot fail:
//
//   using pw::config::Schema;
//   const Schema kClusterSchema = Schema::Map({
//       {"router", Schema::Map({
//                      {"host", Schema::String().Default("127.0.0.1")},
//                      {"port", Schema::Int().Range(1, 65535).Default(8000)},
//                  })},
//       {"workers", Schema::List(Schema::Map({
//                       {"kind", Schema::String().OneOf({"prefill", "decode"}).Required()},
//                       {"port", Schema::Int().Range(1, 65535).Required()},
//                   })).Size(1, 64).Required()},
//       {"model_dir", Schema::String().NonEmpty().Required()},
//       {"kv_blocks", Schema::Int().Min(1).Default(4096)},
//   });
//   PW_ASSIGN_OR_RETURN(pw::config::ConfigValue cfg,
//                       pw::config::LoadYamlConfig("deploy/local.yaml", kClusterSchema));
//   int64_t port = cfg["router"]["port"].AsInt();          // 8000 when the file omits it
//   for (const auto& w : cfg["workers"].Items()) Start(w["kind"].AsString(), w["port"].AsInt());
//   if (!DirExists(cfg["model_dir"].AsString()))
//     return cfg["model_dir"].Error("no such directory");  // same "file:line:col: path:" prefix
//
// Schema rules:
//   - Scalars: Int (64-bit; a quoted "8000" is a string, not an int), Double (an int is accepted;
//     NaN is refused), Bool (true/false, also yes/no/on/off as YAML allows), String (any scalar).
//   - Map: a fixed set of keys; any other key is an error (AllowOtherKeys(): skipped unchecked). MapOf(value): any string keys, each
//     value checked against one schema (e.g. per-layer overrides).
//   - List(element): a sequence; Size(min, max) bounds its length.
//   - A key is optional unless Required(). An absent optional key takes its Default() if it has
//     one and is otherwise absent from the result (test with Has). An absent optional Map with no
//     required keys is filled with its defaults as if it were written empty. A YAML null value
//     (`key:` with nothing after it) counts as absent.
//   - Range/Min/Max bound Int and Double; OneOf lists the allowed strings; NonEmpty refuses "".
//   - Check(fn) adds a custom rule run after the value passed the built-in ones; fn returns an
//     error message, or "" when the value is fine (e.g. "ports must be distinct").
//   - Duplicate keys in one map are an error. Schema mistakes (a Default of the wrong type,
//     Range on a String) are programming errors and abort at declaration (PW_CHECK).
// Reading a ConfigValue with the wrong accessor, or a key the schema does not declare, is a
// programming error and aborts (PW_CHECK); Has() tells an absent optional key.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace pw::config {

// A checked configuration value: a scalar, a map (keys in file order, then defaults in schema
// order) or a list, with where it came from.
class ConfigValue {
 public:
  enum class Kind { kNull, kBool, kInt, kDouble, kString, kMap, kList };

  ConfigValue() = default;
  ConfigValue(bool v) : kind_(Kind::kBool), b_(v) {}                      // NOLINT
  ConfigValue(int v) : kind_(Kind::kInt), i_(v) {}                        // NOLINT
  ConfigValue(int64_t v) : kind_(Kind::kInt), i_(v) {}                    // NOLINT
  ConfigValue(double v) : kind_(Kind::kDouble), d_(v) {}                  // NOLINT
  ConfigValue(const char* v) : kind_(Kind::kString), s_(v) {}             // NOLINT
  ConfigValue(std::string v) : kind_(Kind::kString), s_(std::move(v)) {}  // NOLINT
  static ConfigValue EmptyMap() { return ConfigValue(Kind::kMap); }
  static ConfigValue EmptyList() { return ConfigValue(Kind::kList); }

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }

  // Typed reads; each PW_CHECKs the kind (AsDouble also accepts an Int).
  bool AsBool() const;
  int64_t AsInt() const;
  double AsDouble() const;
  const std::string& AsString() const;

  // Maps: is `key` present (given in the file or filled by a default)?
  bool Has(std::string_view key) const;
  // Maps: the value of `key`; PW_CHECKs that it is present.
  const ConfigValue& operator[](std::string_view key) const;
  // Maps: the value of `key`, or nullptr.
  const ConfigValue* Find(std::string_view key) const;
  // Maps: (key, value) pairs in order.
  const std::vector<std::pair<std::string, ConfigValue>>& Entries() const;
  // Lists: the elements.
  const std::vector<ConfigValue>& Items() const;
  // Lists: element i (PW_CHECKed in range).
  const ConfigValue& operator[](size_t i) const;
  // Number of map entries or list items; 0 for scalars.
  size_t size() const;

  // Where the value came from: the dotted path ("workers[1].port"; "" for the root), the file
  // label, and its 1-based line and column (0 for a value filled in from a default).
  const std::string& path() const { return path_; }
  int line() const { return line_; }
  int column() const { return column_; }
  // kInvalidArgument "<file>:<line>:<col>: <path>: <message>", for checks the caller does itself.
  Status Error(std::string_view message) const;

  // Building (used by the loader and by tests).
  void SetOrigin(std::shared_ptr<const std::string> file, std::string path, int line, int column);
  void Add(std::string key, ConfigValue value);  // map
  void Push(ConfigValue value);                  // list

 private:
  explicit ConfigValue(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kNull;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::vector<std::pair<std::string, ConfigValue>> map_;
  std::vector<ConfigValue> list_;
  std::shared_ptr<const std::string> file_;
  std::string path_;
  int line_ = 0;
  int column_ = 0;
};

// The declared shape of a configuration value. Schemas are immutable values: every modifier
// returns a modified copy, so declarations read as one expression (see the top of this file).
class Schema {
 public:
  enum class Kind { kBool, kInt, kDouble, kString, kMap, kMapOf, kList, kAny };
  // A custom rule: returns "" if `value` is acceptable, else the error message.
  using CheckFn = std::function<std::string(const ConfigValue& value)>;

  static Schema Bool();
  static Schema Int();
  static Schema Double();
  static Schema String();
  static Schema Map(std::vector<std::pair<std::string, Schema>> fields);
  static Schema MapOf(Schema value);
  static Schema List(Schema element);
  // Any value, unchecked and left out of the result (a key another program reads).
  static Schema Any();

  Schema Required() const;
  Schema Default(ConfigValue value) const;     // the value's kind must fit (an int for Double too)
  Schema Range(double min, double max) const;  // Int, Double: min <= v <= max
  Schema Min(double min) const;
  Schema Max(double max) const;
  Schema OneOf(std::vector<std::string> allowed) const;  // String
  Schema NonEmpty() const;                               // String
  Schema Size(size_t min, size_t max) const;             // List, MapOf: entry count bounds
  // Map: keys it does not declare are skipped unchecked (and left out of the result) instead of
  // refused: a process reading only its own part of a file shared with others.
  Schema AllowOtherKeys() const;
  Schema Check(CheckFn fn) const;
  Schema Doc(std::string text) const;  // a one-line description, kept for help output

  Kind kind() const { return kind_; }
  bool required() const { return required_; }
  const std::optional<ConfigValue>& default_value() const { return default_; }
  const std::string& doc() const { return doc_; }

 private:
  friend class Validator;
  explicit Schema(Kind k) : kind_(k) {}
  Kind kind_;
  bool required_ = false;
  std::optional<ConfigValue> default_;
  std::optional<double> min_, max_;
  std::vector<std::string> one_of_;
  bool non_empty_ = false;
  bool other_keys_ = false;  // kMap: AllowOtherKeys
  size_t min_size_ = 0, max_size_ = SIZE_MAX;
  std::vector<CheckFn> checks_;
  std::string doc_;
  std::vector<std::pair<std::string, std::shared_ptr<const Schema>>> fields_;  // kMap
  std::shared_ptr<const Schema> element_;                                      // kMapOf, kList
};

// Parses YAML text and checks it against `schema` (whose root is normally a Map). `label`
// names the source in messages (usually the path). Errors are kInvalidArgument.
Result<ConfigValue> ParseYamlConfig(std::string_view text, const std::string& label,
                                    const Schema& schema);
// Reads `path` (kNotFound / kIoError naming it when unreadable) and calls ParseYamlConfig.
Result<ConfigValue> LoadYamlConfig(const std::string& path, const Schema& schema);

}  // namespace pw::config
