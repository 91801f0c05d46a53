#include "common/formats/options.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace pw::options {

using config::ConfigValue;
using config::Schema;

// ---------------------------------------------------------------------------------------------
// Option

Option& Option::Flag(std::string names) {
  flags_ = std::move(names);
  has_flag_ = true;
  return *this;
}

Option& Option::NoFlag() {
  has_flag_ = false;
  return *this;
}

Option& Option::NoKey() {
  has_key_ = false;
  return *this;
}

Option& Option::Shared() {
  shared_ = true;
  return *this;
}

Option& Option::Required() {
  required_ = true;
  return *this;
}

Option& Option::Range(double min, double max) {
  PW_CHECK_MSG(kind_ == Schema::Kind::kInt || kind_ == Schema::Kind::kDouble,
               ("Range on a non-number: " + key_).c_str());
  min_ = min;
  max_ = max;
  return *this;
}

Option& Option::Max(double max) {
  PW_CHECK_MSG(kind_ == Schema::Kind::kInt || kind_ == Schema::Kind::kDouble,
               ("Max on a non-number: " + key_).c_str());
  max_ = max;
  return *this;
}

Option& Option::Check(Schema::CheckFn fn) {
  checks_.push_back(std::move(fn));
  return *this;
}

Option& Option::OneOf(std::vector<std::string> allowed) {
  PW_CHECK_MSG(kind_ == Schema::Kind::kString, ("OneOf on a non-string: " + key_).c_str());
  one_of_ = std::move(allowed);
  return *this;
}

Option& Option::NonEmpty() {
  PW_CHECK_MSG(kind_ == Schema::Kind::kString, ("NonEmpty on a non-string: " + key_).c_str());
  non_empty_ = true;
  return *this;
}

Option& Option::Scale(int64_t factor) {
  PW_CHECK_MSG(kind_ == Schema::Kind::kInt && factor >= 1, ("Scale on a non-integer: " + key_).c_str());
  scale_ = factor;
  if (max_) max_ = std::floor(*max_ / static_cast<double>(factor));
  if (min_) min_ = std::ceil(*min_ / static_cast<double>(factor));
  return *this;
}

Option& Option::FlagSets(bool value) {
  PW_CHECK_MSG(kind_ == Schema::Kind::kBool, ("FlagSets on a non-bool: " + key_).c_str());
  flag_sets_ = value;
  return *this;
}

Option& Option::Secret() {
  secret_ = true;
  return *this;
}

Schema Option::KeySchema() const {
  Schema s = kind_ == Schema::Kind::kBool     ? Schema::Bool()
             : kind_ == Schema::Kind::kInt    ? Schema::Int()
             : kind_ == Schema::Kind::kDouble ? Schema::Double()
                                              : Schema::String();
  if (min_) s = s.Min(*min_);
  if (max_) s = s.Max(*max_);
  if (!one_of_.empty()) s = s.OneOf(one_of_);
  if (non_empty_) s = s.NonEmpty();
  for (const auto& fn : checks_) s = s.Check(fn);
  if (list_) s = Schema::List(s);
  if (required_) s = s.Required();
  return s.Doc(help_);
}

// ---------------------------------------------------------------------------------------------
// CLI11 registration

namespace detail {

template <typename V>
CLI::Option* AddCliOption(CLI::App* app, const std::string& names, const std::string& help, V* field) {
  if constexpr (IsOptional<V>::value) {
    using T = typename V::value_type;
    return app->add_option_function<T>(names, [field](const T& v) { *field = v; }, help);
  } else if constexpr (std::is_same_v<V, std::chrono::milliseconds>) {
    return app->add_option_function<int64_t>(
        names, [field](const int64_t& v) { *field = std::chrono::milliseconds(v); }, help);
  } else if constexpr (std::is_same_v<V, std::vector<int>> || std::is_same_v<V, std::vector<std::string>>) {
    return app->add_option(names, *field, help)->delimiter(',');
  } else {
    return app->add_option(names, *field, help);
  }
}

#define PW_OPTIONS_CLI(V) \
  template CLI::Option* AddCliOption<V>(CLI::App*, const std::string&, const std::string&, V*);
PW_OPTIONS_CLI(int)
PW_OPTIONS_CLI(unsigned)
PW_OPTIONS_CLI(long)
PW_OPTIONS_CLI(unsigned long)
PW_OPTIONS_CLI(long long)
PW_OPTIONS_CLI(unsigned long long)
PW_OPTIONS_CLI(unsigned short)
PW_OPTIONS_CLI(float)
PW_OPTIONS_CLI(double)
PW_OPTIONS_CLI(std::string)
PW_OPTIONS_CLI(std::chrono::milliseconds)
PW_OPTIONS_CLI(std::vector<int>)
PW_OPTIONS_CLI(std::vector<std::string>)
PW_OPTIONS_CLI(std::optional<int>)
PW_OPTIONS_CLI(std::optional<unsigned long>)
PW_OPTIONS_CLI(std::optional<unsigned long long>)
PW_OPTIONS_CLI(std::optional<long>)
PW_OPTIONS_CLI(std::optional<float>)
PW_OPTIONS_CLI(std::optional<double>)
PW_OPTIONS_CLI(std::optional<std::string>)
#undef PW_OPTIONS_CLI

CLI::Option* AddCliFlag(CLI::App* app, const std::string& names, const std::string& help,
                        std::function<void()> on_flag) {
  return app->add_flag_function(names, [on_flag](int64_t) { on_flag(); }, help);
}

CLI::Option* AddCliChoice(CLI::App* app, const std::string& names, const std::string& help,
                          std::function<void(const std::string&)> set) {
  return app->add_option_function<std::string>(names, std::move(set), help);
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// OptionSet

Option& OptionSet::NewOption(std::string key, std::string help) {
  PW_CHECK_MSG(Find(key) == nullptr, ("option declared twice: " + key).c_str());
  auto o = std::unique_ptr<Option>(new Option());
  std::string flag = key;
  std::replace(flag.begin(), flag.end(), '.', '-');
  std::replace(flag.begin(), flag.end(), '_', '-');
  o->flags_ = "--" + flag;
  o->key_ = std::move(key);
  o->help_ = std::move(help);
  options_.push_back(std::move(o));
  return *options_.back();
}

const Option* OptionSet::Find(const std::string& key) const {
  for (const auto& o : options_) {
    if (o->key_ == key) return o.get();
  }
  return nullptr;
}

void OptionSet::AddCheck(std::string path, Schema::CheckFn fn) {
  checks_.emplace_back(std::move(path), std::move(fn));
}

void OptionSet::AddToCli(CLI::App* app) {
  for (auto& o : options_) {
    if (!o->has_flag_) continue;
    CLI::Option* c = o->add_cli_(app);
    const bool number = o->kind_ == Schema::Kind::kInt || o->kind_ == Schema::Kind::kDouble;
    // The flag's unit is the field's: scale the file's bounds back.
    if (number && (o->min_ || o->max_)) {
      const double f = static_cast<double>(o->scale_);
      const double lo = o->min_ ? *o->min_ * f : -std::numeric_limits<double>::max();
      const double hi = o->max_ ? *o->max_ * f : std::numeric_limits<double>::max();
      c->check(CLI::Range(lo, hi));
    }
    if (!o->one_of_.empty()) c->check(CLI::IsMember(o->one_of_));
    if (o->non_empty_) {
      c->check(CLI::Validator([](std::string& s) { return s.empty() ? std::string("must not be empty") : ""; },
                              "NONEMPTY"));
    }
    o->cli_ = c;
  }
}

namespace {

// A tree of map schemas built from dotted keys, turned into nested Schema::Map at the end.
struct SchemaNode {
  std::vector<std::pair<std::string, Schema>> leaves;  // in declaration order
  std::vector<std::pair<std::string, std::unique_ptr<SchemaNode>>> children;
  std::vector<Schema::CheckFn> checks;
  std::vector<std::string> order;  // keys (leaves and children) in declaration order

  SchemaNode* Child(const std::string& name) {
    for (auto& [n, c] : children) {
      if (n == name) return c.get();
    }
    children.emplace_back(name, std::make_unique<SchemaNode>());
    order.push_back(name);
    return children.back().second.get();
  }
  SchemaNode* Walk(const std::string& path, std::string* last) {
    SchemaNode* n = this;
    size_t start = 0;
    for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
      n = n->Child(path.substr(start, dot - start));
      start = dot + 1;
    }
    *last = path.substr(start);
    return n;
  }
  Schema Build() const {
    std::vector<std::pair<std::string, Schema>> fields;
    for (const auto& name : order) {
      bool done = false;
      for (const auto& [n, s] : leaves) {
        if (n == name) fields.emplace_back(n, s), done = true;
      }
      if (done) continue;
      for (const auto& [n, c] : children) {
        if (n == name) fields.emplace_back(n, c->Build());
      }
    }
    Schema s = Schema::Map(std::move(fields));
    for (const auto& fn : checks) s = s.Check(fn);
    return s;
  }
};

// The value at dotted `key` under `map`, or nullptr.
const ConfigValue* Lookup(const ConfigValue& map, const std::string& key) {
  const ConfigValue* v = &map;
  size_t start = 0;
  while (true) {
    if (v->kind() != ConfigValue::Kind::kMap) return nullptr;
    const size_t dot = key.find('.', start);
    v = v->Find(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (v == nullptr || dot == std::string::npos) return v;
    start = dot + 1;
  }
}

bool GivenAsFlag(const CLI::Option* c) { return c != nullptr && c->count() > 0; }

}  // namespace

Schema OptionSet::SectionSchema(std::vector<std::pair<std::string, Schema>> extra) const {
  SchemaNode root;
  for (auto& [name, s] : extra) {  // dotted names nest too
    std::string last;
    SchemaNode* n = root.Walk(name, &last);
    n->leaves.emplace_back(last, std::move(s));
    n->order.push_back(last);
  }
  for (const auto& o : options_) {
    if (!o->has_key_ || o->shared_) continue;
    std::string last;
    SchemaNode* n = root.Walk(o->key_, &last);
    n->leaves.emplace_back(last, o->KeySchema());
    n->order.push_back(last);
  }
  for (const auto& [path, fn] : checks_) {
    SchemaNode* n = &root;
    if (!path.empty()) {
      std::string last;
      n = root.Walk(path, &last)->Child(last);
    }
    n->checks.push_back(fn);
  }
  return root.Build();
}

std::vector<std::pair<std::string, Schema>> OptionSet::SharedFields() const {
  std::vector<std::pair<std::string, Schema>> out;
  for (const auto& o : options_) {
    if (o->has_key_ && o->shared_) out.emplace_back(o->key_, o->KeySchema());
  }
  return out;
}

Status OptionSet::ApplyFile(const ConfigValue& root, const ConfigValue& section) {
  for (auto& o : options_) {
    if (GivenAsFlag(o->cli_)) {
      o->source_ = Option::Source::kFlag;
      continue;
    }
    if (!o->has_key_) continue;
    const ConfigValue* v = Lookup(o->shared_ ? root : section, o->key_);
    if (v == nullptr || v->is_null()) continue;
    PW_RETURN_IF_ERROR(o->set_(*v));
    o->source_ = Option::Source::kFile;
  }
  return Status::Ok();
}

Status OptionSet::Derive(const std::string& key, const ConfigValue& value) {
  for (auto& o : options_) {
    if (o->key_ != key) continue;
    if (GivenAsFlag(o->cli_)) {
      o->source_ = Option::Source::kFlag;
      return Status::Ok();
    }
    if (o->source_ == Option::Source::kFile) return Status::Ok();
    PW_RETURN_IF_ERROR(o->set_(value));
    o->source_ = Option::Source::kDerived;
    return Status::Ok();
  }
  PW_CHECK_MSG(false, ("Derive: no option " + key).c_str());
  return Status::Ok();
}

bool OptionSet::Given(const std::string& key) const {
  const Option* o = Find(key);
  PW_CHECK_MSG(o != nullptr, ("Given: no option " + key).c_str());
  return GivenAsFlag(o->cli_) || o->source_ != Option::Source::kDefault;
}

Status OptionSet::CheckRequired() const {
  for (const auto& o : options_) {
    if (!o->required_ || GivenAsFlag(o->cli_) || o->source_ != Option::Source::kDefault) continue;
    std::string where;
    if (o->has_flag_) where = o->flags_;
    if (o->has_key_) where += std::string(where.empty() ? "" : " or ") + "the key " + o->key_ + " of --config";
    return InvalidArgument(o->key_ + " is required (" + where + ")");
  }
  return Status::Ok();
}

namespace {

// The dump's tree: keys in declaration order, each a value or a nested map.
struct DumpNode {
  std::vector<std::pair<std::string, ConfigValue>> leaves;
  std::vector<std::pair<std::string, std::unique_ptr<DumpNode>>> children;
  std::vector<std::pair<bool, size_t>> order;  // (is child, index)

  DumpNode* Child(const std::string& name) {
    for (auto& [n, c] : children) {
      if (n == name) return c.get();
    }
    children.emplace_back(name, std::make_unique<DumpNode>());
    order.emplace_back(true, children.size() - 1);
    return children.back().second.get();
  }
};

// A string that YAML would read as something else (a number, a bool, null) is quoted.
bool NeedsQuotes(const std::string& s) {
  if (s.empty()) return true;
  YAML::Node n = YAML::Load(s);
  if (!n.IsScalar()) return true;
  bool b;
  double d;
  return YAML::convert<bool>::decode(n, b) || YAML::convert<double>::decode(n, d) || s == "~" ||
         s == "null" || n.Scalar() != s;
}

void EmitScalar(YAML::Emitter* out, const ConfigValue& v) {
  switch (v.kind()) {
    case ConfigValue::Kind::kBool:
      *out << (v.AsBool() ? "true" : "false");
      break;
    case ConfigValue::Kind::kInt:
      *out << std::to_string(v.AsInt());
      break;
    case ConfigValue::Kind::kDouble: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.15g", v.AsDouble());
      std::string text = buf;
      if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
      *out << text;
      break;
    }
    case ConfigValue::Kind::kString:
      if (NeedsQuotes(v.AsString())) *out << YAML::DoubleQuoted;
      *out << v.AsString();
      break;
    case ConfigValue::Kind::kList:
      *out << YAML::Flow << YAML::BeginSeq;
      for (const auto& item : v.Items()) EmitScalar(out, item);
      *out << YAML::EndSeq;
      break;
    default:
      *out << YAML::Null;
  }
}

void EmitNode(YAML::Emitter* out, const DumpNode& n) {
  *out << YAML::BeginMap;
  for (const auto& [is_child, i] : n.order) {
    if (is_child) {
      *out << YAML::Key << n.children[i].first << YAML::Value;
      EmitNode(out, *n.children[i].second);
    } else {
      *out << YAML::Key << n.leaves[i].first << YAML::Value;
      EmitScalar(out, n.leaves[i].second);
    }
  }
  *out << YAML::EndMap;
}

}  // namespace

std::string OptionSet::DumpYaml(int indent) const {
  DumpNode root;
  for (const auto& o : options_) {
    if (o->secret_) continue;
    const ConfigValue v = o->get_();
    if (v.is_null()) continue;  // an unset optional
    if (o->non_empty_ && v.kind() == ConfigValue::Kind::kString && v.AsString().empty()) continue;  // unset
    DumpNode* n = &root;
    size_t start = 0;
    for (size_t dot = o->key_.find('.'); dot != std::string::npos; dot = o->key_.find('.', start)) {
      n = n->Child(o->key_.substr(start, dot - start));
      start = dot + 1;
    }
    n->leaves.emplace_back(o->key_.substr(start), v);
    n->order.emplace_back(false, n->leaves.size() - 1);
  }
  if (root.order.empty()) return "";
  YAML::Emitter out;
  out.SetIndent(2);
  EmitNode(&out, root);
  const std::string text = out.c_str();
  const std::string pad(static_cast<size_t>(indent), ' ');
  std::string result;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    result += pad + text.substr(pos, nl - pos) + "\n";
    pos = nl + 1;
  }
  return result;
}

}  // namespace pw::options
