#include "common/text/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <map>
#include <set>

#include "common/text/unicode_case.h"
#include "common/text/unicode_tables.h"

namespace pw {
namespace jinja {

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------
struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, as Python dicts

struct Value {
  // kNamespace: namespace(), the one mutable object (`set ns.attr = ...` writes through every
  // copy). kCallable: a macro (macro != nullptr), a builtin function (s names it) or
  // loop.cycle (s == "cycle", i = the loop's index0).
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<const List> list;
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Dict> ns;
  const Node* macro = nullptr;
  // kList made by map, select, reject, selectattr, rejectattr or items: a generator in Jinja,
  // which is always true, has no length or index and is not JSON; `| list` makes it a list.
  bool lazy = false;
  // kString marked safe (`| safe`, Markup in Jinja): adding a plain string to it escapes that
  // string's HTML characters.
  bool markup = false;

  static Value None() { return Make(Kind::kNone); }
  static Value Bool(bool v) {
    Value x = Make(Kind::kBool);
    x.b = v;
    return x;
  }
  static Value Int(int64_t v) {
    Value x = Make(Kind::kInt);
    x.i = v;
    return x;
  }
  static Value Float(double v) {
    Value x = Make(Kind::kFloat);
    x.f = v;
    return x;
  }
  static Value Str(std::string v) {
    Value x = Make(Kind::kString);
    x.s = std::move(v);
    return x;
  }
  static Value MakeList(List v) {
    Value x = Make(Kind::kList);
    x.list = std::make_shared<const List>(std::move(v));
    return x;
  }
  static Value MakeDict(Dict v) {
    Value x = Make(Kind::kDict);
    x.dict = std::make_shared<const Dict>(std::move(v));
    return x;
  }
  static Value Make(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }
  static Value Builtin(std::string name) {
    Value x = Make(Kind::kCallable);
    x.s = std::move(name);
    return x;
  }
  bool IsNumber() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  double AsDouble() const { return kind == Kind::kFloat ? f : kind == Kind::kBool ? b : double(i); }
  const Value* Find(std::string_view key) const {
    const Dict* d = kind == Kind::kDict ? dict.get() : kind == Kind::kNamespace ? ns.get() : nullptr;
    if (!d) return nullptr;
    for (const auto& [k, v] : *d) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

const char* KindName(Value::Kind k) {
  switch (k) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "none";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kCallable:
      return "function";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i != 0;
    case Value::Kind::kFloat:
      return v.f != 0;
    case Value::Kind::kString:
      return !v.s.empty();
    case Value::Kind::kList:
      return v.lazy || !v.list->empty();
    case Value::Kind::kDict:
      return !v.dict->empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

// Python strings index by code point; these templates' strings are UTF-8. Offsets of each code
// point's first byte, plus the end.
std::vector<size_t> CodePointOffsets(const std::string& s) {
  std::vector<size_t> off;
  off.reserve(s.size() + 1);
  for (size_t k = 0; k < s.size(); ++k) {
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) off.push_back(k);
  }
  off.push_back(s.size());
  return off;
}
size_t CodePointCount(const std::string& s) { return CodePointOffsets(s).size() - 1; }

// Dict keys are strings; other keys Python allows ({0: 0}, {none: 1}) are kept in a form no
// string can take (0xFF never occurs in UTF-8): the byte, the kind, the value.
constexpr char kKeyMark = '\xff';
bool KeyOf(const Value& v, std::string* key) {
  switch (v.kind) {
    case Value::Kind::kString:
      *key = v.s;
      return true;
    case Value::Kind::kInt:
      *key = std::string(1, kKeyMark) + "i" + std::to_string(v.i);
      return true;
    case Value::Kind::kBool:
      *key = std::string(1, kKeyMark) + "i" + (v.b ? "1" : "0");  // True == 1 in Python
      return true;
    case Value::Kind::kNone:
      *key = std::string(1, kKeyMark) + "n";
      return true;
    default:
      return false;
  }
}
Value KeyValue(const std::string& key) {
  if (key.empty() || key[0] != kKeyMark) return Value::Str(key);
  if (key.size() >= 2 && key[1] == 'i') return Value::Int(std::stoll(key.substr(2)));
  return Value::None();
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string Repr(const Value& v);

// Python str() of a value, which is what {{ }} prints.
std::string ToString(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return FloatRepr(v.f);
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kNamespace:
      return "<Namespace>";
    case Value::Kind::kCallable:
      return "<function " + v.s + ">";
    case Value::Kind::kList:
      if (v.lazy) return "<generator object>";
      return Repr(v);
    default:
      return Repr(v);
  }
}

// Python repr(), used when lists and dicts are printed.
std::string Repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString: {
      const bool dq = v.s.find('\'') != std::string::npos && v.s.find('"') == std::string::npos;
      const char q = dq ? '"' : '\'';
      std::string out(1, q);
      for (char c : v.s) {
        if (c == '\\')
          out += "\\\\";
        else if (c == '\n')
          out += "\\n";
        else if (c == '\r')
          out += "\\r";
        else if (c == '\t')
          out += "\\t";
        else if (c == q)
          out += std::string("\\") + q;
        else
          out += c;
      }
      return out + q;
    }
    case Value::Kind::kList: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + Repr((*v.list)[k]);
      return out + "]";
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, val] : *v.dict) {
        out += (first ? "" : ", ") + Repr(KeyValue(key)) + ": " + Repr(val);
        first = false;
      }
      return out + "}";
    }
    default:
      return ToString(v);
  }
}

// How json.dumps writes: HF's tojson filter is json.dumps(x, ensure_ascii=False, indent=None,
// sort_keys=False) with keyword arguments the template may override.
struct JsonStyle {
  int indent = -1;  // -1: None (one line, ", " and ": ")
  bool ensure_ascii = false;
  bool sort_keys = false;
};

void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t k = 0; k < s.size(); ++k) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else if (c >= 0x80 && ensure_ascii) {
          // Decode one UTF-8 sequence; code points above U+FFFF become a surrogate pair.
          const int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
          uint32_t cp = n == 3 ? c & 0x07 : n == 2 ? c & 0x0F : c & 0x1F;
          for (int j = 0; j < n && k + 1 < s.size(); ++j) {
            cp = (cp << 6) | (static_cast<unsigned char>(s[++k]) & 0x3F);
          }
          char buf[16];
          if (cp >= 0x10000) {
            cp -= 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                          0xDC00 + (cp & 0x3FF));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
          }
          *out += buf;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

// json.dumps(x, ...) as HF's tojson filter; false for what JSON cannot hold (an undefined value,
// a namespace, a macro), where Python raises.
bool ToJson(const Value& v, const JsonStyle& style, int depth, std::string* out) {
  auto newline = [&](int d) {
    if (style.indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(style.indent) * d, ' ');
  };
  const char* item_sep = style.indent < 0 ? ", " : ",";
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
      return false;
    case Value::Kind::kNone:
      *out += "null";
      return true;
    case Value::Kind::kBool:
      *out += v.b ? "true" : "false";
      return true;
    case Value::Kind::kInt:
      *out += std::to_string(v.i);
      return true;
    case Value::Kind::kFloat:
      *out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                                                         : FloatRepr(v.f);
      return true;
    case Value::Kind::kString:
      JsonString(v.s, style.ensure_ascii, out);
      return true;
    case Value::Kind::kList:
      if (v.lazy) return false;
      if (v.list->empty()) {
        *out += "[]";
        return true;
      }
      *out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) *out += item_sep;
        newline(depth + 1);
        if (!ToJson((*v.list)[k], style, depth + 1, out)) return false;
      }
      newline(depth);
      *out += ']';
      return true;
    case Value::Kind::kDict: {
      if (v.dict->empty()) {
        *out += "{}";
        return true;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.dict) items.push_back(&kv);
      if (style.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      *out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) *out += item_sep;
        newline(depth + 1);
        // json.dumps writes keys as strings (None as "null").
        const Value key = KeyValue(items[k]->first);
        JsonString(key.kind == Value::Kind::kNone ? "null" : ToString(key), style.ensure_ascii,
                   out);
        *out += ": ";
        if (!ToJson(items[k]->second, style, depth + 1, out)) return false;
      }
      newline(depth);
      *out += '}';
      return true;
    }
  }
  return false;
}

bool Equal(const Value& a, const Value& b) {
  if (a.IsNumber() && b.IsNumber()) return a.AsDouble() == b.AsDouble();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kNamespace:
      return a.ns == b.ns;
    case Value::Kind::kCallable:
      return a.macro == b.macro && a.s == b.s;
    case Value::Kind::kList:
      if (a.lazy || b.lazy) return false;  // a generator equals nothing but itself
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case Value::Kind::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [key, val] : *a.dict) {
        const Value* other = b.Find(key);
        if (!other || !Equal(val, *other)) return false;
      }
      return true;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Syntax tree
// ---------------------------------------------------------------------------------------------
struct Expr {
  enum class Op {
    kLiteral,
    kName,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kBinary,
    kAnd,
    kOr,
    kIfElse,
    kList,
    kDict
  };
  Op op;
  size_t pos = 0;       // offset in the template source
  Value literal;        // kLiteral
  std::string name;     // kName / kAttr / kFilter / kTest / kBinary operator
  bool negate = false;  // kTest: `is not`
  // kFilter/kTest: a name Jinja itself does not define (no builtin of jinja2 or of HF's
  // environment). Allowed only where Jinja checks it at run time (an if's test and branches, an
  // inline if: Parser::CheckUnknownNames); evaluating it is an error, as there.
  bool unknown = false;
  // kAttr/kItem/kFilter/kTest/kNot/kNeg: args[0] is the operand (kItem: args[1] the index);
  // kSlice: object, start, stop, step (null when omitted); kCall: callee then arguments;
  // kBinary/kAnd/kOr: left, right; kIfElse: value, condition, else value (may be null);
  // kList: items; kDict: key, value, key, value, ...
  std::vector<std::unique_ptr<Expr>> args;
  // kCall/kFilter/kTest: the keyword of each argument in args ("" for positional ones; empty
  // when there are none).
  std::vector<std::string> kw;
};

struct Node {
  enum class Kind {
    kBlock,
    kText,
    kOutput,
    kFor,
    kIf,
    kSet,
    kSetAttr,      // set ns.attr = expr: vars = {ns, attr}
    kSetBlock,     // set name %}...{% endset: vars = {name}, children = {body}
    kMacro,        // vars = {name, params...}, conds = default per param (null: none)
    kFilterBlock,  // expr: the filter chain applied to a kLiteral placeholder; children = {body}
    kCallBlock,    // {% call(params) m(args) %}body{% endcall %}: expr = the macro call, vars =
                   // the caller's parameters, children = {body} (what caller() renders)
    kBreak,
    kContinue
  };
  Kind kind = Kind::kBlock;
  size_t pos = 0;
  std::string text;                             // kText
  std::unique_ptr<Expr> expr;                   // kOutput, kFor iterable, kSet value
  std::vector<std::string> vars;                // kFor loop targets, kSet target
  std::vector<std::unique_ptr<Node>> children;  // kBlock statements; kFor body then the else
                                                // block when there is one
  std::vector<std::unique_ptr<Expr>> conds;     // kIf conditions; children holds one block per
                                                // condition plus one more for else; kFor: the
                                                // loop filter (`for x in y if c`) or none
};

// ---------------------------------------------------------------------------------------------
// Lexing: the template into text and tags, applying whitespace control, trim_blocks and
// lstrip_blocks as Jinja does.
// ---------------------------------------------------------------------------------------------
struct Piece {
  enum class Kind { kText, kVar, kBlock };
  Kind kind;
  std::string body;  // text, or the tag's inside without delimiters and whitespace markers
  size_t pos;        // offset of the body in the source
};

std::string LineCol(std::string_view src, size_t pos) {
  size_t line = 1, col = 1;
  for (size_t k = 0; k < pos && k < src.size(); ++k) {
    if (src[k] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

// "chat template: line L, column C: " for an offset in the template source.
std::string Where(std::string_view src, size_t pos) {
  std::string out = "chat template: ";
  out += LineCol(src, pos);
  out += ": ";
  return out;
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  Status Run(std::vector<Piece>* out) {
    size_t p = 0;
    bool line_starting = true;  // the text being scanned starts a line
    bool strip_next = false;    // the previous tag ended with '-'
    while (p <= src_.size()) {
      size_t open = src_.find('{', p);
      while (open != std::string_view::npos && open + 1 < src_.size() && src_[open + 1] != '{' &&
             src_[open + 1] != '%' && src_[open + 1] != '#') {
        open = src_.find('{', open + 1);
      }
      if (open != std::string_view::npos && open + 1 >= src_.size()) open = std::string_view::npos;
      std::string text(
          src_.substr(p, open == std::string_view::npos ? std::string_view::npos : open - p));
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && IsSpace(text[k])) ++k;
        text.erase(0, k);
        strip_next = false;
      }
      if (open == std::string_view::npos) {
        if (!text.empty()) out->push_back({Piece::Kind::kText, text, p});
        break;
      }
      const char kind = src_[open + 1];
      size_t body = open + 2;
      char sign = 0;
      if (body < src_.size() && (src_[body] == '-' || src_[body] == '+')) sign = src_[body++];
      if (sign == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool only_ws = true;
          for (size_t k = l_pos; k < text.size(); ++k) {
            if (!IsSpace(text[k])) only_ws = false;
          }
          if (only_ws) text.erase(l_pos);
        }
      }
      if (!text.empty()) out->push_back({Piece::Kind::kText, text, p});
      // Find the closing delimiter (string literals inside tags may contain it, and so may
      // brackets: Jinja ends a tag only outside them, as in {{ {'a': {'b': 1}} }}).
      const char close = kind == '{' ? '}' : kind == '%' ? '%' : '#';
      size_t q = body;
      size_t end = std::string_view::npos;
      int brackets = 0;
      while (q < src_.size()) {
        const char c = src_[q];
        if (kind != '#' && (c == '{' || c == '[' || c == '(')) {
          ++brackets;
          ++q;
          continue;
        }
        if (kind != '#' && brackets > 0 && (c == '}' || c == ']' || c == ')')) {
          --brackets;
          ++q;
          continue;
        }
        if (kind != '#' && (c == '\'' || c == '"')) {
          const size_t s = q++;
          while (q < src_.size() && src_[q] != c) q += src_[q] == '\\' ? 2 : 1;
          if (q >= src_.size()) {
            return InvalidArgument(Where(src_, s) + "unterminated string literal");
          }
          ++q;
          continue;
        }
        if (c == close && q + 1 < src_.size() && src_[q + 1] == '}') {
          end = q;
          break;
        }
        ++q;
      }
      if (end == std::string_view::npos) {
        return InvalidArgument(Where(src_, open) + "tag opened with '{" + std::string(1, kind) +
                               "' is never closed");
      }
      size_t body_end = end;
      bool strip_after = false;
      if (body_end > body && src_[body_end - 1] == '-') {
        strip_after = true;
        --body_end;
      }
      p = end + 2;
      if (kind != '#') {
        out->push_back({kind == '{' ? Piece::Kind::kVar : Piece::Kind::kBlock,
                        std::string(src_.substr(body, body_end - body)), body});
      }
      if (strip_after) {
        strip_next = true;
      } else if (kind != '{' && p < src_.size() && src_[p] == '\n') {  // trim_blocks
        ++p;
        line_starting = true;
        continue;
      }
      line_starting = false;
      if (p == src_.size()) break;
    }
    return Status::Ok();
  }

 private:
  std::string_view src_;
};

// ---------------------------------------------------------------------------------------------
// Expression tokens and parser
// ---------------------------------------------------------------------------------------------
struct Tok {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd };
  Kind kind;
  std::string text;
  size_t pos;
};

const std::set<std::string>& Filters() {
  static const std::set<std::string> k = {
      "trim",  "length",     "count",      "upper",    "lower",     "capitalize", "title",
      "string", "first",     "last",       "join",     "default",   "d",          "tojson",
      "list",  "items",      "dictsort",   "unique",   "replace",   "indent",     "wordcount",
      "int",   "float",      "abs",        "round",    "safe",      "select",     "reject",
      "selectattr", "rejectattr", "map", "sort",     "min",       "max",       "format"};
  return k;
}
// Every filter and test jinja2 defines (with HF's tojson): one of these that this engine lacks
// is unsupported (the template is refused at load); any other name is unknown to Jinja too.
const std::set<std::string>& Jinja2Filters() {
  static const std::set<std::string> k = {
      "abs",      "attr",    "batch",  "capitalize", "center",     "count",     "d",          "default",
      "dictsort", "e",       "escape", "filesizeformat", "first",  "float",     "forceescape", "format",
      "groupby",  "indent",  "int",    "items",      "join",       "last",      "length",     "list",
      "lower",    "map",     "max",    "min",        "pprint",     "random",    "reject",     "rejectattr",
      "replace",  "reverse", "round",  "safe",       "select",     "selectattr", "slice",     "sort",
      "string",   "striptags", "sum",  "title",      "tojson",     "trim",      "truncate",   "unique",
      "upper",    "urlencode", "urlize", "wordcount", "wordwrap",  "xmlattr"};
  return k;
}
const std::set<std::string>& Jinja2Tests() {
  static const std::set<std::string> k = {
      "!=",       "<",        "<=",      "==",     ">",       ">=",       "boolean",     "callable",
      "defined",  "divisibleby", "eq",   "equalto", "escaped", "even",    "false",       "filter",
      "float",    "ge",       "greaterthan", "gt", "in",      "integer",  "iterable",    "le",
      "lessthan", "lower",    "lt",      "mapping", "ne",     "none",     "number",      "odd",
      "sameas",   "sequence", "string",  "test",   "true",    "undefined", "upper"};
  return k;
}
// The methods of Python's list and dict that modify them: jinja2's immutable sandbox (HF's)
// refuses to call them (SecurityError), and so does the renderer, when the call is reached.
const std::set<std::string>& ListMutators() {
  static const std::set<std::string> k = {"append", "clear", "pop",  "reverse",
                                          "insert", "sort",  "extend", "remove"};
  return k;
}
const std::set<std::string>& DictMutators() {
  static const std::set<std::string> k = {"clear", "pop", "popitem", "setdefault", "update"};
  return k;
}
const std::set<std::string>& Tests() {
  static const std::set<std::string> k = {
      "defined", "undefined", "none",  "string",  "number", "integer",     "float", "boolean",
      "sequence", "mapping",  "true",  "false",   "iterable", "callable",  "odd",   "even",
      "divisibleby", "lower", "upper", "equalto", "eq",     "==",          "ne",    "!=", "sameas",
      "lt",      "<",         "le",    "<=",      "gt",     ">",           "ge",    ">=",
      "in"};
  return k;
}
const std::set<std::string>& Methods() {
  static const std::set<std::string> k = {
      "strip", "lstrip", "rstrip", "upper",  "lower", "startswith", "endswith", "replace",
      "split", "title",  "capitalize", "get", "keys", "values",     "items",    "cycle",
      "format", "append", "clear", "pop", "reverse", "insert", "sort", "extend", "remove",
      "popitem", "setdefault", "update"};
  return k;
}
const std::set<std::string>& Functions() {
  static const std::set<std::string> k = {"raise_exception", "range", "namespace", "strftime_now",
                                          "dict", "caller"};
  return k;
}

class ExprParser {
 public:
  // Calls of names that are not builtins go to *called (name, offset): they must be macros,
  // which the statement parser checks once it has seen them all.
  ExprParser(std::string_view src, const Piece& piece,
             std::vector<std::pair<std::string, size_t>>* called)
      : src_(src), piece_(piece), called_(called) {}

  Status Tokenize() {
    const std::string& b = piece_.body;
    size_t i = 0;
    while (i < b.size()) {
      const char c = b[i];
      const size_t pos = piece_.pos + i;
      if (IsSpace(c)) {
        ++i;
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < b.size() && (std::isalnum(static_cast<unsigned char>(b[j])) || b[j] == '_')) ++j;
        toks_.push_back({Tok::Kind::kName, b.substr(i, j - i), pos});
        i = j;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t j = i;
        while (j < b.size() && std::isdigit(static_cast<unsigned char>(b[j]))) ++j;
        bool is_float = false;
        if (j + 1 < b.size() && b[j] == '.' && std::isdigit(static_cast<unsigned char>(b[j + 1]))) {
          is_float = true;
          ++j;
          while (j < b.size() && std::isdigit(static_cast<unsigned char>(b[j]))) ++j;
        }
        toks_.push_back({is_float ? Tok::Kind::kFloat : Tok::Kind::kInt, b.substr(i, j - i), pos});
        i = j;
      } else if (c == '\'' || c == '"') {
        std::string s;
        size_t j = i + 1;
        while (j < b.size() && b[j] != c) {
          if (b[j] == '\\' && j + 1 < b.size()) {
            const char e = b[j + 1];
            switch (e) {
              case 'n':
                s += '\n';
                break;
              case 't':
                s += '\t';
                break;
              case 'r':
                s += '\r';
                break;
              case '\\':
                s += '\\';
                break;
              case '\'':
                s += '\'';
                break;
              case '"':
                s += '"';
                break;
              case '0':
                s += '\0';
                break;
              default:
                s += '\\';
                s += e;
                break;  // Python keeps unknown escapes verbatim
            }
            j += 2;
          } else {
            s += b[j++];
          }
        }
        if (j >= b.size()) return Err(pos, "unterminated string literal", false);
        toks_.push_back({Tok::Kind::kString, s, pos});
        i = j + 1;
      } else {
        static const char* kOps[] = {"//", "==", "!=", "<=", ">=", "**", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                     "{",  "}",  ".",  ",",  ":",  "|",  "="};
        bool found = false;
        for (const char* op : kOps) {
          const size_t n = std::char_traits<char>::length(op);
          if (b.compare(i, n, op) == 0) {
            toks_.push_back({Tok::Kind::kOp, op, pos});
            i += n;
            found = true;
            break;
          }
        }
        if (!found) return Err(pos, "unexpected character '" + std::string(1, c) + "'", false);
      }
    }
    toks_.push_back({Tok::Kind::kEnd, "", piece_.pos + b.size()});
    return Status::Ok();
  }

  const Tok& Peek(size_t ahead = 0) const { return toks_[std::min(k_ + ahead, toks_.size() - 1)]; }
  bool AtEnd() const { return Peek().kind == Tok::Kind::kEnd; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::Kind::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::Kind::kName && Peek(ahead).text == name;
  }
  const Tok& Next() { return toks_[std::min(k_++, toks_.size() - 1)]; }

  // kUnsupported for constructs this renderer lacks, kInvalidArgument for malformed input.
  Status Err(size_t pos, const std::string& what, bool unsupported) const {
    const std::string msg = Where(src_, pos) + what;
    return unsupported ? Unsupported(msg) : InvalidArgument(msg);
  }
  Status Expect(const char* op) {
    if (!IsOp(op)) return Err(Peek().pos, std::string("expected '") + op + "'", false);
    Next();
    return Status::Ok();
  }
  Result<std::string> ExpectName() {
    if (Peek().kind != Tok::Kind::kName) return Err(Peek().pos, "expected a name", false);
    return Next().text;
  }
  Status ExpectEnd() {
    if (!AtEnd()) return Err(Peek().pos, "unexpected '" + Peek().text + "'", false);
    return Status::Ok();
  }

  using ExprP = std::unique_ptr<Expr>;
  static ExprP Make(Expr::Op op, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->op = op;
    e->pos = pos;
    return e;
  }

  // Bounds the parser's recursion (and so the renderer's) on pathological nesting.
  static constexpr int kMaxDepth = 200;
  struct DepthGuard {
    int* depth;
    explicit DepthGuard(int* d) : depth(d) { ++*depth; }
    ~DepthGuard() { --*depth; }
  };
  Status CheckDepth() const {
    if (depth_ > kMaxDepth) return Err(Peek().pos, "expression nested too deeply", false);
    return Status::Ok();
  }

  Result<ExprP> ParseExpr() {  // a if c else b
    DepthGuard guard(&depth_);
    PW_RETURN_IF_ERROR(CheckDepth());
    PW_ASSIGN_OR_RETURN(ExprP value, ParseOr());
    if (IsName("if")) {
      const size_t pos = Next().pos;
      auto e = Make(Expr::Op::kIfElse, pos);
      PW_ASSIGN_OR_RETURN(ExprP cond, ParseOr());
      ExprP other;
      if (IsName("else")) {
        Next();
        PW_ASSIGN_OR_RETURN(other, ParseExpr());
      }
      e->args.push_back(std::move(value));
      e->args.push_back(std::move(cond));
      e->args.push_back(std::move(other));
      return e;
    }
    return value;
  }

  Result<ExprP> ParseOr() {
    PW_ASSIGN_OR_RETURN(ExprP left, ParseAnd());
    while (IsName("or")) {
      auto e = Make(Expr::Op::kOr, Next().pos);
      PW_ASSIGN_OR_RETURN(ExprP right, ParseAnd());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprP> ParseAnd() {
    PW_ASSIGN_OR_RETURN(ExprP left, ParseNot());
    while (IsName("and")) {
      auto e = Make(Expr::Op::kAnd, Next().pos);
      PW_ASSIGN_OR_RETURN(ExprP right, ParseNot());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprP> ParseNot() {
    DepthGuard guard(&depth_);
    PW_RETURN_IF_ERROR(CheckDepth());
    if (IsName("not")) {
      auto e = Make(Expr::Op::kNot, Next().pos);
      PW_ASSIGN_OR_RETURN(ExprP operand, ParseNot());
      e->args.push_back(std::move(operand));
      return e;
    }
    return ParseCompare();
  }

  Result<ExprP> ParseCompare() {
    PW_ASSIGN_OR_RETURN(ExprP left, ParseMath1());
    while (true) {
      std::string op;
      const size_t pos = Peek().pos;
      if (Peek().kind == Tok::Kind::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else if (IsName("is")) {
        Next();
        auto e = Make(Expr::Op::kTest, pos);
        if (IsName("not")) {
          Next();
          e->negate = true;
        }
        PW_ASSIGN_OR_RETURN(e->name, ExpectName());
        if (!Tests().count(e->name)) {
          if (Jinja2Tests().count(e->name)) return Err(pos, "unsupported test '" + e->name + "'", true);
          e->unknown = true;
        }
        e->args.push_back(std::move(left));
        if (IsOp("(")) {
          PW_RETURN_IF_ERROR(ParseCallArgs(e.get()));
        } else if (Peek().kind == Tok::Kind::kString || Peek().kind == Tok::Kind::kInt ||
                   Peek().kind == Tok::Kind::kFloat || IsOp("[") || IsOp("{") ||
                   (Peek().kind == Tok::Kind::kName && !IsName("and") && !IsName("or") &&
                    !IsName("else") && !IsName("if") && !IsName("is") && !IsName("in") &&
                    !IsName("not"))) {
          // `x is divisibleby 3`, `x is sameas none`: one argument without parentheses.
          PW_ASSIGN_OR_RETURN(ExprP arg, ParsePrimary());
          PW_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg), false));
          e->args.push_back(std::move(arg));
        }
        left = std::move(e);
        continue;
      } else {
        break;
      }
      auto e = Make(Expr::Op::kBinary, pos);
      e->name = op;
      PW_ASSIGN_OR_RETURN(ExprP right, ParseMath1());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  // Jinja's precedence: + - below ~ below * / // % below unary minus.
  Result<ExprP> ParseMath1() {
    PW_ASSIGN_OR_RETURN(ExprP left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      auto e = Make(Expr::Op::kBinary, Peek().pos);
      e->name = Next().text;
      PW_ASSIGN_OR_RETURN(ExprP right, ParseConcat());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprP> ParseConcat() {
    PW_ASSIGN_OR_RETURN(ExprP left, ParseMath2());
    while (IsOp("~")) {
      auto e = Make(Expr::Op::kBinary, Next().pos);
      e->name.push_back('~');  // (assigning the literal trips a GCC 12 -Wrestrict false positive)
      PW_ASSIGN_OR_RETURN(ExprP right, ParseMath2());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprP> ParseMath2() {
    PW_ASSIGN_OR_RETURN(ExprP left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      auto e = Make(Expr::Op::kBinary, Peek().pos);
      e->name = Next().text;
      PW_ASSIGN_OR_RETURN(ExprP right, ParsePow());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  // Jinja's `**` takes unary operands on both sides: -2 ** 2 is 4.
  Result<ExprP> ParsePow() {
    PW_ASSIGN_OR_RETURN(ExprP left, ParseUnary());
    while (IsOp("**")) {
      auto e = Make(Expr::Op::kBinary, Peek().pos);
      e->name = Next().text;
      PW_ASSIGN_OR_RETURN(ExprP right, ParseUnary());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  // As Jinja: filters apply to the negated value (-3 | abs is 3); the operand of - takes
  // attributes, subscripts and calls but not filters.
  Result<ExprP> ParseUnary(bool filters = true) {
    DepthGuard guard(&depth_);
    PW_RETURN_IF_ERROR(CheckDepth());
    ExprP e;
    if (IsOp("-")) {
      e = Make(Expr::Op::kNeg, Next().pos);
      PW_ASSIGN_OR_RETURN(ExprP operand, ParseUnary(false));
      e->args.push_back(std::move(operand));
    } else if (IsOp("+")) {
      Next();
      PW_ASSIGN_OR_RETURN(e, ParseUnary(false));
    } else {
      PW_ASSIGN_OR_RETURN(e, ParsePrimary());
    }
    return ParsePostfix(std::move(e), filters);
  }

  Status ParseCallArgs(Expr* e) {
    PW_RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      std::string key;
      if (Peek().kind == Tok::Kind::kName && IsOp("=", 1)) {
        key = Next().text;
        Next();
      } else if (!e->kw.empty() && !e->kw.back().empty()) {
        return Err(Peek().pos, "positional argument after keyword argument", false);
      }
      PW_ASSIGN_OR_RETURN(ExprP arg, ParseExpr());
      if (!key.empty() && e->kw.empty()) e->kw.resize(e->args.size());
      e->args.push_back(std::move(arg));
      if (!e->kw.empty()) e->kw.push_back(key);
      if (!IsOp(",")) break;
      Next();
    }
    return Expect(")");
  }

  Result<ExprP> ParsePostfix(ExprP e, bool filters) {
    while (true) {
      if (IsOp(".")) {
        const size_t pos = Next().pos;
        auto a = Make(Expr::Op::kAttr, pos);
        PW_ASSIGN_OR_RETURN(a->name, ExpectName());
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (IsOp("[")) {
        const size_t pos = Next().pos;
        ExprP parts[3];
        int colons = 0;
        while (true) {
          if (IsOp(":")) {
            Next();
            if (++colons > 2) return Err(Peek().pos, "too many ':' in a slice", false);
            continue;
          }
          if (IsOp("]")) break;
          if (parts[colons]) return Err(Peek().pos, "expected ']'", false);
          PW_ASSIGN_OR_RETURN(parts[colons], ParseExpr());
        }
        Next();
        if (colons == 0) {
          if (!parts[0]) return Err(pos, "empty subscript", false);
          auto it = Make(Expr::Op::kItem, pos);
          it->args.push_back(std::move(e));
          it->args.push_back(std::move(parts[0]));
          e = std::move(it);
        } else {
          auto s = Make(Expr::Op::kSlice, pos);
          s->args.push_back(std::move(e));
          for (auto& p : parts) s->args.push_back(std::move(p));
          e = std::move(s);
        }
      } else if (IsOp("(")) {
        const size_t pos = Peek().pos;
        if (e->op == Expr::Op::kName) {
          if (!Functions().count(e->name)) called_->emplace_back(e->name, e->pos);
        } else if (e->op == Expr::Op::kAttr) {
          if (!Methods().count(e->name)) {
            return Err(e->pos, "unsupported method '" + e->name + "'", true);
          }
        } else {
          return Err(pos, "only functions and methods can be called", true);
        }
        auto c = Make(Expr::Op::kCall, pos);
        c->args.push_back(std::move(e));
        PW_RETURN_IF_ERROR(ParseCallArgs(c.get()));
        e = std::move(c);
      } else if (filters && IsOp("|")) {
        const size_t pos = Next().pos;
        auto f = Make(Expr::Op::kFilter, pos);
        PW_ASSIGN_OR_RETURN(f->name, ExpectName());
        if (!Filters().count(f->name)) {
          if (Jinja2Filters().count(f->name)) return Err(pos, "unsupported filter '" + f->name + "'", true);
          f->unknown = true;
        }
        f->args.push_back(std::move(e));
        if (IsOp("(")) PW_RETURN_IF_ERROR(ParseCallArgs(f.get()));
        e = std::move(f);
      } else {
        return e;
      }
    }
  }

  Result<ExprP> ParsePrimary() {
    const Tok& t = Peek();
    if (t.kind == Tok::Kind::kString) {
      auto e = Make(Expr::Op::kLiteral, t.pos);
      std::string s;
      while (Peek().kind == Tok::Kind::kString) s += Next().text;  // adjacent literals join
      e->literal = Value::Str(std::move(s));
      return e;
    }
    if (t.kind == Tok::Kind::kInt || t.kind == Tok::Kind::kFloat) {
      auto e = Make(Expr::Op::kLiteral, t.pos);
      if (t.kind == Tok::Kind::kInt) {
        int64_t v = 0;
        auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) return Err(t.pos, "integer literal out of range", false);
        e->literal = Value::Int(v);
      } else {
        e->literal = Value::Float(std::strtod(t.text.c_str(), nullptr));
      }
      Next();
      return e;
    }
    if (t.kind == Tok::Kind::kName) {
      auto e = Make(Expr::Op::kLiteral, t.pos);
      if (t.text == "true" || t.text == "True") {
        e->literal = Value::Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        e->literal = Value::Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        e->literal = Value::None();
      } else {
        static const std::set<std::string> kReserved = {"and", "or",   "not",  "in",  "is",
                                                        "if",  "else", "elif", "for", "endfor"};
        if (kReserved.count(t.text)) return Err(t.pos, "unexpected '" + t.text + "'", false);
        e->op = Expr::Op::kName;
        e->name = t.text;
      }
      Next();
      return e;
    }
    if (IsOp("(")) {
      const size_t pos = Next().pos;
      if (IsOp(")")) {  // () is an empty tuple
        Next();
        return Make(Expr::Op::kList, pos);
      }
      PW_ASSIGN_OR_RETURN(ExprP e, ParseExpr());
      if (IsOp(",")) {  // a tuple, which behaves as a list here
        auto t = Make(Expr::Op::kList, pos);
        t->args.push_back(std::move(e));
        while (IsOp(",")) {
          Next();
          if (IsOp(")")) break;
          PW_ASSIGN_OR_RETURN(ExprP item, ParseExpr());
          t->args.push_back(std::move(item));
        }
        e = std::move(t);
      }
      PW_RETURN_IF_ERROR(Expect(")"));
      return e;
    }
    if (IsOp("[")) {
      auto e = Make(Expr::Op::kList, Next().pos);
      while (!IsOp("]")) {
        PW_ASSIGN_OR_RETURN(ExprP item, ParseExpr());
        e->args.push_back(std::move(item));
        if (!IsOp(",")) break;
        Next();
      }
      PW_RETURN_IF_ERROR(Expect("]"));
      return e;
    }
    if (IsOp("{")) {
      auto e = Make(Expr::Op::kDict, Next().pos);
      while (!IsOp("}")) {
        PW_ASSIGN_OR_RETURN(ExprP key, ParseExpr());
        PW_RETURN_IF_ERROR(Expect(":"));
        PW_ASSIGN_OR_RETURN(ExprP value, ParseExpr());
        e->args.push_back(std::move(key));
        e->args.push_back(std::move(value));
        if (!IsOp(",")) break;
        Next();
      }
      PW_RETURN_IF_ERROR(Expect("}"));
      return e;
    }
    if (t.kind == Tok::Kind::kEnd) return Err(t.pos, "expected an expression", false);
    return Err(t.pos, "unexpected '" + t.text + "'", false);
  }

 private:
  std::string_view src_;
  const Piece& piece_;
  std::vector<std::pair<std::string, size_t>>* called_;
  std::vector<Tok> toks_;
  size_t k_ = 0;
  int depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Statement parser
// ---------------------------------------------------------------------------------------------
class Parser {
 public:
  Parser(std::string_view src, std::vector<Piece> pieces) : src_(src), pieces_(std::move(pieces)) {}

  Result<std::unique_ptr<Node>> ParseAll() {
    std::string end_tag;
    PW_ASSIGN_OR_RETURN(auto block, ParseBlock({}, &end_tag));
    // A call of a name that is neither a builtin nor a macro of this template.
    for (const auto& [name, pos] : called_) {
      if (!macros_.count(name)) return Err(pos, "unsupported function '" + name + "'", true);
    }
    PW_RETURN_IF_ERROR(CheckUnknownNames(*block, false));
    return block;
  }

  // jinja2 refuses a filter or test it does not define when it compiles the template, except
  // in a "soft" frame (an if's test and branches, an inline if), where the error waits until
  // the filter is reached: templates guard `args | from_json` with `if args is string`. A for
  // loop's body and filter, a macro, a set block and a filter block start a frame that is not
  // soft again; a for's iterable is in the enclosing one.
  Status CheckUnknownNames(const Node& n, bool soft) const {
    switch (n.kind) {
      case Node::Kind::kIf:
        for (const auto& c : n.conds) PW_RETURN_IF_ERROR(CheckUnknownNames(c.get(), true));
        for (const auto& c : n.children) PW_RETURN_IF_ERROR(CheckUnknownNames(*c, true));
        return Status::Ok();
      case Node::Kind::kFor:
        PW_RETURN_IF_ERROR(CheckUnknownNames(n.expr.get(), soft));
        for (const auto& c : n.conds) PW_RETURN_IF_ERROR(CheckUnknownNames(c.get(), false));
        for (const auto& c : n.children) PW_RETURN_IF_ERROR(CheckUnknownNames(*c, false));
        return Status::Ok();
      case Node::Kind::kMacro:
      case Node::Kind::kSetBlock:
      case Node::Kind::kFilterBlock:
      case Node::Kind::kCallBlock:
        soft = false;
        break;
      default:
        break;
    }
    PW_RETURN_IF_ERROR(CheckUnknownNames(n.expr.get(), soft));
    for (const auto& c : n.conds) PW_RETURN_IF_ERROR(CheckUnknownNames(c.get(), soft));
    for (const auto& c : n.children) PW_RETURN_IF_ERROR(CheckUnknownNames(*c, soft));
    return Status::Ok();
  }
  Status CheckUnknownNames(const Expr* e, bool soft) const {
    if (e == nullptr) return Status::Ok();
    if (e->unknown && !soft) {
      return Err(e->pos, std::string("no ") + (e->op == Expr::Op::kTest ? "test" : "filter") + " named '" + e->name +
                             "' (Jinja defines none)",
                 true);
    }
    soft = soft || e->op == Expr::Op::kIfElse;
    for (const auto& a : e->args) PW_RETURN_IF_ERROR(CheckUnknownNames(a.get(), soft));
    return Status::Ok();
  }

 private:
  Status Err(size_t pos, const std::string& what, bool unsupported) const {
    const std::string msg = Where(src_, pos) + what;
    return unsupported ? Unsupported(msg) : InvalidArgument(msg);
  }

  // Parses a filter chain `name(args) | name2 ...` (a {% filter %} tag's) onto a placeholder.
  Result<std::unique_ptr<Expr>> ParseFilterChain(ExprParser* ep) {
    auto e = ExprParser::Make(Expr::Op::kLiteral, ep->Peek().pos);
    while (true) {
      const size_t pos = ep->Peek().pos;
      auto f = ExprParser::Make(Expr::Op::kFilter, pos);
      PW_ASSIGN_OR_RETURN(f->name, ep->ExpectName());
      if (!Filters().count(f->name)) return Err(pos, "unsupported filter '" + f->name + "'", true);
      f->args.push_back(std::move(e));
      if (ep->IsOp("(")) PW_RETURN_IF_ERROR(ep->ParseCallArgs(f.get()));
      e = std::move(f);
      if (!ep->IsOp("|")) break;
      ep->Next();
    }
    PW_RETURN_IF_ERROR(ep->ExpectEnd());
    return e;
  }

  // Parses statements until one of `ends` (a block tag keyword); the keyword found is stored in
  // *end and its tag is left for the caller in parser_ (current_).
  Result<std::unique_ptr<Node>> ParseBlock(const std::set<std::string>& ends, std::string* end) {
    if (++depth_ > kMaxBlockDepth) {
      return Err(i_ < pieces_.size() ? pieces_[i_].pos : 0, "blocks nested too deeply", false);
    }
    struct Leave {
      int* d;
      ~Leave() { --*d; }
    } leave{&depth_};
    auto block = std::make_unique<Node>();
    block->kind = Node::Kind::kBlock;
    while (i_ < pieces_.size()) {
      const Piece& p = pieces_[i_];
      if (p.kind == Piece::Kind::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->text = p.body;
        n->pos = p.pos;
        block->children.push_back(std::move(n));
        ++i_;
        continue;
      }
      auto ep = std::make_unique<ExprParser>(src_, p, &called_);
      PW_RETURN_IF_ERROR(ep->Tokenize());
      if (p.kind == Piece::Kind::kVar) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->pos = p.pos;
        PW_ASSIGN_OR_RETURN(n->expr, ep->ParseExpr());
        PW_RETURN_IF_ERROR(ep->ExpectEnd());
        block->children.push_back(std::move(n));
        ++i_;
        continue;
      }
      // Block tag.
      if (ep->Peek().kind != Tok::Kind::kName) return Err(p.pos, "expected a statement", false);
      const std::string kw = ep->Peek().text;
      const size_t kw_pos = ep->Peek().pos;
      if (ends.count(kw)) {
        *end = kw;
        current_ = std::move(ep);
        return block;
      }
      ep->Next();
      ++i_;
      if (kw == "for") {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kFor;
        n->pos = kw_pos;
        while (true) {
          PW_ASSIGN_OR_RETURN(std::string var, ep->ExpectName());
          n->vars.push_back(var);
          if (!ep->IsOp(",")) break;
          ep->Next();
        }
        if (!ep->IsName("in")) return Err(ep->Peek().pos, "expected 'in'", false);
        ep->Next();
        PW_ASSIGN_OR_RETURN(n->expr, ep->ParseOr());
        if (ep->IsName("if")) {
          ep->Next();
          PW_ASSIGN_OR_RETURN(auto filter, ep->ParseOr());
          n->conds.push_back(std::move(filter));
        }
        if (ep->IsName("recursive")) return Err(ep->Peek().pos, "recursive loops", true);
        PW_RETURN_IF_ERROR(ep->ExpectEnd());
        std::string got;
        ++loops_;
        auto body = ParseBlock({"endfor", "else"}, &got);
        --loops_;
        if (!body.ok()) return body.status();
        if (got.empty()) return Err(kw_pos, "'for' without 'endfor'", false);
        n->children.push_back(std::move(*body));
        if (got == "else") {  // runs when the loop ran no iteration; break/continue are outside
          PW_RETURN_IF_ERROR(FinishEndTag());
          PW_ASSIGN_OR_RETURN(auto else_body, ParseBlock({"endfor", "else"}, &got));
          if (got != "endfor") {
            return Err(got.empty() ? kw_pos : current_->Peek().pos,
                       got.empty() ? "'for' without 'endfor'" : "'else' after 'else'", false);
          }
          n->children.push_back(std::move(else_body));
        }
        PW_RETURN_IF_ERROR(FinishEndTag());
        block->children.push_back(std::move(n));
      } else if (kw == "if") {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kIf;
        n->pos = kw_pos;
        PW_ASSIGN_OR_RETURN(auto cond, ep->ParseExpr());
        PW_RETURN_IF_ERROR(ep->ExpectEnd());
        n->conds.push_back(std::move(cond));
        while (true) {
          std::string got;
          PW_ASSIGN_OR_RETURN(auto body, ParseBlock({"elif", "else", "endif"}, &got));
          if (got.empty()) return Err(kw_pos, "'if' without 'endif'", false);
          n->children.push_back(std::move(body));
          auto tag = std::move(current_);
          tag->Next();
          ++i_;
          if (got == "elif") {
            PW_ASSIGN_OR_RETURN(auto c, tag->ParseExpr());
            PW_RETURN_IF_ERROR(tag->ExpectEnd());
            n->conds.push_back(std::move(c));
          } else if (got == "else") {
            PW_RETURN_IF_ERROR(tag->ExpectEnd());
            std::string got2;
            PW_ASSIGN_OR_RETURN(auto else_body, ParseBlock({"endif", "elif", "else"}, &got2));
            if (got2 != "endif") {
              return Err(got2.empty() ? kw_pos : current_->Peek().pos,
                         got2.empty() ? "'if' without 'endif'" : "'" + got2 + "' after 'else'",
                         false);
            }
            n->children.push_back(std::move(else_body));
            PW_RETURN_IF_ERROR(FinishEndTag());
            break;
          } else {
            PW_RETURN_IF_ERROR(tag->ExpectEnd());
            break;
          }
        }
        block->children.push_back(std::move(n));
      } else if (kw == "set") {
        auto n = std::make_unique<Node>();
        n->pos = kw_pos;
        PW_ASSIGN_OR_RETURN(std::string var, ep->ExpectName());
        n->vars.push_back(var);
        if (ep->IsOp(".")) {  // namespace attribute
          ep->Next();
          PW_ASSIGN_OR_RETURN(std::string attr, ep->ExpectName());
          n->vars.push_back(attr);
          n->kind = Node::Kind::kSetAttr;
          PW_RETURN_IF_ERROR(ep->Expect("="));
          PW_ASSIGN_OR_RETURN(n->expr, ep->ParseExpr());
          PW_RETURN_IF_ERROR(ep->ExpectEnd());
        } else if (ep->AtEnd()) {  // {% set name %}...{% endset %}
          n->kind = Node::Kind::kSetBlock;
          std::string got;
          PW_ASSIGN_OR_RETURN(auto body, ParseBlock({"endset"}, &got));
          if (got.empty()) return Err(kw_pos, "'set' without 'endset'", false);
          PW_RETURN_IF_ERROR(FinishEndTag());
          n->children.push_back(std::move(body));
        } else {
          if (ep->IsOp(",")) return Err(ep->Peek().pos, "assignment to several names", true);
          if (!ep->IsOp("=")) return Err(ep->Peek().pos, "filtered block 'set'", true);
          ep->Next();
          n->kind = Node::Kind::kSet;
          PW_ASSIGN_OR_RETURN(n->expr, ep->ParseExpr());
          PW_RETURN_IF_ERROR(ep->ExpectEnd());
        }
        block->children.push_back(std::move(n));
      } else if (kw == "macro") {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kMacro;
        n->pos = kw_pos;
        PW_ASSIGN_OR_RETURN(std::string name, ep->ExpectName());
        n->vars.push_back(name);
        PW_RETURN_IF_ERROR(ep->Expect("("));
        while (!ep->IsOp(")")) {
          PW_ASSIGN_OR_RETURN(std::string param, ep->ExpectName());
          std::unique_ptr<Expr> dflt;
          if (ep->IsOp("=")) {
            ep->Next();
            PW_ASSIGN_OR_RETURN(dflt, ep->ParseExpr());
          } else if (!n->conds.empty() && n->conds.back()) {
            return Err(ep->Peek().pos, "parameter without a default after one with a default",
                       false);
          }
          n->vars.push_back(param);
          n->conds.push_back(std::move(dflt));
          if (!ep->IsOp(",")) break;
          ep->Next();
        }
        PW_RETURN_IF_ERROR(ep->Expect(")"));
        PW_RETURN_IF_ERROR(ep->ExpectEnd());
        std::string got;
        const int loops = loops_;
        loops_ = 0;  // break/continue do not cross a macro
        auto body = ParseBlock({"endmacro"}, &got);
        loops_ = loops;
        if (!body.ok()) return body.status();
        if (got.empty()) return Err(kw_pos, "'macro' without 'endmacro'", false);
        PW_RETURN_IF_ERROR(FinishEndTag());
        n->children.push_back(std::move(*body));
        macros_.insert(name);
        block->children.push_back(std::move(n));
      } else if (kw == "call") {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kCallBlock;
        n->pos = kw_pos;
        if (ep->IsOp("(")) {  // the caller's parameters
          ep->Next();
          while (!ep->IsOp(")")) {
            PW_ASSIGN_OR_RETURN(std::string param, ep->ExpectName());
            if (ep->IsOp("=")) return Err(ep->Peek().pos, "a default for a caller parameter", true);
            n->vars.push_back(param);
            if (!ep->IsOp(",")) break;
            ep->Next();
          }
          PW_RETURN_IF_ERROR(ep->Expect(")"));
        }
        const size_t call_pos = ep->Peek().pos;
        PW_ASSIGN_OR_RETURN(n->expr, ep->ParseExpr());
        PW_RETURN_IF_ERROR(ep->ExpectEnd());
        if (n->expr->op != Expr::Op::kCall || n->expr->args[0]->op != Expr::Op::kName) {
          return Err(call_pos, "'call' needs a macro call", true);
        }
        std::string got;
        const int loops = loops_;
        loops_ = 0;  // break/continue do not cross a call block
        auto body = ParseBlock({"endcall"}, &got);
        loops_ = loops;
        if (!body.ok()) return body.status();
        if (got.empty()) return Err(kw_pos, "'call' without 'endcall'", false);
        PW_RETURN_IF_ERROR(FinishEndTag());
        n->children.push_back(std::move(*body));
        block->children.push_back(std::move(n));
      } else if (kw == "filter") {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kFilterBlock;
        n->pos = kw_pos;
        PW_ASSIGN_OR_RETURN(n->expr, ParseFilterChain(ep.get()));
        std::string got;
        PW_ASSIGN_OR_RETURN(auto body, ParseBlock({"endfilter"}, &got));
        if (got.empty()) return Err(kw_pos, "'filter' without 'endfilter'", false);
        PW_RETURN_IF_ERROR(FinishEndTag());
        n->children.push_back(std::move(body));
        block->children.push_back(std::move(n));
      } else if (kw == "generation") {
        // HF's marker of the assistant's tokens (return_assistant_tokens_mask); renders its body.
        PW_RETURN_IF_ERROR(ep->ExpectEnd());
        std::string got;
        PW_ASSIGN_OR_RETURN(auto body, ParseBlock({"endgeneration"}, &got));
        if (got.empty()) return Err(kw_pos, "'generation' without 'endgeneration'", false);
        PW_RETURN_IF_ERROR(FinishEndTag());
        block->children.push_back(std::move(body));
      } else if (kw == "break" || kw == "continue") {
        PW_RETURN_IF_ERROR(ep->ExpectEnd());
        if (loops_ == 0) return Err(kw_pos, "'" + kw + "' outside a loop", false);
        auto n = std::make_unique<Node>();
        n->kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
        n->pos = kw_pos;
        block->children.push_back(std::move(n));
      } else if (kw == "endfor" || kw == "endif" || kw == "elif" || kw == "else" ||
                 kw == "endset" || kw == "endmacro" || kw == "endfilter" ||
                 kw == "endgeneration" || kw == "endcall") {
        return Err(kw_pos, "unexpected '" + kw + "'", false);
      } else {
        return Err(kw_pos, "unsupported statement '" + kw + "'", true);
      }
    }
    end->clear();
    return block;
  }

  // Consumes the end tag left in current_ (e.g. endfor), which must have nothing after it.
  Status FinishEndTag() {
    auto tag = std::move(current_);
    tag->Next();
    ++i_;
    return tag->ExpectEnd();
  }

  std::string_view src_;
  std::vector<Piece> pieces_;
  size_t i_ = 0;
  static constexpr int kMaxBlockDepth = 100;
  int depth_ = 0;
  int loops_ = 0;  // enclosing for loops (in the current macro)
  std::unique_ptr<ExprParser> current_;
  std::vector<std::pair<std::string, size_t>> called_;
  std::set<std::string> macros_;
};

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------
constexpr size_t kMaxOutput = size_t{64} << 20;

// Positional and keyword arguments of a call, evaluated.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* Kw(std::string_view name) const {
    for (const auto& [k, v] : kw) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

class Renderer {
 public:
  Renderer(std::string_view src, std::map<std::string, Value> globals, int64_t now_unix)
      : src_(src), now_unix_(now_unix) {
    scopes_.push_back(std::move(globals));
  }

  Status Render(const Node& n, std::string* out) {
    switch (n.kind) {
      case Node::Kind::kBlock:
        for (const auto& c : n.children) {
          PW_RETURN_IF_ERROR(Render(*c, out));
          if (loop_ctl_ != LoopCtl::kNone) break;  // break/continue: skip the rest of the body
        }
        return Status::Ok();
      case Node::Kind::kText:
        return Append(n.text, n.pos, out);
      case Node::Kind::kOutput: {
        PW_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        return Append(ToString(v), n.pos, out);
      }
      case Node::Kind::kSet: {
        PW_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        scopes_.back()[n.vars[0]] = std::move(v);
        return Status::Ok();
      }
      case Node::Kind::kSetAttr: {
        const Value target = Lookup(n.vars[0]);
        if (target.kind != Value::Kind::kNamespace) {
          return Err(n.pos, "cannot assign attribute '" + n.vars[1] + "' on '" + n.vars[0] +
                                "', which is not a namespace");
        }
        PW_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        for (auto& [k, val] : *target.ns) {
          if (k == n.vars[1]) {
            val = std::move(v);
            return Status::Ok();
          }
        }
        target.ns->emplace_back(n.vars[1], std::move(v));
        return Status::Ok();
      }
      case Node::Kind::kSetBlock: {
        std::string body;
        PW_RETURN_IF_ERROR(Render(*n.children[0], &body));
        scopes_.back()[n.vars[0]] = Value::Str(std::move(body));
        return Status::Ok();
      }
      case Node::Kind::kMacro: {
        Value m = Value::Make(Value::Kind::kCallable);
        m.s = n.vars[0];
        m.macro = &n;
        scopes_.back()[n.vars[0]] = std::move(m);
        return Status::Ok();
      }
      case Node::Kind::kCallBlock: {
        // The macro runs with `caller` defined: caller(...) renders the body where the call
        // block stands (its variables, not the macro's), in a frame of its own.
        const Expr& call = *n.expr;
        const Value f = Lookup(call.args[0]->name);
        if (!f.macro) return Err(call.pos, "'" + call.args[0]->name + "' is not a macro");
        PW_ASSIGN_OR_RETURN(Args args, EvalArgs(call, 1));
        callers_.push_back({&n, scopes_.size(), frame_base_});
        auto v = CallMacro(*f.macro, args, call.pos, /*with_caller=*/true);
        callers_.pop_back();
        PW_RETURN_IF_ERROR(v.status());
        return Append(ToString(*v), n.pos, out);
      }
      case Node::Kind::kFilterBlock: {
        std::string body;
        PW_RETURN_IF_ERROR(Render(*n.children[0], &body));
        PW_ASSIGN_OR_RETURN(Value v, ApplyFilterChain(*n.expr, Value::Str(std::move(body))));
        return Append(ToString(v), n.pos, out);
      }
      case Node::Kind::kBreak:
        loop_ctl_ = LoopCtl::kBreak;
        return Status::Ok();
      case Node::Kind::kContinue:
        loop_ctl_ = LoopCtl::kContinue;
        return Status::Ok();
      case Node::Kind::kIf:
        for (size_t k = 0; k < n.conds.size(); ++k) {
          PW_ASSIGN_OR_RETURN(Value c, Eval(*n.conds[k]));
          if (Truthy(c)) return Render(*n.children[k], out);
        }
        if (n.children.size() > n.conds.size()) return Render(*n.children.back(), out);
        return Status::Ok();
      case Node::Kind::kFor:
        return RenderFor(n, out);
    }
    return Status::Ok();
  }

 private:
  enum class LoopCtl { kNone, kBreak, kContinue };

  Status Err(size_t pos, const std::string& what) const {
    return InvalidArgument(Where(src_, pos) + what);
  }

  Status Append(const std::string& s, size_t pos, std::string* out) {
    if (out->size() + s.size() > kMaxOutput) {
      return ResourceExhausted(Where(src_, pos) + "output over " + std::to_string(kMaxOutput) +
                               " bytes");
    }
    out->append(s);
    return Status::Ok();
  }

  // The items a for loop (or a filter) iterates over: a list's items, a dict's keys, a string's
  // characters (code points).
  Result<List> Iterate(const Value& seq, size_t pos) const {
    List items;
    switch (seq.kind) {
      case Value::Kind::kList:
        return *seq.list;
      case Value::Kind::kDict:
        for (const auto& kv : *seq.dict) items.push_back(KeyValue(kv.first));
        return items;
      case Value::Kind::kString: {
        const auto off = CodePointOffsets(seq.s);
        for (size_t k = 0; k + 1 < off.size(); ++k) {
          items.push_back(Value::Str(seq.s.substr(off[k], off[k + 1] - off[k])));
        }
        return items;
      }
      case Value::Kind::kUndefined:
        return items;  // Jinja iterates an undefined value as empty
      default:
        return Err(pos, std::string("'") + (seq.kind == Value::Kind::kNone ? "NoneType" : KindName(seq.kind)) +
                            "' object is not iterable");
    }
  }

  Status BindLoopVars(const Node& n, const Value& item, std::map<std::string, Value>* scope) {
    if (n.vars.size() == 1) {
      (*scope)[n.vars[0]] = item;
      return Status::Ok();
    }
    if (item.kind != Value::Kind::kList || item.list->size() != n.vars.size()) {
      return Err(n.pos, "cannot unpack loop item into " + std::to_string(n.vars.size()) + " names");
    }
    for (size_t v = 0; v < n.vars.size(); ++v) (*scope)[n.vars[v]] = (*item.list)[v];
    return Status::Ok();
  }

  Status RenderFor(const Node& n, std::string* out) {
    PW_ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
    PW_ASSIGN_OR_RETURN(List all, Iterate(seq, n.pos));
    List items;
    if (!n.conds.empty()) {  // `for x in y if cond`: the loop sees only the items that pass
      for (const Value& item : all) {
        std::map<std::string, Value> scope;
        PW_RETURN_IF_ERROR(BindLoopVars(n, item, &scope));
        scopes_.push_back(std::move(scope));
        auto keep = Eval(*n.conds[0]);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (Truthy(*keep)) items.push_back(item);
      }
    } else {
      items = std::move(all);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      std::map<std::string, Value> scope;
      PW_RETURN_IF_ERROR(BindLoopVars(n, items[k], &scope));
      Dict loop = {{"index", Value::Int(k + 1)},
                   {"index0", Value::Int(k)},
                   {"revindex", Value::Int(len - k)},
                   {"revindex0", Value::Int(len - k - 1)},
                   {"first", Value::Bool(k == 0)},
                   {"last", Value::Bool(k == len - 1)},
                   {"length", Value::Int(len)},
                   {"depth", Value::Int(1)},
                   {"depth0", Value::Int(0)}};
      if (k > 0) loop.emplace_back("previtem", items[k - 1]);
      if (k + 1 < len) loop.emplace_back("nextitem", items[k + 1]);
      Value cycle = Value::Builtin("cycle");
      cycle.i = k;
      loop.emplace_back("cycle", std::move(cycle));
      scope["loop"] = Value::MakeDict(std::move(loop));
      scopes_.push_back(std::move(scope));
      Status st = Render(*n.children[0], out);
      scopes_.pop_back();
      PW_RETURN_IF_ERROR(st);
      const LoopCtl ctl = loop_ctl_;
      loop_ctl_ = LoopCtl::kNone;
      if (ctl == LoopCtl::kBreak) break;
    }
    if (len == 0 && n.children.size() > 1) return Render(*n.children[1], out);
    return Status::Ok();
  }

  // Names resolve in the innermost scopes of the current frame (a macro call starts a frame),
  // then in the template's top level.
  Value Lookup(const std::string& name) const {
    for (size_t k = scopes_.size(); k-- > frame_base_;) {
      auto f = scopes_[k].find(name);
      if (f != scopes_[k].end()) return f->second;
    }
    if (frame_base_ > 0) {
      auto f = scopes_[0].find(name);
      if (f != scopes_[0].end()) return f->second;
    }
    return Value();
  }

  Result<Value> Eval(const Expr& e) {
    switch (e.op) {
      case Expr::Op::kLiteral:
        return e.literal;
      case Expr::Op::kName:
        return Lookup(e.name);
      case Expr::Op::kAttr: {
        PW_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        return GetItem(obj, Value::Str(e.name), e.pos);
      }
      case Expr::Op::kItem: {
        PW_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        PW_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(obj, key, e.pos);
      }
      case Expr::Op::kSlice:
        return EvalSlice(e);
      case Expr::Op::kCall:
        return EvalCall(e);
      case Expr::Op::kFilter: {
        PW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        PW_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        if (e.unknown) return Err(e.pos, "No filter named '" + e.name + "' found.");
        return ApplyFilter(e.name, v, args, e.pos);
      }
      case Expr::Op::kTest: {
        PW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        PW_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        if (e.unknown) return Err(e.pos, "No test named '" + e.name + "' found.");
        PW_ASSIGN_OR_RETURN(bool r, RunTest(e.name, v, args.pos, e.pos));
        return Value::Bool(r != e.negate);
      }
      case Expr::Op::kNot: {
        PW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value::Bool(!Truthy(v));
      }
      case Expr::Op::kNeg: {
        PW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (v.kind == Value::Kind::kInt) return Value::Int(-v.i);
        if (v.kind == Value::Kind::kFloat) return Value::Float(-v.f);
        return Err(e.pos, std::string("bad operand type for unary -: '") + KindName(v.kind) + "'");
      }
      case Expr::Op::kAnd: {
        PW_ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
        if (!Truthy(l)) return l;
        return Eval(*e.args[1]);
      }
      case Expr::Op::kOr: {
        PW_ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
        if (Truthy(l)) return l;
        return Eval(*e.args[1]);
      }
      case Expr::Op::kIfElse: {
        PW_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (Truthy(c)) return Eval(*e.args[0]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Value();
      }
      case Expr::Op::kList: {
        List items;
        for (const auto& a : e.args) {
          PW_ASSIGN_OR_RETURN(Value v, Eval(*a));
          items.push_back(std::move(v));
        }
        return Value::MakeList(std::move(items));
      }
      case Expr::Op::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          PW_ASSIGN_OR_RETURN(Value key, Eval(*e.args[k]));
          PW_ASSIGN_OR_RETURN(Value val, Eval(*e.args[k + 1]));
          std::string hashed;
          if (!KeyOf(key, &hashed)) {
            return Err(e.pos, std::string("unhashable type: '") + KindName(key.kind) + "'");
          }
          SetKey(&d, hashed, std::move(val));
        }
        return Value::MakeDict(std::move(d));
      }
      case Expr::Op::kBinary:
        return EvalBinary(e);
    }
    return Err(e.pos, "internal: unknown expression");
  }

  // markupsafe.escape().
  static std::string EscapeHtml(const std::string& s) {
    std::string out;
    for (char c : s) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out += c;
      }
    }
    return out;
  }

  static Value Lazy(List items) {
    Value v = Value::MakeList(std::move(items));
    v.lazy = true;
    return v;
  }

  static void SetKey(Dict* d, const std::string& key, Value v) {
    for (auto& [k, val] : *d) {
      if (k == key) {
        val = std::move(v);
        return;
      }
    }
    d->emplace_back(key, std::move(v));
  }

  Result<Value> GetItem(const Value& obj, const Value& key, size_t pos) {
    std::string k;
    if ((obj.kind == Value::Kind::kDict || obj.kind == Value::Kind::kNamespace) &&
        KeyOf(key, &k)) {
      const Value* v = obj.Find(k);
      return v ? *v : Value();
    }
    if (obj.kind == Value::Kind::kList && obj.lazy) {
      return Err(pos, "'generator' object is not subscriptable");
    }
    if (obj.kind == Value::Kind::kList && key.kind == Value::Kind::kInt) {
      const int64_t n = obj.list->size();
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value();
      return (*obj.list)[k];
    }
    if (obj.kind == Value::Kind::kString && key.kind == Value::Kind::kInt) {
      const auto off = CodePointOffsets(obj.s);
      const int64_t n = off.size() - 1;
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value();
      return Value::Str(obj.s.substr(off[k], off[k + 1] - off[k]));
    }
    if (obj.kind == Value::Kind::kUndefined) {
      return Err(pos, "'" + ToString(key) + "' of an undefined value");
    }
    return Value();  // Jinja: a missing attribute is undefined
  }

  Result<Value> EvalSlice(const Expr& e) {
    PW_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    int64_t bounds[3];
    bool given[3];
    for (int k = 0; k < 3; ++k) {
      given[k] = e.args[k + 1] != nullptr;
      bounds[k] = 0;
      if (given[k]) {
        PW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k + 1]));
        if (v.kind == Value::Kind::kNone) {
          given[k] = false;
        } else if (v.kind != Value::Kind::kInt) {
          return Err(e.pos, "slice indices must be integers");
        } else {
          bounds[k] = v.i;
        }
      }
    }
    if (obj.kind != Value::Kind::kList && obj.kind != Value::Kind::kString) {
      return Err(e.pos, std::string("cannot slice '") + KindName(obj.kind) + "'");
    }
    std::vector<size_t> off;
    if (obj.kind == Value::Kind::kString) off = CodePointOffsets(obj.s);
    const int64_t n = obj.kind == Value::Kind::kList ? obj.list->size() : off.size() - 1;
    const int64_t step = given[2] ? bounds[2] : 1;
    if (step == 0) return Err(e.pos, "slice step cannot be zero");
    // Python's slice.indices().
    auto clamp = [&](int64_t v, bool g, int64_t dflt) {
      if (!g) return dflt;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(bounds[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(bounds[1], given[1], step > 0 ? n : -1);
    List items;
    std::string s;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (obj.kind == Value::Kind::kList) {
        items.push_back((*obj.list)[k]);
      } else {
        s.append(obj.s, off[k], off[k + 1] - off[k]);
      }
    }
    if (obj.kind == Value::Kind::kList) return Value::MakeList(std::move(items));
    return Value::Str(std::move(s));
  }

  static std::string Strip(const std::string& s, const std::string* chars, bool left, bool right) {
    auto strip_this = [&](char c) {
      return chars ? chars->find(c) != std::string::npos : IsSpace(c);
    };
    size_t b = 0, en = s.size();
    if (left) {
      while (b < en && strip_this(s[b])) ++b;
    }
    if (right) {
      while (en > b && strip_this(s[en - 1])) --en;
    }
    return s.substr(b, en - b);
  }
  // Python's str methods (jinja2 runs on Python strings): common/text/unicode_case.h.
  static std::string Upper(const std::string& s) { return unicode::PyUpper(s); }
  static std::string Lower(const std::string& s) { return unicode::PyLower(s); }
  static std::string Capitalize(const std::string& s) { return unicode::PyCapitalize(s); }
  static std::string Title(const std::string& s) { return unicode::PyTitle(s); }
  // jinja2's `title` filter, which is not str.title(): the text is split at runs of '-', '(',
  // '{', '[', '<' and whitespace (str.isspace()), and each piece becomes
  // piece[0].upper() + piece[1:].lower().
  static std::string TitleFilter(const std::string& s) {
    const auto off = CodePointOffsets(s);
    auto separator = [&](size_t k) {
      const std::string_view c(s.data() + off[k], off[k + 1] - off[k]);
      if (c.size() == 1 && std::string_view("-({[<").find(c[0]) != std::string_view::npos) {
        return true;
      }
      // The code point (CodePointOffsets cuts before each lead byte).
      const unsigned char lead = static_cast<unsigned char>(c[0]);
      char32_t cp = c.size() == 1 ? lead : lead & (0x7F >> c.size());
      for (size_t i = 1; i < c.size(); ++i) cp = (cp << 6) | (static_cast<unsigned char>(c[i]) & 0x3F);
      return unicode::IsWhiteSpace(cp) || (cp >= 0x1C && cp <= 0x1F);  // str.isspace()
    };
    std::string out;
    for (size_t k = 0; k + 1 < off.size();) {
      size_t e = k + 1;
      const bool sep = separator(k);
      while (e + 1 < off.size() && separator(e) == sep) ++e;
      if (sep) {
        out.append(s, off[k], off[e] - off[k]);
      } else {
        out += unicode::PyUpper(std::string_view(s).substr(off[k], off[k + 1] - off[k]));
        out += unicode::PyLower(std::string_view(s).substr(off[k + 1], off[e] - off[k + 1]));
      }
      k = e;
    }
    return out;
  }
  static std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                             int64_t count) {
    std::string out;
    if (from.empty()) {  // Python inserts `to` around every code point
      const auto off = CodePointOffsets(s);
      int64_t done = 0;
      for (size_t k = 0; k + 1 < off.size(); ++k) {
        if (count < 0 || done < count) {
          out += to;
          ++done;
        }
        out.append(s, off[k], off[k + 1] - off[k]);
      }
      if (count < 0 || done < count) out += to;
      return out;
    }
    size_t p = 0, f;
    int64_t done = 0;
    while ((count < 0 || done < count) && (f = s.find(from, p)) != std::string::npos) {
      out.append(s, p, f - p);
      out += to;
      p = f + from.size();
      ++done;
    }
    out.append(s, p);
    return out;
  }

  Result<Args> EvalArgs(const Expr& e, size_t first) {
    Args out;
    for (size_t k = first; k < e.args.size(); ++k) {
      PW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k]));
      if (k < e.kw.size() && !e.kw[k].empty()) {
        out.kw.emplace_back(e.kw[k], std::move(v));
      } else {
        out.pos.push_back(std::move(v));
      }
    }
    return out;
  }

  Result<Value> EvalCall(const Expr& e) {
    const Expr& callee = *e.args[0];
    PW_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
    if (callee.op == Expr::Op::kName) {
      const Value f = Lookup(callee.name);
      if (f.kind != Value::Kind::kCallable) {
        return Err(callee.pos, "'" + callee.name + "' is " +
                                   (f.kind == Value::Kind::kUndefined ? "undefined"
                                                                      : "not callable"));
      }
      return CallValue(f, args, e.pos);
    }
    // callee is x.name: a callable stored there (loop.cycle), else a method of x.
    PW_ASSIGN_OR_RETURN(Value self, Eval(*callee.args[0]));
    if (const Value* f = self.Find(callee.name); f && f->kind == Value::Kind::kCallable) {
      return CallValue(*f, args, e.pos);
    }
    return CallMethod(self, callee.name, args, e.pos);
  }

  Status NeedArgs(const Args& a, size_t lo, size_t hi, const std::string& what, size_t pos) const {
    if (a.pos.size() < lo || a.pos.size() > hi) {
      return Err(pos, "'" + what + "' takes " + std::to_string(lo) +
                          (hi != lo ? ".." + std::to_string(hi) : "") + " arguments, got " +
                          std::to_string(a.pos.size()));
    }
    return Status::Ok();
  }

  Result<Value> CallValue(const Value& f, const Args& args, size_t pos) {
    if (f.macro) return CallMacro(*f.macro, args, pos);
    const std::string& name = f.s;
    if (name != "namespace" && name != "dict" && !args.kw.empty()) {
      return Err(pos, "'" + name + "' takes no keyword argument '" + args.kw[0].first + "'");
    }
    if (name == "raise_exception") {
      PW_RETURN_IF_ERROR(NeedArgs(args, 1, 1, name, pos));
      return InvalidArgument("chat template raised: " + ToString(args.pos[0]));
    }
    if (name == "caller") return RenderCaller(args, pos);
    if (name == "cycle") {
      if (args.pos.empty()) return Err(pos, "no items for cycling given");
      return args.pos[static_cast<size_t>(f.i) % args.pos.size()];
    }
    if (name == "namespace" || name == "dict") {
      // namespace({...}) / namespace(key=value, ...), as Jinja's Namespace(*args, **kwargs).
      PW_RETURN_IF_ERROR(NeedArgs(args, 0, 1, name, pos));
      Dict d;
      if (!args.pos.empty()) {
        if (args.pos[0].kind != Value::Kind::kDict) {
          return Err(pos, "'" + name + "' takes a dict as its positional argument");
        }
        d = *args.pos[0].dict;
      }
      for (const auto& [k, v] : args.kw) SetKey(&d, k, v);
      if (name == "dict") return Value::MakeDict(std::move(d));
      Value ns = Value::Make(Value::Kind::kNamespace);
      ns.ns = std::make_shared<Dict>(std::move(d));
      return ns;
    }
    if (name == "strftime_now") {
      PW_RETURN_IF_ERROR(NeedArgs(args, 1, 1, name, pos));
      if (args.pos[0].kind != Value::Kind::kString) {
        return Err(pos, "strftime_now() takes a format string");
      }
      // HF formats datetime.now(): local time (TZ), naive, so %Z and %z give "".
      const std::time_t t = static_cast<std::time_t>(now_unix_);
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[512];
      std::string fmt;
      const std::string& given = args.pos[0].s;
      for (size_t i = 0; i < given.size(); ++i) {
        if (given[i] == '%' && i + 1 < given.size()) {
          const char d = given[++i];
          if (d != 'Z' && d != 'z') fmt += {'%', d};
        } else {
          fmt += given[i];
        }
      }
      const size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
      if (n == 0 && !fmt.empty()) return Err(pos, "strftime_now() format gives nothing or too much");
      return Value::Str(std::string(buf, n));
    }
    if (name == "range") {
      PW_RETURN_IF_ERROR(NeedArgs(args, 1, 3, name, pos));
      for (const Value& a : args.pos) {
        if (a.kind != Value::Kind::kInt) return Err(pos, "range() takes integers");
      }
      int64_t start = 0, stop, step = 1;
      if (args.pos.size() == 1) {
        stop = args.pos[0].i;
      } else {
        start = args.pos[0].i;
        stop = args.pos[1].i;
        if (args.pos.size() == 3) step = args.pos[2].i;
      }
      if (step == 0) return Err(pos, "range() step must not be zero");
      List items;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (items.size() >= 1000000) return Err(pos, "range() longer than 10^6");
        items.push_back(Value::Int(k));
      }
      return Value::MakeList(std::move(items));
    }
    return Err(pos, "internal: function '" + name + "'");
  }

  // A macro call renders the body in a new frame that sees the template's top level and the
  // arguments; what it sets stays inside (a namespace it changes is shared, as in Jinja).
  Result<Value> CallMacro(const Node& m, const Args& args, size_t pos, bool with_caller = false) {
    const std::string& name = m.vars[0];
    const size_t nparams = m.vars.size() - 1;
    if (args.pos.size() > nparams) {
      return Err(pos, "macro '" + name + "' takes not more than " + std::to_string(nparams) +
                          " argument(s)");
    }
    std::map<std::string, Value> frame;
    if (with_caller) frame["caller"] = Value::Builtin("caller");
    for (size_t k = 0; k < args.pos.size(); ++k) frame[m.vars[k + 1]] = args.pos[k];
    for (const auto& [k, v] : args.kw) {
      bool known = false;
      for (size_t p = 1; p < m.vars.size(); ++p) known = known || m.vars[p] == k;
      if (!known) return Err(pos, "macro '" + name + "' takes no keyword argument '" + k + "'");
      if (frame.count(k)) return Err(pos, "macro '" + name + "' got multiple values for '" + k + "'");
      frame[k] = v;
    }
    if (macro_depth_ >= kMaxMacroDepth) {
      return Err(pos, "macro calls nested deeper than " + std::to_string(kMaxMacroDepth));
    }
    const size_t saved_base = frame_base_;
    ++macro_depth_;
    scopes_.push_back(std::move(frame));
    frame_base_ = scopes_.size() - 1;
    Status st;
    for (size_t p = 0; p < nparams && st.ok(); ++p) {  // defaults, evaluated at call time
      if (scopes_.back().count(m.vars[p + 1]) || !m.conds[p]) continue;
      auto v = Eval(*m.conds[p]);
      if (v.ok()) {
        scopes_.back()[m.vars[p + 1]] = std::move(*v);
      } else {
        st = v.status();
      }
    }
    std::string out;
    if (st.ok()) st = Render(*m.children[0], &out);
    scopes_.pop_back();
    frame_base_ = saved_base;
    --macro_depth_;
    PW_RETURN_IF_ERROR(st);
    return Value::Str(std::move(out));
  }

  // caller(...) inside a macro a call block runs: the block's body, rendered with the scopes
  // the block saw (those of the macro and anything above them set aside meanwhile) and its
  // parameters bound in a frame of its own.
  Result<Value> RenderCaller(const Args& args, size_t pos) {
    if (callers_.empty()) return Err(pos, "'caller' is undefined");
    const Caller c = callers_.back();
    const Node& block = *c.node;
    if (args.pos.size() > block.vars.size()) {
      return Err(pos, "caller takes not more than " + std::to_string(block.vars.size()) + " argument(s)");
    }
    std::map<std::string, Value> frame;
    for (const std::string& p : block.vars) frame[p] = Value();
    for (size_t k = 0; k < args.pos.size(); ++k) frame[block.vars[k]] = args.pos[k];
    for (const auto& [k, v] : args.kw) {
      if (!frame.count(k)) return Err(pos, "caller takes no keyword argument '" + k + "'");
      frame[k] = v;
    }
    if (macro_depth_ >= kMaxMacroDepth) {
      return Err(pos, "macro calls nested deeper than " + std::to_string(kMaxMacroDepth));
    }
    std::vector<std::map<std::string, Value>> aside(std::make_move_iterator(scopes_.begin() + c.scopes),
                                                    std::make_move_iterator(scopes_.end()));
    scopes_.resize(c.scopes);
    const size_t saved_base = frame_base_;
    frame_base_ = c.frame_base;
    callers_.pop_back();  // inside the body, caller is the enclosing block's
    ++macro_depth_;
    scopes_.push_back(std::move(frame));
    std::string out;
    const Status st = Render(*block.children[0], &out);
    scopes_.pop_back();
    --macro_depth_;
    callers_.push_back(c);
    frame_base_ = saved_base;
    for (auto& scope : aside) scopes_.push_back(std::move(scope));
    PW_RETURN_IF_ERROR(st);
    return Value::Str(std::move(out));
  }

  Result<Value> CallMethod(const Value& self, const std::string& m, const Args& args, size_t pos) {
    if ((self.kind == Value::Kind::kList && ListMutators().count(m)) ||
        (self.kind == Value::Kind::kDict && DictMutators().count(m))) {
      return Err(pos, "SecurityError: access to attribute '" + m + "' of '" +
                          (self.kind == Value::Kind::kList ? "list" : "dict") + "' object is unsafe.");
    }
    if (self.kind == Value::Kind::kString && m == "format") return FormatString(self.s, args, pos);
    if (!args.kw.empty()) {
      return Err(pos, "method '" + m + "' takes no keyword argument '" + args.kw[0].first + "'");
    }
    auto str_arg = [&](size_t k) -> Result<std::string> {
      if (args.pos[k].kind != Value::Kind::kString) {
        return Err(pos, "argument " + std::to_string(k + 1) + " of '" + m + "' must be a string");
      }
      return args.pos[k].s;
    };
    if (self.kind == Value::Kind::kString) {
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        PW_RETURN_IF_ERROR(NeedArgs(args, 0, 1, m, pos));
        std::string chars;
        const bool given = !args.pos.empty() && args.pos[0].kind != Value::Kind::kNone;
        if (given) {
          PW_ASSIGN_OR_RETURN(chars, str_arg(0));
        }
        return Value::Str(Strip(self.s, given ? &chars : nullptr, m != "rstrip", m != "lstrip"));
      }
      if (m == "upper" || m == "lower" || m == "title" || m == "capitalize") {
        PW_RETURN_IF_ERROR(NeedArgs(args, 0, 0, m, pos));
        return Value::Str(m == "upper"   ? Upper(self.s)
                          : m == "lower" ? Lower(self.s)
                          : m == "title" ? Title(self.s)
                                         : Capitalize(self.s));
      }
      if (m == "startswith" || m == "endswith") {
        PW_RETURN_IF_ERROR(NeedArgs(args, 1, 1, m, pos));
        std::vector<std::string> options;
        if (args.pos[0].kind == Value::Kind::kList) {  // a tuple of prefixes
          for (const Value& v : *args.pos[0].list) {
            if (v.kind != Value::Kind::kString) return Err(pos, m + "() takes strings");
            options.push_back(v.s);
          }
        } else {
          PW_ASSIGN_OR_RETURN(std::string a, str_arg(0));
          options.push_back(std::move(a));
        }
        bool r = false;
        for (const std::string& a : options) {
          r = r || (a.size() <= self.s.size() &&
                    (m == "startswith" ? self.s.compare(0, a.size(), a) == 0
                                       : self.s.compare(self.s.size() - a.size(), a.size(), a) == 0));
        }
        return Value::Bool(r);
      }
      if (m == "replace") {
        PW_RETURN_IF_ERROR(NeedArgs(args, 2, 3, m, pos));
        PW_ASSIGN_OR_RETURN(std::string from, str_arg(0));
        PW_ASSIGN_OR_RETURN(std::string to, str_arg(1));
        int64_t count = -1;
        if (args.pos.size() == 3) {
          if (args.pos[2].kind != Value::Kind::kInt) return Err(pos, "replace() count must be an int");
          count = args.pos[2].i;
        }
        std::string out = Replace(self.s, from, to, count);
        if (out.size() > kMaxOutput) return Err(pos, "replace() result too large");
        return Value::Str(std::move(out));
      }
      if (m == "split") {
        PW_RETURN_IF_ERROR(NeedArgs(args, 0, 1, m, pos));
        List parts;
        if (args.pos.empty() || args.pos[0].kind == Value::Kind::kNone) {
          // Runs of whitespace, no empty parts.
          size_t p = 0;
          while (p < self.s.size()) {
            while (p < self.s.size() && IsSpace(self.s[p])) ++p;
            size_t q = p;
            while (q < self.s.size() && !IsSpace(self.s[q])) ++q;
            if (q > p) parts.push_back(Value::Str(self.s.substr(p, q - p)));
            p = q;
          }
        } else {
          PW_ASSIGN_OR_RETURN(std::string sep, str_arg(0));
          if (sep.empty()) return Err(pos, "split() with an empty separator");
          size_t p = 0, f;
          while ((f = self.s.find(sep, p)) != std::string::npos) {
            parts.push_back(Value::Str(self.s.substr(p, f - p)));
            p = f + sep.size();
          }
          parts.push_back(Value::Str(self.s.substr(p)));
        }
        return Value::MakeList(std::move(parts));
      }
    } else if (self.kind == Value::Kind::kDict) {
      if (m == "get") {
        PW_RETURN_IF_ERROR(NeedArgs(args, 1, 2, m, pos));
        std::string k;
        const Value* v = KeyOf(args.pos[0], &k) ? self.Find(k) : nullptr;
        if (v) return *v;
        return args.pos.size() == 2 ? args.pos[1] : Value::None();
      }
      if (m == "keys" || m == "values" || m == "items") {
        PW_RETURN_IF_ERROR(NeedArgs(args, 0, 0, m, pos));
        List items;
        for (const auto& [k, v] : *self.dict) {
          if (m == "keys") {
            items.push_back(KeyValue(k));
          } else if (m == "values") {
            items.push_back(v);
          } else {
            items.push_back(Value::MakeList({KeyValue(k), v}));
          }
        }
        return Value::MakeList(std::move(items));
      }
    }
    if (self.kind == Value::Kind::kUndefined) return Err(pos, "'" + m + "' of an undefined value");
    return Err(pos, std::string("'") + KindName(self.kind) + "' object has no method '" + m + "'");
  }

  // Python's str.format for plain fields: {} (numbered automatically), {0}, {name}, and {{ }}.
  // A field with a conversion (!r), a format spec (:>8) or an attribute or index ({0.x}) is
  // refused by name rather than rendered differently.
  Result<Value> FormatString(const std::string& fmt, const Args& args, size_t pos) {
    std::string out;
    size_t next_auto = 0;
    bool automatic = false, manual = false;
    for (size_t i = 0; i < fmt.size(); ++i) {
      const char c = fmt[i];
      if (c == '}') {
        if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
          out += '}';
          ++i;
          continue;
        }
        return Err(pos, "format(): Single '}' encountered in format string");
      }
      if (c != '{') {
        out += c;
        continue;
      }
      if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
        out += '{';
        ++i;
        continue;
      }
      const size_t close = fmt.find('}', i);
      if (close == std::string::npos) return Err(pos, "format(): Single '{' encountered in format string");
      const std::string field = fmt.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[{") != std::string::npos) {
        return Err(pos, "format(): the field '{" + field + "}' (a conversion, format spec, attribute or index) is not supported");
      }
      const Value* v = nullptr;
      if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        size_t index;
        if (field.empty()) {
          if (manual) return Err(pos, "format(): cannot switch from manual field specification to automatic field numbering");
          automatic = true;
          index = next_auto++;
        } else {
          if (automatic) return Err(pos, "format(): cannot switch from automatic field numbering to manual field specification");
          manual = true;
          index = field.size() > 9 ? args.pos.size() : std::stoul(field);
        }
        if (index >= args.pos.size()) {
          return Err(pos, "format(): Replacement index " + std::to_string(index) + " out of range for positional args tuple");
        }
        v = &args.pos[index];
      } else {
        v = args.Kw(field);
        if (v == nullptr) return Err(pos, "format(): KeyError: '" + field + "'");
      }
      out += ToString(*v);
      if (out.size() > kMaxOutput) return Err(pos, "format() result too large");
      i = close;
    }
    return Value::Str(std::move(out));
  }

  // Applies the filter chain `e` (a {% filter %} tag's) to `v` in place of its placeholder.
  Result<Value> ApplyFilterChain(const Expr& e, Value v) {
    if (e.op != Expr::Op::kFilter) return v;
    PW_ASSIGN_OR_RETURN(Value inner, ApplyFilterChain(*e.args[0], std::move(v)));
    PW_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
    return ApplyFilter(e.name, inner, args, e.pos);
  }

  // x.a.b for selectattr / map(attribute=) / unique(attribute=) / join(attribute=).
  Result<Value> Attribute(const Value& item, const std::string& path, size_t pos) {
    Value v = item;
    size_t p = 0;
    while (true) {
      const size_t dot = path.find('.', p);
      const std::string part = path.substr(p, dot == std::string::npos ? std::string::npos : dot - p);
      Value key = Value::Str(part);
      if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
        key = Value::Int(std::stoll(part));
      }
      if (v.kind == Value::Kind::kUndefined) return Value();
      PW_ASSIGN_OR_RETURN(v, GetItem(v, key, pos));
      if (dot == std::string::npos) return v;
      p = dot + 1;
    }
  }

  Result<Value> ToInt(const Value& v, const Value& dflt) {
    switch (v.kind) {
      case Value::Kind::kInt:
        return v;
      case Value::Kind::kBool:
        return Value::Int(v.b);
      case Value::Kind::kFloat:
        return std::isfinite(v.f) ? Value::Int(static_cast<int64_t>(v.f)) : dflt;
      case Value::Kind::kString: {
        const std::string t = Strip(v.s, nullptr, true, true);
        int64_t x = 0;
        auto r = std::from_chars(t.data(), t.data() + t.size(), x);
        if (r.ec == std::errc() && r.ptr == t.data() + t.size() && !t.empty()) return Value::Int(x);
        char* end = nullptr;
        const double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size() && std::isfinite(d)) {
          return Value::Int(static_cast<int64_t>(d));
        }
        return dflt;
      }
      default:
        return dflt;
    }
  }

  Result<Value> ApplyFilter(const std::string& f, const Value& v, const Args& args, size_t pos) {
    auto need = [&](size_t lo, size_t hi) { return NeedArgs(args, lo, hi, f, pos); };
    auto kw_or = [&](std::string_view name, size_t index, const Value& dflt) -> Value {
      if (const Value* k = args.Kw(name)) return *k;
      return index < args.pos.size() ? args.pos[index] : dflt;
    };
    if (f == "default" || f == "d") {
      PW_RETURN_IF_ERROR(need(0, 2));
      const bool use_default = args.pos.size() == 2 && Truthy(args.pos[1])
                                   ? !Truthy(v)
                                   : v.kind == Value::Kind::kUndefined;
      if (use_default) return args.pos.empty() ? Value::Str("") : args.pos[0];
      return v;
    }
    if (f == "tojson") {
      // HF's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
      PW_RETURN_IF_ERROR(need(0, 4));
      JsonStyle style;
      const Value ea = kw_or("ensure_ascii", 0, Value::Bool(false));
      const Value indent = kw_or("indent", 1, Value::None());
      const Value seps = kw_or("separators", 2, Value::None());
      const Value sort = kw_or("sort_keys", 3, Value::Bool(false));
      style.ensure_ascii = Truthy(ea);
      style.sort_keys = Truthy(sort);
      if (indent.kind == Value::Kind::kInt) {
        style.indent = static_cast<int>(std::clamp<int64_t>(indent.i, 0, 64));
      } else if (indent.kind != Value::Kind::kNone) {
        return Err(pos, "tojson indent must be an integer");
      }
      if (seps.kind != Value::Kind::kNone) return Err(pos, "tojson separators are not supported");
      std::string out;
      if (!ToJson(v, style, 0, &out)) {
        return Err(pos, std::string("Object of type ") + KindName(v.kind) +
                            " is not JSON serializable");
      }
      return Value::Str(std::move(out));
    }
    if (f == "safe") {
      PW_RETURN_IF_ERROR(need(0, 0));
      Value m = Value::Str(ToString(v));
      m.markup = true;
      return m;
    }
    if (f == "string") {
      PW_RETURN_IF_ERROR(need(0, 0));
      return Value::Str(ToString(v));
    }
    if (f == "length" || f == "count") {
      PW_RETURN_IF_ERROR(need(0, 0));
      if (v.kind == Value::Kind::kString) return Value::Int(CodePointCount(v.s));
      if (v.kind == Value::Kind::kList && v.lazy) {
        return Err(pos, "object of type 'generator' has no len()");
      }
      if (v.kind == Value::Kind::kList) return Value::Int(v.list->size());
      if (v.kind == Value::Kind::kDict) return Value::Int(v.dict->size());
      if (v.kind == Value::Kind::kUndefined) return Value::Int(0);
      return Err(pos, std::string("object of type '") + KindName(v.kind) + "' has no len()");
    }
    if (f == "first" || f == "last") {
      PW_RETURN_IF_ERROR(need(0, 0));
      if (f == "last" && v.kind == Value::Kind::kList && v.lazy) {
        return Err(pos, "'generator' object is not reversible");
      }
      PW_ASSIGN_OR_RETURN(List items, Iterate(v, pos));
      if (items.empty()) return Value();
      return f == "first" ? items.front() : items.back();
    }
    if (f == "list") {
      PW_RETURN_IF_ERROR(need(0, 0));
      if (v.kind == Value::Kind::kList) return Value::MakeList(*v.list);
      PW_ASSIGN_OR_RETURN(List items, Iterate(v, pos));
      return Value::MakeList(std::move(items));
    }
    if (f == "items") {
      PW_RETURN_IF_ERROR(need(0, 0));
      if (v.kind == Value::Kind::kUndefined) return Lazy({});
      if (v.kind != Value::Kind::kDict) return Err(pos, "can only get item pairs from a mapping");
      List items;
      for (const auto& [k, x] : *v.dict) items.push_back(Value::MakeList({KeyValue(k), x}));
      return Lazy(std::move(items));
    }
    if (f == "dictsort") {
      // dictsort(case_sensitive=False, by='key', reverse=False)
      PW_RETURN_IF_ERROR(need(0, 3));
      if (v.kind != Value::Kind::kDict) return Err(pos, "dictsort expects a mapping");
      const bool cs = Truthy(kw_or("case_sensitive", 0, Value::Bool(false)));
      const Value by = kw_or("by", 1, Value::Str("key"));
      const bool rev = Truthy(kw_or("reverse", 2, Value::Bool(false)));
      if (by.kind != Value::Kind::kString || (by.s != "key" && by.s != "value")) {
        return Err(pos, "dictsort: 'by' must be 'key' or 'value'");
      }
      List items;
      for (const auto& [k, x] : *v.dict) items.push_back(Value::MakeList({KeyValue(k), x}));
      Status st;
      auto sort_key = [&](const Value& pair) {
        Value x = (*pair.list)[by.s == "key" ? 0 : 1];
        if (!cs && x.kind == Value::Kind::kString) x.s = Lower(x.s);
        return x;
      };
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        auto c = Compare(sort_key(a), sort_key(b), pos);
        if (!c.ok()) {
          st = c.status();
          return false;
        }
        return rev ? *c > 0 : *c < 0;
      });
      PW_RETURN_IF_ERROR(st);
      return Value::MakeList(std::move(items));
    }
    if (f == "format") {
      // Python's printf-style `value % args` (jinja2's format filter): %s, %r, %d, %i and %%,
      // the arguments positional, or named as %(name)s with keyword arguments.
      if (!args.pos.empty() && !args.kw.empty()) {
        return Err(pos, "format: can't handle positional and keyword arguments at the same time");
      }
      const std::string fmt = ToString(v);
      std::string out;
      size_t next = 0;
      for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] != '%') {
          out += fmt[i];
          continue;
        }
        if (++i >= fmt.size()) return Err(pos, "format: incomplete format");
        if (fmt[i] == '%') {
          out += '%';
          continue;
        }
        const Value* arg = nullptr;
        if (fmt[i] == '(') {
          const size_t close = fmt.find(')', i);
          if (close == std::string::npos) return Err(pos, "format: incomplete format key");
          arg = args.Kw(fmt.substr(i + 1, close - i - 1));
          if (arg == nullptr) return Err(pos, "format: KeyError: '" + fmt.substr(i + 1, close - i - 1) + "'");
          i = close + 1;
          if (i >= fmt.size()) return Err(pos, "format: incomplete format");
        } else {
          if (!args.kw.empty()) return Err(pos, "format: format requires a mapping");
          if (next >= args.pos.size()) return Err(pos, "format: not enough arguments for format string");
          arg = &args.pos[next++];
        }
        const char conv = fmt[i];
        if (conv == 's') {
          out += ToString(*arg);
        } else if (conv == 'r') {
          out += Repr(*arg);
        } else if (conv == 'd' || conv == 'i') {
          if (arg->kind == Value::Kind::kInt || arg->kind == Value::Kind::kBool) {
            out += std::to_string(arg->kind == Value::Kind::kInt ? arg->i : static_cast<int64_t>(arg->b));
          } else if (arg->kind == Value::Kind::kFloat && std::isfinite(arg->f) && std::fabs(arg->f) < 9e18) {
            out += std::to_string(static_cast<int64_t>(arg->f));
          } else {
            return Err(pos, std::string("format: %") + conv + " format: a real number is required, not " +
                                KindName(arg->kind));
          }
        } else {
          return Err(pos, std::string("format: the conversion '%") + conv + "' is not supported");
        }
        if (out.size() > kMaxOutput) return Err(pos, "format() result too large");
      }
      if (args.kw.empty() && next < args.pos.size()) {
        return Err(pos, "format: not all arguments converted during string formatting");
      }
      return Value::Str(std::move(out));
    }
    if (f == "sort") {
      // sort(reverse=False, case_sensitive=False, attribute=None): a stable sort; attribute may
      // name several, comma-separated, compared in turn.
      PW_RETURN_IF_ERROR(need(0, 3));
      const bool rev = Truthy(kw_or("reverse", 0, Value::Bool(false)));
      const bool cs = Truthy(kw_or("case_sensitive", 1, Value::Bool(false)));
      const Value attr = kw_or("attribute", 2, Value::None());
      PW_ASSIGN_OR_RETURN(List items, Iterate(v, pos));
      std::vector<std::string> paths;
      if (attr.kind == Value::Kind::kString) {
        for (size_t p = 0;;) {
          const size_t comma = attr.s.find(',', p);
          paths.push_back(attr.s.substr(p, comma == std::string::npos ? std::string::npos : comma - p));
          if (comma == std::string::npos) break;
          p = comma + 1;
        }
      } else if (attr.kind != Value::Kind::kNone && attr.kind != Value::Kind::kUndefined) {
        return Err(pos, "sort: attribute must be a string");
      }
      std::vector<std::pair<List, Value>> keyed;  // (keys, item)
      for (const Value& item : items) {
        List keys;
        for (const std::string& path : paths) {
          PW_ASSIGN_OR_RETURN(Value k, Attribute(item, path, pos));
          keys.push_back(std::move(k));
        }
        if (paths.empty()) keys.push_back(item);
        for (Value& k : keys) {
          if (!cs && k.kind == Value::Kind::kString) k.s = Lower(k.s);
        }
        keyed.emplace_back(std::move(keys), item);
      }
      Status st;
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
        for (size_t k = 0; k < a.first.size() && st.ok(); ++k) {
          auto c = Compare(a.first[k], b.first[k], pos);
          if (!c.ok()) {
            st = c.status();
            return false;
          }
          if (*c != 0) return rev ? *c > 0 : *c < 0;
        }
        return false;
      });
      PW_RETURN_IF_ERROR(st);
      List out;
      for (auto& [keys, item] : keyed) out.push_back(std::move(item));
      return Value::MakeList(std::move(out));
    }
    if (f == "min" || f == "max") {
      // min/max(case_sensitive=False, attribute=None): the first least (greatest) item; an
      // empty sequence gives an undefined value.
      PW_RETURN_IF_ERROR(need(0, 2));
      const bool cs = Truthy(kw_or("case_sensitive", 0, Value::Bool(false)));
      const Value attr = kw_or("attribute", 1, Value::None());
      PW_ASSIGN_OR_RETURN(List items, Iterate(v, pos));
      if (items.empty()) return Value();
      auto key_of = [&](const Value& item) -> Result<Value> {
        Value k = item;
        if (attr.kind == Value::Kind::kString) {
          PW_ASSIGN_OR_RETURN(k, Attribute(item, attr.s, pos));
        }
        if (!cs && k.kind == Value::Kind::kString) k.s = Lower(k.s);
        return k;
      };
      size_t best = 0;
      PW_ASSIGN_OR_RETURN(Value best_key, key_of(items[0]));
      for (size_t k = 1; k < items.size(); ++k) {
        PW_ASSIGN_OR_RETURN(Value key, key_of(items[k]));
        PW_ASSIGN_OR_RETURN(int c, Compare(key, best_key, pos));
        if (f == "min" ? c < 0 : c > 0) {
          best = k;
          best_key = std::move(key);
        }
      }
      return items[best];
    }
    if (f == "unique") {
      // unique(case_sensitive=False, attribute=None): first occurrences, in order.
      PW_RETURN_IF_ERROR(need(0, 2));
      const bool cs = Truthy(kw_or("case_sensitive", 0, Value::Bool(false)));
      const Value attr = kw_or("attribute", 1, Value::None());
      PW_ASSIGN_OR_RETURN(List items, Iterate(v, pos));
      List out, seen;
      for (const Value& item : items) {
        Value key = item;
        if (attr.kind == Value::Kind::kString) {
          PW_ASSIGN_OR_RETURN(key, Attribute(item, attr.s, pos));
        }
        if (!cs && key.kind == Value::Kind::kString) key.s = Lower(key.s);
        bool dup = false;
        for (const Value& s : seen) dup = dup || Equal(s, key);
        if (dup) continue;
        seen.push_back(key);
        out.push_back(item);
      }
      return Value::MakeList(std::move(out));
    }
    if (f == "join") {
      // join(d='', attribute=None)
      PW_RETURN_IF_ERROR(need(0, 2));
      const Value sep = kw_or("d", 0, Value::Str(""));
      const Value attr = kw_or("attribute", 1, Value::None());
      PW_ASSIGN_OR_RETURN(List items, Iterate(v, pos));
      std::string out;
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += ToString(sep);
        Value item = items[k];
        if (attr.kind == Value::Kind::kString) {
          PW_ASSIGN_OR_RETURN(item, Attribute(item, attr.s, pos));
        }
        out += ToString(item);
        if (out.size() > kMaxOutput) return Err(pos, "join() result too large");
      }
      return Value::Str(std::move(out));
    }
    if (f == "map") {
      // map(attribute='x', default=None) or map('filter', args...)
      // Jinja maps a false value (None, an undefined one) to nothing.
      PW_ASSIGN_OR_RETURN(List items, Truthy(v) ? Iterate(v, pos) : Result<List>(List{}));
      List out;
      if (const Value* attr = args.Kw("attribute")) {
        if (attr->kind != Value::Kind::kString) return Err(pos, "map: attribute must be a string");
        const Value* dflt = args.Kw("default");
        for (const Value& item : items) {
          PW_ASSIGN_OR_RETURN(Value x, Attribute(item, attr->s, pos));
          if (x.kind == Value::Kind::kUndefined && dflt) x = *dflt;
          out.push_back(std::move(x));
        }
        return Lazy(std::move(out));
      }
      if (args.pos.empty() || args.pos[0].kind != Value::Kind::kString) {
        return Err(pos, "map expects a filter name or attribute=");
      }
      const std::string name = args.pos[0].s;
      if (!Filters().count(name)) return Err(pos, "map: unsupported filter '" + name + "'");
      Args rest;
      rest.pos.assign(args.pos.begin() + 1, args.pos.end());
      rest.kw = args.kw;
      for (const Value& item : items) {
        PW_ASSIGN_OR_RETURN(Value x, ApplyFilter(name, item, rest, pos));
        out.push_back(std::move(x));
      }
      return Lazy(std::move(out));
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      const bool attr = f == "selectattr" || f == "rejectattr";
      const bool keep_if = f == "select" || f == "selectattr";
      if (!args.kw.empty()) return Err(pos, f + " takes no keyword arguments");
      size_t k = 0;
      std::string path;
      if (attr) {
        if (args.pos.empty() || args.pos[0].kind != Value::Kind::kString) {
          return Err(pos, f + " expects an attribute name");
        }
        path = args.pos[k++].s;
      }
      std::string test;
      if (k < args.pos.size()) {
        if (args.pos[k].kind != Value::Kind::kString) return Err(pos, f + " expects a test name");
        test = args.pos[k++].s;
        if (!Tests().count(test)) return Err(pos, f + ": unsupported test '" + test + "'");
      }
      const std::vector<Value> targs(args.pos.begin() + k, args.pos.end());
      // Jinja selects nothing from a false value (None, an undefined one).
      PW_ASSIGN_OR_RETURN(List items, Truthy(v) ? Iterate(v, pos) : Result<List>(List{}));
      List out;
      for (const Value& item : items) {
        Value x = item;
        if (attr) {
          PW_ASSIGN_OR_RETURN(x, Attribute(item, path, pos));
        }
        bool r;
        if (test.empty()) {
          r = Truthy(x);
        } else {
          PW_ASSIGN_OR_RETURN(r, RunTest(test, x, targs, pos));
        }
        if (r == keep_if) out.push_back(item);
      }
      return Lazy(std::move(out));
    }
    if (f == "replace") {
      PW_RETURN_IF_ERROR(need(2, 3));
      const Value count = kw_or("count", 2, Value::None());
      if (count.kind != Value::Kind::kNone && count.kind != Value::Kind::kInt) {
        return Err(pos, "replace: count must be an integer");
      }
      std::string out = Replace(ToString(v), ToString(args.pos[0]), ToString(args.pos[1]),
                                count.kind == Value::Kind::kInt ? count.i : -1);
      if (out.size() > kMaxOutput) return Err(pos, "replace() result too large");
      return Value::Str(std::move(out));
    }
    if (f == "indent") {
      // indent(width=4, first=False, blank=False), as Jinja 3.1.
      PW_RETURN_IF_ERROR(need(0, 3));
      const Value width = kw_or("width", 0, Value::Int(4));
      const bool first = Truthy(kw_or("first", 1, Value::Bool(false)));
      const bool blank = Truthy(kw_or("blank", 2, Value::Bool(false)));
      std::string ind;
      if (width.kind == Value::Kind::kString) {
        ind = width.s;
      } else if (width.kind == Value::Kind::kInt) {
        ind.assign(static_cast<size_t>(std::clamp<int64_t>(width.i, 0, 1024)), ' ');
      } else {
        return Err(pos, "indent: width must be an integer or a string");
      }
      // str.splitlines() of the text plus "\n" (\n, \r\n and \r end lines).
      const std::string text = ToString(v) + "\n";
      std::vector<std::string> lines;
      size_t p = 0;
      while (p < text.size()) {
        size_t q = p;
        while (q < text.size() && text[q] != '\n' && text[q] != '\r') ++q;
        lines.push_back(text.substr(p, q - p));
        if (q < text.size() && text[q] == '\r' && q + 1 < text.size() && text[q + 1] == '\n') ++q;
        p = q + 1;
      }
      std::string out;
      for (size_t k = 0; k < lines.size(); ++k) {
        if (k) {
          out += '\n';
          if (blank || !lines[k].empty()) out += ind;
        }
        out += lines[k];
        if (out.size() > kMaxOutput) return Err(pos, "indent() result too large");
      }
      if (first) out = ind + out;
      return Value::Str(std::move(out));
    }
    if (f == "wordcount") {
      PW_RETURN_IF_ERROR(need(0, 0));
      // Runs of Python's \w: letters, numbers and '_'.
      const std::string s = ToString(v);
      const auto off = CodePointOffsets(s);
      int64_t n = 0;
      bool in_word = false;
      for (size_t k = 0; k + 1 < off.size(); ++k) {
        const unsigned char c0 = static_cast<unsigned char>(s[off[k]]);
        const size_t len = off[k + 1] - off[k];
        char32_t cp = len == 1 ? c0 : len == 2 ? c0 & 0x1F : len == 3 ? c0 & 0x0F : c0 & 0x07;
        for (size_t j = 1; j < len; ++j) cp = (cp << 6) | (static_cast<unsigned char>(s[off[k] + j]) & 0x3F);
        const auto cls = unicode::Classify(cp);
        const bool w = cp == '_' || cls == unicode::CharClass::kLetter ||
                       cls == unicode::CharClass::kNumber;
        if (w && !in_word) ++n;
        in_word = w;
      }
      return Value::Int(n);
    }
    if (f == "int") {
      PW_RETURN_IF_ERROR(need(0, 2));
      return ToInt(v, kw_or("default", 0, Value::Int(0)));
    }
    if (f == "float") {
      PW_RETURN_IF_ERROR(need(0, 1));
      const Value dflt = kw_or("default", 0, Value::Float(0));
      if (v.kind == Value::Kind::kFloat) return v;
      if (v.kind == Value::Kind::kInt || v.kind == Value::Kind::kBool) {
        return Value::Float(v.AsDouble());
      }
      if (v.kind == Value::Kind::kString) {
        const std::string t = Strip(v.s, nullptr, true, true);
        char* end = nullptr;
        const double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size()) return Value::Float(d);
      }
      return dflt;
    }
    if (f == "abs") {
      PW_RETURN_IF_ERROR(need(0, 0));
      if (v.kind == Value::Kind::kInt) return Value::Int(v.i < 0 ? -v.i : v.i);
      if (v.kind == Value::Kind::kBool) return Value::Int(v.b);
      if (v.kind == Value::Kind::kFloat) return Value::Float(std::fabs(v.f));
      return Err(pos, std::string("bad operand type for abs(): '") + KindName(v.kind) + "'");
    }
    if (f == "round") {
      // round(precision=0, method='common'|'ceil'|'floor'); always a float, as Jinja.
      PW_RETURN_IF_ERROR(need(0, 2));
      const Value prec = kw_or("precision", 0, Value::Int(0));
      const Value method = kw_or("method", 1, Value::Str("common"));
      if (!v.IsNumber()) return Err(pos, "round expects a number");
      if (prec.kind != Value::Kind::kInt) return Err(pos, "round: precision must be an integer");
      const double scale = std::pow(10.0, static_cast<double>(prec.i));
      const double x = v.AsDouble() * scale;
      double r;
      if (method.kind == Value::Kind::kString && method.s == "common") {
        if (prec.i >= 0 && prec.i <= 30) {
          // Python's round(x, n): the exact binary value rounded half to even, as printf does.
          char buf[512];
          std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(prec.i), v.AsDouble());
          return Value::Float(std::strtod(buf, nullptr));
        }
        r = std::nearbyint(x);
      } else if (method.kind == Value::Kind::kString && method.s == "ceil") {
        r = std::ceil(x);
      } else if (method.kind == Value::Kind::kString && method.s == "floor") {
        r = std::floor(x);
      } else {
        return Err(pos, "round: method must be common, ceil or floor");
      }
      return Value::Float(r / scale);
    }
    // String filters (Jinja converts the value to a string first).
    if (f == "trim") {
      PW_RETURN_IF_ERROR(need(0, 1));
      const bool given = !args.pos.empty() && args.pos[0].kind != Value::Kind::kNone;
      const std::string chars = given ? ToString(args.pos[0]) : "";
      return Value::Str(Strip(ToString(v), given ? &chars : nullptr, true, true));
    }
    PW_RETURN_IF_ERROR(need(0, 0));
    const std::string s = ToString(v);
    if (f == "upper") return Value::Str(Upper(s));
    if (f == "lower") return Value::Str(Lower(s));
    if (f == "capitalize") return Value::Str(Capitalize(s));
    if (f == "title") return Value::Str(TitleFilter(s));
    return Err(pos, "internal: filter '" + f + "'");
  }

  Result<bool> RunTest(const std::string& t, const Value& v, const std::vector<Value>& args,
                       size_t pos) {
    using K = Value::Kind;
    auto need = [&](size_t n) -> Status {
      if (args.size() != n) {
        return Err(pos, "test '" + t + "' takes " + std::to_string(n) + " argument(s), got " +
                            std::to_string(args.size()));
      }
      return Status::Ok();
    };
    if (t == "equalto" || t == "eq" || t == "==" || t == "ne" || t == "!=") {
      PW_RETURN_IF_ERROR(need(1));
      return Equal(v, args[0]) == (t != "ne" && t != "!=");
    }
    if (t == "lt" || t == "<" || t == "le" || t == "<=" || t == "gt" || t == ">" || t == "ge" ||
        t == ">=") {
      PW_RETURN_IF_ERROR(need(1));
      PW_ASSIGN_OR_RETURN(int c, Compare(v, args[0], pos));
      if (t == "lt" || t == "<") return c < 0;
      if (t == "le" || t == "<=") return c <= 0;
      if (t == "gt" || t == ">") return c > 0;
      return c >= 0;
    }
    if (t == "in") {
      PW_RETURN_IF_ERROR(need(1));
      return Contains(args[0], v, pos);
    }
    if (t == "sameas") {
      // Python's `is`: the same object. Only none, true and false are one object each whatever
      // made them; for other values identity depends on the interpreter, so it is refused.
      if (args.size() != 1) return Err(pos, "test 'sameas' takes one argument");
      const Value& o = args[0];
      auto singleton = [](const Value& x) { return x.kind == K::kNone || x.kind == K::kBool; };
      if (singleton(v) || singleton(o)) {
        return v.kind == o.kind && (v.kind != K::kBool || v.b == o.b);
      }
      return Err(pos, "test 'sameas' compares a value with none, true or false only");
    }
    if (t == "divisibleby") {
      PW_RETURN_IF_ERROR(need(1));
      if (v.kind != K::kInt || args[0].kind != K::kInt) return Err(pos, "divisibleby takes integers");
      if (args[0].i == 0) return Err(pos, "integer division or modulo by zero");
      return v.i % args[0].i == 0;
    }
    PW_RETURN_IF_ERROR(need(0));
    if (t == "defined") return v.kind != K::kUndefined;
    if (t == "undefined") return v.kind == K::kUndefined;
    if (t == "none") return v.kind == K::kNone;
    if (t == "string") return v.kind == K::kString;
    if (t == "number") return v.kind == K::kInt || v.kind == K::kFloat || v.kind == K::kBool;
    if (t == "integer") return v.kind == K::kInt;
    if (t == "float") return v.kind == K::kFloat;
    if (t == "boolean") return v.kind == K::kBool;
    if (t == "sequence" || t == "iterable") {
      // jinja2's Undefined has a length and iterates as empty: it is both.
      return v.kind == K::kList || v.kind == K::kString || v.kind == K::kDict || v.kind == K::kUndefined;
    }
    if (t == "mapping") return v.kind == K::kDict;
    if (t == "callable") return v.kind == K::kCallable;
    if (t == "true") return v.kind == K::kBool && v.b;
    if (t == "false") return v.kind == K::kBool && !v.b;
    if (t == "odd" || t == "even") {
      if (v.kind != K::kInt) return Err(pos, "test '" + t + "' takes an integer");
      return (v.i % 2 != 0) == (t == "odd");
    }
    if (t == "lower" || t == "upper") {
      const std::string s = ToString(v);
      return t == "lower" ? unicode::PyIsLower(s) : unicode::PyIsUpper(s);
    }
    return Err(pos, "internal: test '" + t + "'");
  }

  Result<int> Compare(const Value& l, const Value& r, size_t pos) const {
    if (l.IsNumber() && r.IsNumber()) {
      return l.AsDouble() < r.AsDouble() ? -1 : l.AsDouble() > r.AsDouble() ? 1 : 0;
    }
    if (l.kind == Value::Kind::kString && r.kind == Value::Kind::kString) {
      const int c = l.s.compare(r.s);
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    return Err(pos, std::string("'<' not supported between instances of '") + KindName(l.kind) +
                        "' and '" + KindName(r.kind) + "'");
  }

  Result<bool> Contains(const Value& container, const Value& x, size_t pos) const {
    if (container.kind == Value::Kind::kString && x.kind == Value::Kind::kString) {
      return container.s.find(x.s) != std::string::npos;
    }
    if (container.kind == Value::Kind::kList) {
      for (const Value& y : *container.list) {
        if (Equal(y, x)) return true;
      }
      return false;
    }
    std::string key;
    if ((container.kind == Value::Kind::kDict || container.kind == Value::Kind::kNamespace) &&
        KeyOf(x, &key)) {
      return container.Find(key) != nullptr;
    }
    if (container.kind == Value::Kind::kDict) return false;
    if (container.kind == Value::Kind::kUndefined) return false;  // iterates as empty in Jinja
    return Err(pos, std::string("argument of type '") +
                        (container.kind == Value::Kind::kNone ? "NoneType" : KindName(container.kind)) +
                        "' is not iterable");
  }

  Result<Value> EvalBinary(const Expr& e) {
    PW_ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
    PW_ASSIGN_OR_RETURN(Value r, Eval(*e.args[1]));
    const std::string& op = e.name;
    using K = Value::Kind;
    auto type_error = [&]() {
      return Err(e.pos, "unsupported operand types for " + op + ": '" + KindName(l.kind) +
                            "' and '" + KindName(r.kind) + "'");
    };
    if (op == "==") return Value::Bool(Equal(l, r));
    if (op == "!=") return Value::Bool(!Equal(l, r));
    if (op == "~") {
      std::string s = ToString(l) + ToString(r);
      if (s.size() > kMaxOutput) return Err(e.pos, "string too large");
      return Value::Str(std::move(s));
    }
    if (op == "in" || op == "not in") {
      PW_ASSIGN_OR_RETURN(bool found, Contains(r, l, e.pos));
      return Value::Bool(found != (op == "not in"));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      if (!(l.IsNumber() && r.IsNumber()) && !(l.kind == K::kString && r.kind == K::kString)) {
        return type_error();
      }
      PW_ASSIGN_OR_RETURN(int c, Compare(l, r, e.pos));
      return Value::Bool(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (l.kind == K::kString && r.kind == K::kString) {
        if (l.s.size() + r.s.size() > kMaxOutput) return Err(e.pos, "string too large");
        if (l.markup || r.markup) {  // Markup + str escapes the str, as markupsafe does
          Value m = Value::Str((l.markup ? l.s : EscapeHtml(l.s)) + (r.markup ? r.s : EscapeHtml(r.s)));
          m.markup = true;
          return m;
        }
        return Value::Str(l.s + r.s);
      }
      if (l.kind == K::kList && r.kind == K::kList && !l.lazy && !r.lazy) {
        List items = *l.list;
        items.insert(items.end(), r.list->begin(), r.list->end());
        return Value::MakeList(std::move(items));
      }
    }
    if (op == "*" && l.kind == K::kString && r.kind == K::kInt) {
      if (r.i > 0 && l.s.size() * static_cast<uint64_t>(r.i) > kMaxOutput) {
        return Err(e.pos, "string too large");
      }
      std::string s;
      if (r.i > 0) s.reserve(l.s.size() * r.i);
      for (int64_t k = 0; k < r.i; ++k) s += l.s;
      return Value::Str(std::move(s));
    }
    if (!l.IsNumber() || !r.IsNumber()) return type_error();
    const bool ints = l.kind != K::kFloat && r.kind != K::kFloat;
    const int64_t li = l.kind == K::kBool ? l.b : l.i, ri = r.kind == K::kBool ? r.b : r.i;
    if (op == "+") return ints ? Value::Int(li + ri) : Value::Float(l.AsDouble() + r.AsDouble());
    if (op == "-") return ints ? Value::Int(li - ri) : Value::Float(l.AsDouble() - r.AsDouble());
    if (op == "*") return ints ? Value::Int(li * ri) : Value::Float(l.AsDouble() * r.AsDouble());
    if (op == "**") {
      if (ints && ri >= 0) {
        int64_t p = 1;
        for (int64_t k = 0; k < ri; ++k) {
          if (__builtin_mul_overflow(p, li, &p)) return Err(e.pos, "integer power too large");
        }
        return Value::Int(p);
      }
      return Value::Float(std::pow(l.AsDouble(), r.AsDouble()));
    }
    if (op == "/") {
      if (r.AsDouble() == 0) return Err(e.pos, "division by zero");
      return Value::Float(l.AsDouble() / r.AsDouble());
    }
    if (op == "//" || op == "%") {
      if (!ints) return Err(e.pos, "'" + op + "' on floats is not supported");
      if (ri == 0) return Err(e.pos, "integer division or modulo by zero");
      // Python floors toward negative infinity.
      int64_t q = li / ri, m = li % ri;
      if (m != 0 && ((m < 0) != (ri < 0))) {
        --q;
        m += ri;
      }
      return Value::Int(op == "//" ? q : m);
    }
    return type_error();
  }

  static constexpr int kMaxMacroDepth = 64;  // bounds macro recursion (and so the stack)
  std::string_view src_;
  int64_t now_unix_;
  std::vector<std::map<std::string, Value>> scopes_;
  size_t frame_base_ = 0;  // first scope of the current macro frame (0: the top level)
  // The call blocks whose macros are running, innermost last: where caller() renders.
  struct Caller {
    const Node* node;
    size_t scopes;      // scopes_.size() when the block ran
    size_t frame_base;  // frame_base_ then
  };
  std::vector<Caller> callers_;
  LoopCtl loop_ctl_ = LoopCtl::kNone;
  int macro_depth_ = 0;
};

}  // namespace jinja

Result<ChatTemplate> ChatTemplate::Parse(std::string_view raw_source) {
  // As Jinja loads a template: line breaks become "\n" and one trailing newline is dropped
  // (keep_trailing_newline=False).
  std::string source;
  source.reserve(raw_source.size());
  for (size_t k = 0; k < raw_source.size(); ++k) {
    if (raw_source[k] == '\r') {
      source += '\n';
      if (k + 1 < raw_source.size() && raw_source[k + 1] == '\n') ++k;
    } else {
      source += raw_source[k];
    }
  }
  if (!source.empty() && source.back() == '\n') source.pop_back();
  std::vector<jinja::Piece> pieces;
  jinja::Lexer lexer(source);
  PW_RETURN_IF_ERROR(lexer.Run(&pieces));
  jinja::Parser parser(source, std::move(pieces));
  PW_ASSIGN_OR_RETURN(auto root, parser.ParseAll());
  ChatTemplate t;
  t.source_ = std::move(source);
  t.root_ = std::shared_ptr<const jinja::Node>(std::move(root));
  return t;
}

namespace {

jinja::Value FromJson(const nlohmann::ordered_json& j) {
  using jinja::Value;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                 ? Value::Float(static_cast<double>(j.get<uint64_t>()))
                 : Value::Int(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      jinja::List items;
      for (const auto& x : j) items.push_back(FromJson(x));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      jinja::Dict d;
      for (const auto& [k, x] : j.items()) d.emplace_back(k, FromJson(x));
      return Value::MakeDict(std::move(d));
    }
    default:
      return Value::Str("<binary>");
  }
}

// HF's message normalisation (apply_chat_template): keys whose value is null are dropped, and the
// reasoning given under reasoning_content, thinking or reasoning is passed under both
// `thinking` (first) and `reasoning_content` (gpt-oss templates read the one, others the other).
nlohmann::ordered_json NormalizeMessage(const nlohmann::ordered_json& m) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  const nlohmann::ordered_json* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    auto it = m.find(key);
    if (!reasoning && it != m.end() && !it->is_null()) reasoning = &*it;
  }
  if (reasoning) out["thinking"] = *reasoning;
  for (const auto& [k, v] : m.items()) {
    if (!v.is_null()) out[k] = v;
  }
  if (reasoning) out["reasoning_content"] = *reasoning;
  return out;
}

constexpr char kContinueTag[] = "CONTINUE_FINAL_MESSAGE_TAG ";

}  // namespace

nlohmann::ordered_json ChatTemplateInputs::TextMessages(const std::vector<ChatMessage>& messages) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) out.push_back({{"role", m.role}, {"content", m.content}});
  return out;
}

Result<std::string> ChatTemplate::Render(const ChatTemplateInputs& in) const {
  using jinja::Value;
  if (!in.messages.is_array()) return InvalidArgument("chat template: messages must be a list");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (const auto& m : in.messages) {
    if (!m.is_object()) return InvalidArgument("chat template: each message must be an object");
    messages.push_back(NormalizeMessage(m));
  }
  // continue_final_message, as HF: the last message's content gets a tag, the prompt is cut
  // where the tag is rendered.
  std::string final_text;
  if (in.continue_final_message) {
    if (in.add_generation_prompt) {
      return InvalidArgument(
          "continue_final_message and add_generation_prompt are not compatible: the first "
          "continues the last message, the second starts a new assistant message");
    }
    if (messages.empty()) {
      return InvalidArgument("continue_final_message is set but the conversation is empty");
    }
    auto& last = messages.back();
    if (!last.contains("content")) {
      return InvalidArgument(
          "continue_final_message is set but the final message has no \"content\" to continue");
    }
    if (source_.find("content") == std::string::npos) {
      return InvalidArgument(
          "continue_final_message is set but the chat template does not read \"content\"");
    }
    auto& content = last["content"];
    if (content.is_string()) {
      final_text = content.get<std::string>();
      content = final_text + kContinueTag;
    } else if (content.is_array()) {
      bool found = false;
      for (auto it = content.rbegin(); it != content.rend() && !found; ++it) {
        if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
          final_text = (*it)["text"].get<std::string>();
          (*it)["text"] = final_text + kContinueTag;
          found = true;
        }
      }
      if (!found) {
        return InvalidArgument(
            "continue_final_message is set but the final message has no text to continue");
      }
    } else {
      return InvalidArgument("continue_final_message: the final message's content is not text");
    }
  }
  std::map<std::string, Value> globals;
  globals["messages"] = FromJson(messages);
  globals["add_generation_prompt"] = Value::Bool(in.add_generation_prompt);
  // HF passes these as None when the request has no tools or documents.
  globals["tools"] = FromJson(in.tools);
  globals["documents"] = Value::None();
  if (in.bos_token) globals["bos_token"] = Value::Str(*in.bos_token);
  if (in.eos_token) globals["eos_token"] = Value::Str(*in.eos_token);
  for (const char* f : {"raise_exception", "strftime_now", "namespace", "range", "dict"}) {
    globals[f] = Value::Builtin(f);
  }
  if (in.kwargs.is_object()) {
    for (const auto& [k, v] : in.kwargs.items()) globals[k] = FromJson(v);
  } else if (!in.kwargs.is_null()) {
    return InvalidArgument("chat template: kwargs must be an object");
  }
  const int64_t now = in.now_unix ? *in.now_unix
                                  : static_cast<int64_t>(std::time(nullptr));
  jinja::Renderer renderer(source_, std::move(globals), now);
  std::string out;
  PW_RETURN_IF_ERROR(renderer.Render(*root_, &out));
  if (in.continue_final_message) {
    const std::string tag = kContinueTag;
    const std::string tag_core = tag.substr(0, tag.size() - 1);
    // Python's str.strip(): the final text without surrounding whitespace must be rendered.
    size_t b = 0, e = final_text.size();
    while (b < e && jinja::IsSpace(final_text[b])) ++b;
    while (e > b && jinja::IsSpace(final_text[e - 1])) --e;
    const std::string stripped = final_text.substr(b, e - b);
    const size_t at = out.rfind(tag_core);
    if (out.find(stripped) == std::string::npos || at == std::string::npos) {
      return InvalidArgument(
          "continue_final_message is set but the chat template does not render the final "
          "message's content as given");
    }
    if (out.compare(at, tag.size(), tag) == 0) {
      out.resize(at);
    } else {  // the template trimmed the space after the tag: trim the end as HF does
      out.resize(at);
      while (!out.empty() && jinja::IsSpace(out.back())) out.pop_back();
    }
  }
  return out;
}

}  // namespace pw
