// OptionSet: a process's options declared once, beside the struct they fill; its command-line
// flags (CLI11) and its section of the node YAML file (pw::config::Schema) both come from it.
//
// A declaration binds a key to a field of the options struct; the field's value at declaration
// is the default (so the struct's member initializers stay the one place defaults are written):
//
//   void DeclareBrokerOptions(pw::options::OptionSet* s, BrokerOptions* o) {
//     s->Add("model_dir", &o->model_dir, "model directory").Flag("--model").Shared().Required();
//     s->Add("initial_bits", &o->initial_bits, "width of every expert block").Range(3, 8);
//     s->Add("planner.low_watermark", &o->planner.low_watermark, "low watermark, fraction of the pool")
//         .Flag("--planner-low").Range(0, 1);
//   }
//
// gives the flags --model, --initial-bits and --planner-low, and the YAML keys `model_dir` (at
// the file's root: Shared) and, in the process's section, `initial_bits` and
// `planner: {low_watermark}` ('.' nests). Bounds and choices hold for both.
//
// Keys are snake_case; the flag is "--" + the key with '.' and '_' turned into '-' unless Flag()
// names it (older flag names are kept that way). NoFlag(): only in the file; NoKey(): only a
// flag (e.g. an endpoint that the node file derives from its ports, see Derive).
//
// Order of precedence: a flag given on the command line, then the file, then a value derived
// from the rest of the file (Derive), then the default. The usual sequence:
//
//   OptionSet set;  DeclareBrokerOptions(&set, &o);
//   set.AddToCli(&app);  CLI11_PARSE(app, argc, argv);       // flags fill their fields
//   PW_RETURN_IF_ERROR(set.ApplyFile(root, section));         // the file fills the others
//   PW_RETURN_IF_ERROR(set.CheckRequired());
//
// Field types: bool, the integer types, float and double, std::string, std::vector of int or
// std::string (a YAML list; a comma-separated or repeated flag),
// std::chrono::milliseconds (an integer of ms), std::optional of a scalar (absent = unset), and
// enums through AddChoice (a string naming one of a fixed list).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/formats/yaml_config.h"
#include "common/status.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace pw::options {

class OptionSet;

// One declared option. The modifiers return *this, so a declaration reads as one expression.
class Option {
 public:
  // Where the option's current value came from.
  enum class Source { kDefault, kDerived, kFile, kFlag };

  Option& Flag(std::string names);  // CLI11 names, e.g. "--planner-low" or "-p,--port"
  Option& NoFlag();                 // only in the file
  Option& NoKey();                  // only on the command line
  // The key lives at the root of the node file, where every process of the node reads it
  // (model_dir, heartbeat_ms), instead of in the process's section.
  Option& Shared();
  // Given by a flag or the file (checked by OptionSet::CheckRequired, not by CLI11, since a
  // file may give it).
  Option& Required();
  Option& Range(double min, double max);  // numbers (and list elements): min <= v <= max
  Option& Max(double max);                // numbers: v <= max
  // A rule on the key's value in files (Schema::Check: "" = fine, else the message).
  Option& Check(config::Schema::CheckFn fn);
  Option& OneOf(std::vector<std::string> allowed);  // strings
  Option& NonEmpty();                                // strings
  // The file's value times `factor` is the field's (pool_mb -> bytes); the flag takes the
  // field's unit. Integers only.
  Option& Scale(int64_t factor);
  // Bool options: the value the flag sets (false for a "--no-..." flag; default true).
  Option& FlagSets(bool value);
  // Left out of DumpYaml (API keys).
  Option& Secret();

  const std::string& key() const { return key_; }
  const std::string& flag_names() const { return flags_; }
  const std::string& help() const { return help_; }
  bool shared() const { return shared_; }
  bool has_key() const { return has_key_; }
  bool has_flag() const { return has_flag_; }
  Source source() const { return source_; }
  // The field's value in the file's units (a null value: an unset optional).
  config::ConfigValue Value() const { return get_(); }

 private:
  friend class OptionSet;
  Option() = default;
  // The schema of the key (no default: absent keys leave the field as it is).
  config::Schema KeySchema() const;

  std::string key_, flags_, help_;
  config::Schema::Kind kind_ = config::Schema::Kind::kString;
  bool list_ = false;      // std::vector<int>: a list of kind_
  bool shared_ = false, required_ = false, has_key_ = true, has_flag_ = true;
  bool non_empty_ = false, secret_ = false;
  std::optional<double> min_, max_;
  std::vector<std::string> one_of_;
  std::vector<config::Schema::CheckFn> checks_;
  int64_t scale_ = 1;
  bool flag_sets_ = true;
  Source source_ = Source::kDefault;
  // Typed access to the field: set from a checked file value (in file units), read in file
  // units, and register the flag.
  std::function<Status(const config::ConfigValue&)> set_;
  std::function<config::ConfigValue()> get_;
  std::function<CLI::Option*(CLI::App*)> add_cli_;
  CLI::Option* cli_ = nullptr;
};

class OptionSet {
 public:
  OptionSet() = default;
  OptionSet(const OptionSet&) = delete;
  OptionSet& operator=(const OptionSet&) = delete;

  // Declares an option bound to *field (which must outlive the set); its value now is the
  // default. `help` is the flag's help text and the key's description.
  template <typename V>
  Option& Add(std::string key, V* field, std::string help);
  // An enum field named in flags and files by one of `choices`.
  template <typename E>
  Option& AddChoice(std::string key, E* field, std::vector<std::pair<std::string, E>> choices,
                    std::string help);
  // A rule over the map at `path` in the section ("" = the section, "lynx" = its lynx map),
  // checked in files (with file:line:col); returns "" when fine (Schema::Check).
  void AddCheck(std::string path, config::Schema::CheckFn fn);

  // Generator 1: registers every option with a flag.
  // `app` must outlive the set: ApplyFile, Derive and CheckRequired ask its options whether
  // they were given on the command line.
  void AddToCli(CLI::App* app);
  // Generator 2: the schema of the process's section (keys nested by '.'), with `extra` node
  // keys (ports, ids the launcher reads) merged in at the top; and the Shared keys, for the
  // file's root.
  config::Schema SectionSchema(std::vector<std::pair<std::string, config::Schema>> extra = {}) const;
  std::vector<std::pair<std::string, config::Schema>> SharedFields() const;

  // Sets every option with a key from the file (Shared ones from `root`, the others from
  // `section`, both checked against the schemas above) unless it was given as a flag. Keys
  // absent from the file leave their fields alone.
  Status ApplyFile(const config::ConfigValue& root, const config::ConfigValue& section);
  // Sets option `key` to `value` (file units) when neither a flag nor the file gave it: a
  // value derived from other parts of the file (an endpoint from a host and a port).
  Status Derive(const std::string& key, const config::ConfigValue& value);
  // kInvalidArgument naming the key and flag of the first Required option nothing gave.
  Status CheckRequired() const;

  // True when option `key` was given: as a flag, in the file or derived (not its default).
  bool Given(const std::string& key) const;
  // The option declared with `key`, or nullptr.
  const Option* Find(const std::string& key) const;
  const std::vector<std::unique_ptr<Option>>& options() const { return options_; }
  // The current values as YAML (every option, nested by '.'; unset optionals, empty values of
  // NonEmpty strings and Secret options left out), indented by `indent` spaces.
  std::string DumpYaml(int indent = 0) const;

 private:
  Option& NewOption(std::string key, std::string help);
  std::vector<std::unique_ptr<Option>> options_;
  std::vector<std::pair<std::string, config::Schema::CheckFn>> checks_;
};

// ---------------------------------------------------------------------------------------------
// Field access, per type.

namespace detail {

template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};

// Binds a scalar field type: its kind, its bounds, and conversions from/to ConfigValue.
template <typename V, typename = void>
struct Scalar;

template <>
struct Scalar<bool> {
  static constexpr config::Schema::Kind kKind = config::Schema::Kind::kBool;
  static bool From(const config::ConfigValue& v, int64_t) { return v.AsBool(); }
  static config::ConfigValue To(bool v, int64_t) { return config::ConfigValue(v); }
};

template <typename V>
struct Scalar<V, std::enable_if_t<std::is_integral_v<V> && !std::is_same_v<V, bool>>> {
  static constexpr config::Schema::Kind kKind = config::Schema::Kind::kInt;
  static V From(const config::ConfigValue& v, int64_t scale) {
    return static_cast<V>(v.AsInt() * scale);
  }
  static config::ConfigValue To(V v, int64_t scale) {
    return config::ConfigValue(static_cast<int64_t>(v) / scale);
  }
};

template <typename V>
struct Scalar<V, std::enable_if_t<std::is_floating_point_v<V>>> {
  static constexpr config::Schema::Kind kKind = config::Schema::Kind::kDouble;
  static V From(const config::ConfigValue& v, int64_t) { return static_cast<V>(v.AsDouble()); }
  static config::ConfigValue To(V v, int64_t) { return config::ConfigValue(static_cast<double>(v)); }
};

template <>
struct Scalar<std::string> {
  static constexpr config::Schema::Kind kKind = config::Schema::Kind::kString;
  static std::string From(const config::ConfigValue& v, int64_t) { return v.AsString(); }
  static config::ConfigValue To(const std::string& v, int64_t) { return config::ConfigValue(v); }
};

template <>
struct Scalar<std::chrono::milliseconds> {
  static constexpr config::Schema::Kind kKind = config::Schema::Kind::kInt;
  static std::chrono::milliseconds From(const config::ConfigValue& v, int64_t) {
    return std::chrono::milliseconds(v.AsInt());
  }
  static config::ConfigValue To(std::chrono::milliseconds v, int64_t) {
    return config::ConfigValue(static_cast<int64_t>(v.count()));
  }
};

// The bounds an integer type imposes by itself (so a file cannot overflow the field).
template <typename V>
std::pair<double, double> TypeBounds() {
  if constexpr (std::is_integral_v<V> && !std::is_same_v<V, bool>) {
    const double lo = std::is_signed_v<V> ? static_cast<double>(std::numeric_limits<V>::min()) : 0.0;
    const double hi = sizeof(V) >= 8 ? 9.2e18 : static_cast<double>(std::numeric_limits<V>::max());
    return {std::max(lo, -9.2e18), hi};
  }
  return {-std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
}

// CLI11 registration of one field (options.cc; explicit instantiations there).
template <typename V>
CLI::Option* AddCliOption(CLI::App* app, const std::string& names, const std::string& help, V* field);
CLI::Option* AddCliFlag(CLI::App* app, const std::string& names, const std::string& help,
                        std::function<void()> on_flag);
CLI::Option* AddCliChoice(CLI::App* app, const std::string& names, const std::string& help,
                          std::function<void(const std::string&)> set);

}  // namespace detail

template <typename V>
Option& OptionSet::Add(std::string key, V* field, std::string help) {
  Option& o = NewOption(std::move(key), std::move(help));
  Option* op = &o;
  if constexpr (std::is_same_v<V, std::vector<int>> || std::is_same_v<V, std::vector<std::string>>) {
    using T = typename V::value_type;
    using S = detail::Scalar<T>;
    o.kind_ = S::kKind;
    o.list_ = true;
    o.set_ = [field](const config::ConfigValue& v) {
      field->clear();
      for (const auto& item : v.Items()) field->push_back(S::From(item, 1));
      return Status::Ok();
    };
    o.get_ = [field] {
      config::ConfigValue list = config::ConfigValue::EmptyList();
      for (const auto& x : *field) list.Push(S::To(x, 1));
      return list;
    };
    o.add_cli_ = [op, field](CLI::App* app) {
      return detail::AddCliOption(app, op->flags_, op->help_, field);
    };
  } else if constexpr (detail::IsOptional<V>::value) {
    using T = typename V::value_type;
    using S = detail::Scalar<T>;
    o.kind_ = S::kKind;
    auto [lo, hi] = detail::TypeBounds<T>();
    if constexpr (S::kKind == config::Schema::Kind::kInt) o.min_ = lo, o.max_ = hi;
    o.set_ = [op, field](const config::ConfigValue& v) {
      *field = S::From(v, op->scale_);
      return Status::Ok();
    };
    o.get_ = [op, field] { return *field ? S::To(**field, op->scale_) : config::ConfigValue(); };
    o.add_cli_ = [op, field](CLI::App* app) {
      return detail::AddCliOption(app, op->flags_, op->help_, field);
    };
  } else {
    using S = detail::Scalar<V>;
    o.kind_ = S::kKind;
    auto [lo, hi] = detail::TypeBounds<V>();
    if constexpr (S::kKind == config::Schema::Kind::kInt) o.min_ = lo, o.max_ = hi;
    o.set_ = [op, field](const config::ConfigValue& v) {
      *field = S::From(v, op->scale_);
      return Status::Ok();
    };
    o.get_ = [op, field] { return S::To(*field, op->scale_); };
    if constexpr (std::is_same_v<V, bool>) {
      o.add_cli_ = [op, field](CLI::App* app) {
        return detail::AddCliFlag(app, op->flags_, op->help_, [op, field] { *field = op->flag_sets_; });
      };
    } else {
      o.add_cli_ = [op, field](CLI::App* app) {
        return detail::AddCliOption(app, op->flags_, op->help_, field);
      };
    }
  }
  return o;
}

template <typename E>
Option& OptionSet::AddChoice(std::string key, E* field, std::vector<std::pair<std::string, E>> choices,
                             std::string help) {
  Option& o = NewOption(std::move(key), std::move(help));
  o.kind_ = config::Schema::Kind::kString;
  for (const auto& c : choices) o.one_of_.push_back(c.first);
  auto table = std::make_shared<std::vector<std::pair<std::string, E>>>(std::move(choices));
  o.set_ = [field, table](const config::ConfigValue& v) {
    for (const auto& [name, value] : *table) {
      if (name == v.AsString()) {
        *field = value;
        return Status::Ok();
      }
    }
    return v.Error("'" + v.AsString() + "' is not a known choice");
  };
  o.get_ = [field, table] {
    for (const auto& [name, value] : *table) {
      if (value == *field) return config::ConfigValue(name);
    }
    return config::ConfigValue();
  };
  Option* op = &o;
  o.add_cli_ = [op, field, table](CLI::App* app) {
    return detail::AddCliChoice(app, op->flags_, op->help_, [field, table](const std::string& s) {
      for (const auto& [name, value] : *table) {
        if (name == s) *field = value;
      }
    });
  };
  return o;
}

}  // namespace pw::options
