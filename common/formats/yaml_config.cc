#include "common/formats/yaml_config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <set>
#include <sstream>

#include "common/mmap_file.h"

namespace pw::config {

// ---------------------------------------------------------------------------------------------
// ConfigValue

bool ConfigValue::AsBool() const {
  PW_CHECK_MSG(kind_ == Kind::kBool, path_.c_str());
  return b_;
}

int64_t ConfigValue::AsInt() const {
  PW_CHECK_MSG(kind_ == Kind::kInt, path_.c_str());
  return i_;
}

double ConfigValue::AsDouble() const {
  PW_CHECK_MSG(kind_ == Kind::kDouble || kind_ == Kind::kInt, path_.c_str());
  return kind_ == Kind::kInt ? static_cast<double>(i_) : d_;
}

const std::string& ConfigValue::AsString() const {
  PW_CHECK_MSG(kind_ == Kind::kString, path_.c_str());
  return s_;
}

const ConfigValue* ConfigValue::Find(std::string_view key) const {
  PW_CHECK_MSG(kind_ == Kind::kMap, path_.c_str());
  for (const auto& [k, v] : map_) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool ConfigValue::Has(std::string_view key) const { return Find(key) != nullptr; }

const ConfigValue& ConfigValue::operator[](std::string_view key) const {
  const ConfigValue* v = Find(key);
  PW_CHECK_MSG(v != nullptr, (path_ + ": no key " + std::string(key)).c_str());
  return *v;
}

const std::vector<std::pair<std::string, ConfigValue>>& ConfigValue::Entries() const {
  PW_CHECK_MSG(kind_ == Kind::kMap, path_.c_str());
  return map_;
}

const std::vector<ConfigValue>& ConfigValue::Items() const {
  PW_CHECK_MSG(kind_ == Kind::kList, path_.c_str());
  return list_;
}

const ConfigValue& ConfigValue::operator[](size_t i) const {
  PW_CHECK_MSG(kind_ == Kind::kList && i < list_.size(), path_.c_str());
  return list_[i];
}

size_t ConfigValue::size() const {
  if (kind_ == Kind::kMap) return map_.size();
  if (kind_ == Kind::kList) return list_.size();
  return 0;
}

Status ConfigValue::Error(std::string_view message) const {
  std::string where = file_ ? *file_ : std::string("<config>");
  if (line_ > 0) where += ":" + std::to_string(line_) + ":" + std::to_string(column_);
  std::string p = path_.empty() ? std::string("(root)") : path_;
  return InvalidArgument(where + ": " + p + ": " + std::string(message));
}

void ConfigValue::SetOrigin(std::shared_ptr<const std::string> file, std::string path, int line,
                            int column) {
  file_ = std::move(file);
  path_ = std::move(path);
  line_ = line;
  column_ = column;
}

void ConfigValue::Add(std::string key, ConfigValue value) {
  PW_CHECK(kind_ == Kind::kMap);
  map_.emplace_back(std::move(key), std::move(value));
}

void ConfigValue::Push(ConfigValue value) {
  PW_CHECK(kind_ == Kind::kList);
  list_.push_back(std::move(value));
}

// ---------------------------------------------------------------------------------------------
// Schema

Schema Schema::Bool() { return Schema(Kind::kBool); }
Schema Schema::Int() { return Schema(Kind::kInt); }
Schema Schema::Double() { return Schema(Kind::kDouble); }
Schema Schema::String() { return Schema(Kind::kString); }

Schema Schema::Map(std::vector<std::pair<std::string, Schema>> fields) {
  Schema s(Kind::kMap);
  std::set<std::string> names;
  for (auto& [name, f] : fields) {
    PW_CHECK_MSG(names.insert(name).second, ("schema declares key twice: " + name).c_str());
    s.fields_.emplace_back(name, std::make_shared<const Schema>(std::move(f)));
  }
  return s;
}

Schema Schema::MapOf(Schema value) {
  Schema s(Kind::kMapOf);
  s.element_ = std::make_shared<const Schema>(std::move(value));
  return s;
}

Schema Schema::Any() { return Schema(Kind::kAny); }

Schema Schema::List(Schema element) {
  Schema s(Kind::kList);
  s.element_ = std::make_shared<const Schema>(std::move(element));
  return s;
}

Schema Schema::Required() const {
  Schema s = *this;
  s.required_ = true;
  return s;
}

Schema Schema::Default(ConfigValue value) const {
  using VK = ConfigValue::Kind;
  bool fits =
      (kind_ == Kind::kBool && value.kind() == VK::kBool) ||
      (kind_ == Kind::kInt && value.kind() == VK::kInt) ||
      (kind_ == Kind::kDouble && (value.kind() == VK::kDouble || value.kind() == VK::kInt)) ||
      (kind_ == Kind::kString && value.kind() == VK::kString);
  PW_CHECK_MSG(fits, "Schema::Default: value kind does not match the schema");
  Schema s = *this;
  if (kind_ == Kind::kDouble && value.kind() == VK::kInt) value = ConfigValue(value.AsDouble());
  s.default_ = std::move(value);
  return s;
}

Schema Schema::Range(double min, double max) const { return Min(min).Max(max); }

Schema Schema::Min(double min) const {
  PW_CHECK_MSG(kind_ == Kind::kInt || kind_ == Kind::kDouble, "Schema::Min on a non-number");
  Schema s = *this;
  s.min_ = min;
  return s;
}

Schema Schema::Max(double max) const {
  PW_CHECK_MSG(kind_ == Kind::kInt || kind_ == Kind::kDouble, "Schema::Max on a non-number");
  Schema s = *this;
  s.max_ = max;
  return s;
}

Schema Schema::OneOf(std::vector<std::string> allowed) const {
  PW_CHECK_MSG(kind_ == Kind::kString, "Schema::OneOf on a non-string");
  Schema s = *this;
  s.one_of_ = std::move(allowed);
  return s;
}

Schema Schema::NonEmpty() const {
  PW_CHECK_MSG(kind_ == Kind::kString, "Schema::NonEmpty on a non-string");
  Schema s = *this;
  s.non_empty_ = true;
  return s;
}

Schema Schema::Size(size_t min, size_t max) const {
  PW_CHECK_MSG(kind_ == Kind::kList || kind_ == Kind::kMapOf, "Schema::Size on a non-list");
  Schema s = *this;
  s.min_size_ = min;
  s.max_size_ = max;
  return s;
}

Schema Schema::AllowOtherKeys() const {
  PW_CHECK_MSG(kind_ == Kind::kMap, "Schema::AllowOtherKeys on a non-map");
  Schema s = *this;
  s.other_keys_ = true;
  return s;
}

Schema Schema::Check(CheckFn fn) const {
  Schema s = *this;
  s.checks_.push_back(std::move(fn));
  return s;
}

Schema Schema::Doc(std::string text) const {
  Schema s = *this;
  s.doc_ = std::move(text);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Validation

namespace {

// Upper bound on YAML nodes visited: aliases can make a small file expand exponentially.
constexpr size_t kMaxNodesVisited = 1'000'000;
constexpr size_t kMaxFileBytes = 16u << 20;

std::string FormatNumber(double v) {
  std::ostringstream os;
  os.precision(15);
  os << v;
  return os.str();
}

std::string Describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar: {
      std::string s = n.Scalar();
      if (s.size() > 60) s = s.substr(0, 60) + "...";
      return n.Tag() == "!" ? "the quoted string \"" + s + "\"" : "'" + s + "'";
    }
    default:
      return "an undefined value";
  }
}

std::string KeyPath(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

}  // namespace

class Validator {
 public:
  explicit Validator(std::shared_ptr<const std::string> file) : file_(std::move(file)) {}

  // Checks `node` (defined, not null) against `schema`; fills *out.
  Status Check(const YAML::Node& node, const Schema& schema, const std::string& path,
               ConfigValue* out) {
    if (++visited_ > kMaxNodesVisited) {
      return At(node, path,
                "document has more than " + std::to_string(kMaxNodesVisited) +
                    " values (alias expansion?)");
    }
    const YAML::Mark m = node.Mark();
    switch (schema.kind_) {
      case Schema::Kind::kBool:
      case Schema::Kind::kInt:
      case Schema::Kind::kDouble:
      case Schema::Kind::kString:
        PW_RETURN_IF_ERROR(Scalar(node, schema, path, out));
        break;
      case Schema::Kind::kMap:
        PW_RETURN_IF_ERROR(Map(node, schema, path, out));
        break;
      case Schema::Kind::kMapOf:
        PW_RETURN_IF_ERROR(MapOf(node, schema, path, out));
        break;
      case Schema::Kind::kList:
        PW_RETURN_IF_ERROR(List(node, schema, path, out));
        break;
      case Schema::Kind::kAny:
        *out = ConfigValue();
        break;
    }
    out->SetOrigin(file_, path, m.line + 1, m.column + 1);
    for (const auto& fn : schema.checks_) {
      std::string msg = fn(*out);
      if (!msg.empty()) return At(node, path, msg);
    }
    return Status::Ok();
  }

  Status At(const YAML::Node& node, const std::string& path, const std::string& msg) const {
    return AtMark(node.Mark(), path, msg);
  }

  Status AtMark(const YAML::Mark& m, const std::string& path, const std::string& msg) const {
    std::string where = *file_;
    if (!m.is_null())
      where += ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
    return InvalidArgument(where + ": " + (path.empty() ? std::string("(root)") : path) + ": " +
                           msg);
  }

 private:
  Status Scalar(const YAML::Node& node, const Schema& schema, const std::string& path,
                ConfigValue* out) {
    static const char* kWant[] = {"true or false", "an integer", "a number", "a string"};
    const char* want = kWant[static_cast<int>(schema.kind_)];
    if (!node.IsScalar())
      return At(node, path, std::string("expected ") + want + ", got " + Describe(node));
    const bool quoted = node.Tag() == "!";
    switch (schema.kind_) {
      case Schema::Kind::kBool: {
        bool b;
        if (quoted || !YAML::convert<bool>::decode(node, b)) {
          return At(node, path, std::string("expected ") + want + ", got " + Describe(node));
        }
        *out = ConfigValue(b);
        return Status::Ok();
      }
      case Schema::Kind::kInt: {
        int64_t v;
        if (quoted || !YAML::convert<int64_t>::decode(node, v)) {
          return At(node, path, std::string("expected ") + want + ", got " + Describe(node));
        }
        PW_RETURN_IF_ERROR(Bounds(node, schema, path, static_cast<double>(v), std::to_string(v)));
        *out = ConfigValue(v);
        return Status::Ok();
      }
      case Schema::Kind::kDouble: {
        double v;
        if (quoted || !YAML::convert<double>::decode(node, v) || std::isnan(v)) {
          return At(node, path, std::string("expected ") + want + ", got " + Describe(node));
        }
        PW_RETURN_IF_ERROR(Bounds(node, schema, path, v, node.Scalar()));
        *out = ConfigValue(v);
        return Status::Ok();
      }
      case Schema::Kind::kString: {
        const std::string& s = node.Scalar();
        if (schema.non_empty_ && s.empty()) return At(node, path, "must not be empty");
        if (!schema.one_of_.empty()) {
          bool ok = false;
          std::string list;
          for (const auto& a : schema.one_of_) {
            ok = ok || a == s;
            list += (list.empty() ? "" : ", ") + a;
          }
          if (!ok) return At(node, path, Describe(node) + " is not one of: " + list);
        }
        *out = ConfigValue(s);
        return Status::Ok();
      }
      default:
        break;
    }
    return At(node, path, "internal: scalar schema expected");
  }

  Status Bounds(const YAML::Node& node, const Schema& schema, const std::string& path, double v,
                const std::string& text) const {
    if ((schema.min_ && v < *schema.min_) || (schema.max_ && v > *schema.max_)) {
      std::string range = "[" + (schema.min_ ? FormatNumber(*schema.min_) : "-inf") + ", " +
                          (schema.max_ ? FormatNumber(*schema.max_) : "inf") + "]";
      return At(node, path, text + " is out of range " + range);
    }
    return Status::Ok();
  }

  struct Entry {
    std::string name;
    YAML::Node key;
    YAML::Node value;
  };

  // Checks the keys of a YAML map are scalars and distinct; returns the entries in order.
  Status Keys(const YAML::Node& node, const std::string& path, std::vector<Entry>* keys) {
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node k = it->first;  // copies: *it is a temporary
      if (!k.IsScalar()) return At(k, path, "map keys must be plain strings, got " + Describe(k));
      const std::string& name = k.Scalar();
      if (!seen.insert(name).second) return At(k, KeyPath(path, name), "duplicate key");
      const YAML::Node v = it->second;
      keys->push_back(Entry{name, k, v});
    }
    return Status::Ok();
  }

  Status Map(const YAML::Node& node, const Schema& schema, const std::string& path,
             ConfigValue* out) {
    if (!node.IsMap()) return At(node, path, "expected a map, got " + Describe(node));
    std::vector<Entry> keys;
    PW_RETURN_IF_ERROR(Keys(node, path, &keys));
    for (const auto& [name, key_node, unused] : keys) {
      if (schema.other_keys_) break;
      bool known = false;
      for (const auto& f : schema.fields_) known = known || f.first == name;
      if (!known) {
        std::string list;
        for (const auto& f : schema.fields_) list += (list.empty() ? "" : ", ") + f.first;
        return At(key_node, KeyPath(path, name),
                  "unknown key (known keys: " + (list.empty() ? "none" : list) + ")");
      }
    }
    *out = ConfigValue::EmptyMap();
    // Given keys in file order, then absent ones filled from defaults in schema order.
    for (const auto& [name, key_node, v] : keys) {
      const Schema* fs = nullptr;
      for (const auto& f : schema.fields_) {
        if (f.first == name) fs = f.second.get();
      }
      if (fs == nullptr || fs->kind_ == Schema::Kind::kAny) continue;  // unchecked, left out
      if (v.IsNull()) continue;  // `key:` with no value counts as absent
      ConfigValue child;
      PW_RETURN_IF_ERROR(Check(v, *fs, KeyPath(path, name), &child));
      out->Add(name, std::move(child));
    }
    for (const auto& [name, fs] : schema.fields_) {
      if (out->Has(name)) continue;
      ConfigValue filled;
      bool present = false;
      PW_RETURN_IF_ERROR(Absent(node, *fs, KeyPath(path, name), &filled, &present));
      if (present) out->Add(name, std::move(filled));
    }
    return Status::Ok();
  }

  // An absent key: an error if required, its default if any, an all-defaults map if possible.
  Status Absent(const YAML::Node& parent, const Schema& schema, const std::string& path,
                ConfigValue* out, bool* present) {
    *present = false;
    if (schema.required_) return At(parent, path, "required key is missing");
    if (schema.default_) {
      *out = *schema.default_;
      out->SetOrigin(file_, path, 0, 0);
      *present = true;
      return Status::Ok();
    }
    if (schema.kind_ == Schema::Kind::kMap) {
      for (const auto& f : schema.fields_) {
        if (f.second->required_) return Status::Ok();  // stays absent
      }
      *out = ConfigValue::EmptyMap();
      for (const auto& [name, fs] : schema.fields_) {
        ConfigValue child;
        bool child_present = false;
        PW_RETURN_IF_ERROR(Absent(parent, *fs, KeyPath(path, name), &child, &child_present));
        if (child_present) out->Add(name, std::move(child));
      }
      out->SetOrigin(file_, path, 0, 0);
      for (const auto& fn : schema.checks_) {
        std::string msg = fn(*out);
        if (!msg.empty()) return At(parent, path, msg);
      }
      *present = true;
    }
    return Status::Ok();
  }

  Status MapOf(const YAML::Node& node, const Schema& schema, const std::string& path,
               ConfigValue* out) {
    if (!node.IsMap()) return At(node, path, "expected a map, got " + Describe(node));
    std::vector<Entry> keys;
    PW_RETURN_IF_ERROR(Keys(node, path, &keys));
    if (keys.size() < schema.min_size_ || keys.size() > schema.max_size_) {
      return At(node, path, SizeMessage(keys.size(), schema));
    }
    *out = ConfigValue::EmptyMap();
    for (const auto& [name, key_node, v] : keys) {
      if (v.IsNull()) return At(key_node, KeyPath(path, name), "has no value");
      ConfigValue child;
      PW_RETURN_IF_ERROR(Check(v, *schema.element_, KeyPath(path, name), &child));
      out->Add(name, std::move(child));
    }
    return Status::Ok();
  }

  Status List(const YAML::Node& node, const Schema& schema, const std::string& path,
              ConfigValue* out) {
    if (!node.IsSequence()) return At(node, path, "expected a list, got " + Describe(node));
    if (node.size() < schema.min_size_ || node.size() > schema.max_size_) {
      return At(node, path, SizeMessage(node.size(), schema));
    }
    *out = ConfigValue::EmptyList();
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node v = node[i];
      std::string p = path + "[" + std::to_string(i) + "]";
      if (v.IsNull()) return At(v, p, "list item is null");
      ConfigValue child;
      PW_RETURN_IF_ERROR(Check(v, *schema.element_, p, &child));
      out->Push(std::move(child));
    }
    return Status::Ok();
  }

  static std::string SizeMessage(size_t n, const Schema& schema) {
    std::string range =
        "[" + std::to_string(schema.min_size_) + ", " +
        (schema.max_size_ == SIZE_MAX ? std::string("inf") : std::to_string(schema.max_size_)) +
        "]";
    return "has " + std::to_string(n) + " entries, allowed " + range;
  }

  std::shared_ptr<const std::string> file_;
  size_t visited_ = 0;

 public:
  // Entry point: the document root.
  Status Root(const YAML::Node& root, const Schema& schema, ConfigValue* out) {
    if (!root.IsDefined() || root.IsNull()) {
      // An empty document is an empty map when the schema is a map.
      if (schema.kind_ == Schema::Kind::kMap) {
        YAML::Node empty(YAML::NodeType::Map);
        return Check(empty, schema, "", out);
      }
      return AtMark(YAML::Mark::null_mark(), "", "document is empty");
    }
    return Check(root, schema, "", out);
  }
};

Result<ConfigValue> ParseYamlConfig(std::string_view text, const std::string& label,
                                    const Schema& schema) {
  auto file = std::make_shared<const std::string>(label);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    std::string where = label;
    if (!e.mark.is_null()) {
      where += ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    }
    return InvalidArgument(where + ": bad YAML: " + e.msg);
  } catch (const std::exception& e) {
    return InvalidArgument(label + ": bad YAML: " + e.what());
  }
  Validator v(file);
  ConfigValue out;
  try {
    PW_RETURN_IF_ERROR(v.Root(root, schema, &out));
  } catch (const std::exception& e) {  // yaml-cpp accessors; should not happen after checks
    return InvalidArgument(label + ": cannot read YAML: " + e.what());
  }
  return out;
}

Result<ConfigValue> LoadYamlConfig(const std::string& path, const Schema& schema) {
  PW_ASSIGN_OR_RETURN(auto f, MmapFile::Open(path));
  if (f->size() > kMaxFileBytes) {
    return InvalidArgument(path + ": " + std::to_string(f->size()) + " bytes, more than the " +
                           std::to_string(kMaxFileBytes) + " allowed for a config file");
  }
  std::string_view text(reinterpret_cast<const char*>(f->data()), f->size());
  return ParseYamlConfig(text, path, schema);
}

}  // namespace pw::config
