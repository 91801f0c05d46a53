#include "common/text/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>

namespace pw {
namespace jinja {

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------
struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, as Python dicts

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<const List> list;
  std::shared_ptr<const Dict> dict;

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
  bool IsNumber() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  double AsDouble() const { return kind == Kind::kFloat ? f : kind == Kind::kBool ? b : double(i); }
  const Value* Find(std::string_view key) const {
    if (kind != Kind::kDict) return nullptr;
    for (const auto& [k, v] : *dict) {
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
      return !v.list->empty();
    case Value::Kind::kDict:
      return !v.dict->empty();
  }
  return false;
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
        out += (first ? "" : ", ") + Repr(Value::Str(key)) + ": " + Repr(val);
        first = false;
      }
      return out + "}";
    }
    default:
      return ToString(v);
  }
}

void JsonString(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char c : s) {
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
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

// json.dumps(x, ensure_ascii=False) with default separators, as HF's tojson filter.
void ToJson(const Value& v, std::string* out) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      *out += "null";
      break;
    case Value::Kind::kBool:
      *out += v.b ? "true" : "false";
      break;
    case Value::Kind::kInt:
      *out += std::to_string(v.i);
      break;
    case Value::Kind::kFloat:
      *out += FloatRepr(v.f);
      break;
    case Value::Kind::kString:
      JsonString(v.s, out);
      break;
    case Value::Kind::kList:
      *out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) *out += ", ";
        ToJson((*v.list)[k], out);
      }
      *out += ']';
      break;
    case Value::Kind::kDict: {
      *out += '{';
      bool first = true;
      for (const auto& [key, val] : *v.dict) {
        if (!first) *out += ", ";
        first = false;
        JsonString(key, out);
        *out += ": ";
        ToJson(val, out);
      }
      *out += '}';
      break;
    }
  }
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
    case Value::Kind::kList:
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
  // kAttr/kItem/kFilter/kTest/kNot/kNeg: args[0] is the operand (kItem: args[1] the index);
  // kSlice: object, start, stop, step (null when omitted); kCall: callee then arguments;
  // kBinary/kAnd/kOr: left, right; kIfElse: value, condition, else value (may be null);
  // kList: items; kDict: key, value, key, value, ...
  std::vector<std::unique_ptr<Expr>> args;
};

struct Node {
  enum class Kind { kBlock, kText, kOutput, kFor, kIf, kSet };
  Kind kind = Kind::kBlock;
  size_t pos = 0;
  std::string text;                             // kText
  std::unique_ptr<Expr> expr;                   // kOutput, kFor iterable, kSet value
  std::vector<std::string> vars;                // kFor loop targets, kSet target
  std::vector<std::unique_ptr<Node>> children;  // kBlock statements, kFor body (one block)
  std::vector<std::unique_ptr<Expr>> conds;     // kIf conditions; children holds one block per
                                                // condition plus one more for else
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
      // Find the closing delimiter (string literals inside tags may contain it).
      const char close = kind == '{' ? '}' : kind == '%' ? '%' : '#';
      size_t q = body;
      size_t end = std::string_view::npos;
      while (q < src_.size()) {
        const char c = src_[q];
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
  static const std::set<std::string> k = {"trim",       "length",  "count",  "upper",  "lower",
                                          "capitalize", "title",   "string", "first",  "last",
                                          "join",       "default", "d",      "tojson", "list"};
  return k;
}
const std::set<std::string>& Tests() {
  static const std::set<std::string> k = {"defined", "undefined", "none",     "string",
                                          "number",  "boolean",   "sequence", "mapping",
                                          "true",    "false",     "iterable"};
  return k;
}
const std::set<std::string>& Methods() {
  static const std::set<std::string> k = {"strip",      "lstrip",   "rstrip",  "upper",  "lower",
                                          "startswith", "endswith", "replace", "split",  "title",
                                          "capitalize", "get",      "keys",    "values", "items"};
  return k;
}
const std::set<std::string>& Functions() {
  static const std::set<std::string> k = {"raise_exception", "range"};
  return k;
}

class ExprParser {
 public:
  ExprParser(std::string_view src, const Piece& piece) : src_(src), piece_(piece) {}

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
        if (!Tests().count(e->name)) return Err(pos, "unsupported test '" + e->name + "'", true);
        e->args.push_back(std::move(left));
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
    PW_ASSIGN_OR_RETURN(ExprP left, ParseUnary());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      auto e = Make(Expr::Op::kBinary, Peek().pos);
      e->name = Next().text;
      PW_ASSIGN_OR_RETURN(ExprP right, ParseUnary());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprP> ParseUnary() {
    DepthGuard guard(&depth_);
    PW_RETURN_IF_ERROR(CheckDepth());
    if (IsOp("-")) {
      auto e = Make(Expr::Op::kNeg, Next().pos);
      PW_ASSIGN_OR_RETURN(ExprP operand, ParseUnary());
      e->args.push_back(std::move(operand));
      return e;
    }
    if (IsOp("+")) {
      Next();
      return ParseUnary();
    }
    if (IsOp("**")) return Err(Peek().pos, "'**' is not supported", true);
    return ParsePostfix();
  }

  Status ParseCallArgs(Expr* e) {
    PW_RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      if (Peek().kind == Tok::Kind::kName && IsOp("=", 1)) {
        return Err(Peek().pos, "keyword arguments are not supported", true);
      }
      PW_ASSIGN_OR_RETURN(ExprP arg, ParseExpr());
      e->args.push_back(std::move(arg));
      if (!IsOp(",")) break;
      Next();
    }
    return Expect(")");
  }

  Result<ExprP> ParsePostfix() {
    PW_ASSIGN_OR_RETURN(ExprP e, ParsePrimary());
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
          if (!Functions().count(e->name)) {
            return Err(e->pos, "unsupported function '" + e->name + "'", true);
          }
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
      } else if (IsOp("|")) {
        const size_t pos = Next().pos;
        auto f = Make(Expr::Op::kFilter, pos);
        PW_ASSIGN_OR_RETURN(f->name, ExpectName());
        if (!Filters().count(f->name))
          return Err(pos, "unsupported filter '" + f->name + "'", true);
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
      Next();
      PW_ASSIGN_OR_RETURN(ExprP e, ParseExpr());
      if (IsOp(",")) return Err(Peek().pos, "tuples are not supported", true);
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
    return block;
  }

 private:
  Status Err(size_t pos, const std::string& what, bool unsupported) const {
    const std::string msg = Where(src_, pos) + what;
    return unsupported ? Unsupported(msg) : InvalidArgument(msg);
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
      auto ep = std::make_unique<ExprParser>(src_, p);
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
        if (ep->IsName("if")) return Err(ep->Peek().pos, "loop filters are not supported", true);
        if (ep->IsName("recursive")) return Err(ep->Peek().pos, "recursive loops", true);
        PW_RETURN_IF_ERROR(ep->ExpectEnd());
        std::string got;
        PW_ASSIGN_OR_RETURN(auto body, ParseBlock({"endfor", "else"}, &got));
        if (got.empty()) return Err(kw_pos, "'for' without 'endfor'", false);
        if (got == "else")
          return Err(current_->Peek().pos, "'for ... else' is not supported", true);
        PW_RETURN_IF_ERROR(FinishEndTag());
        n->children.push_back(std::move(body));
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
        n->kind = Node::Kind::kSet;
        n->pos = kw_pos;
        PW_ASSIGN_OR_RETURN(std::string var, ep->ExpectName());
        if (ep->IsOp(".")) return Err(ep->Peek().pos, "attribute assignment (namespace)", true);
        if (!ep->IsOp("=")) return Err(ep->Peek().pos, "block 'set' is not supported", true);
        ep->Next();
        n->vars.push_back(var);
        PW_ASSIGN_OR_RETURN(n->expr, ep->ParseExpr());
        PW_RETURN_IF_ERROR(ep->ExpectEnd());
        block->children.push_back(std::move(n));
      } else if (kw == "endfor" || kw == "endif" || kw == "elif" || kw == "else") {
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
  std::unique_ptr<ExprParser> current_;
};

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------
constexpr size_t kMaxOutput = size_t{64} << 20;

class Renderer {
 public:
  Renderer(std::string_view src, std::map<std::string, Value> globals) : src_(src) {
    scopes_.push_back(std::move(globals));
  }

  Status Render(const Node& n, std::string* out) {
    switch (n.kind) {
      case Node::Kind::kBlock:
        for (const auto& c : n.children) PW_RETURN_IF_ERROR(Render(*c, out));
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

  Status RenderFor(const Node& n, std::string* out) {
    PW_ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
    List items;
    if (seq.kind == Value::Kind::kList) {
      items = *seq.list;
    } else if (seq.kind == Value::Kind::kDict) {
      for (const auto& kv : *seq.dict) items.push_back(Value::Str(kv.first));
    } else if (seq.kind == Value::Kind::kString) {
      for (char c : seq.s) items.push_back(Value::Str(std::string(1, c)));
    } else if (seq.kind == Value::Kind::kUndefined || seq.kind == Value::Kind::kNone) {
      if (seq.kind == Value::Kind::kNone) return Err(n.pos, "'None' is not iterable");
    } else {
      return Err(n.pos, std::string("'") + KindName(seq.kind) + "' is not iterable");
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      std::map<std::string, Value> scope;
      if (n.vars.size() == 1) {
        scope[n.vars[0]] = items[k];
      } else {
        const Value& item = items[k];
        if (item.kind != Value::Kind::kList || item.list->size() != n.vars.size()) {
          return Err(n.pos,
                     "cannot unpack loop item into " + std::to_string(n.vars.size()) + " names");
        }
        for (size_t v = 0; v < n.vars.size(); ++v) scope[n.vars[v]] = (*item.list)[v];
      }
      scope["loop"] = Value::MakeDict({{"index", Value::Int(k + 1)},
                                       {"index0", Value::Int(k)},
                                       {"revindex", Value::Int(len - k)},
                                       {"revindex0", Value::Int(len - k - 1)},
                                       {"first", Value::Bool(k == 0)},
                                       {"last", Value::Bool(k == len - 1)},
                                       {"length", Value::Int(len)}});
      scopes_.push_back(std::move(scope));
      Status st = Render(*n.children[0], out);
      scopes_.pop_back();
      PW_RETURN_IF_ERROR(st);
    }
    return Status::Ok();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
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
      case Expr::Op::kFilter:
        return EvalFilter(e);
      case Expr::Op::kTest: {
        PW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value::Bool(RunTest(e.name, v) != e.negate);
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
          if (key.kind != Value::Kind::kString) return Err(e.pos, "dict keys must be strings");
          d.emplace_back(key.s, std::move(val));
        }
        return Value::MakeDict(std::move(d));
      }
      case Expr::Op::kBinary:
        return EvalBinary(e);
    }
    return Err(e.pos, "internal: unknown expression");
  }

  Result<Value> GetItem(const Value& obj, const Value& key, size_t pos) {
    if (obj.kind == Value::Kind::kDict && key.kind == Value::Kind::kString) {
      const Value* v = obj.Find(key.s);
      return v ? *v : Value();
    }
    if ((obj.kind == Value::Kind::kList || obj.kind == Value::Kind::kString) &&
        key.kind == Value::Kind::kInt) {
      const int64_t n = obj.kind == Value::Kind::kList ? obj.list->size() : obj.s.size();
      int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value();
      if (obj.kind == Value::Kind::kList) return (*obj.list)[k];
      return Value::Str(std::string(1, obj.s[k]));
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
    const int64_t n = obj.kind == Value::Kind::kList ? obj.list->size() : obj.s.size();
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
        s += obj.s[k];
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
  static std::string Upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string Lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string Capitalize(std::string s) {
    s = Lower(std::move(s));
    if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return s;
  }
  static std::string Title(std::string s) {
    bool start = true;
    for (char& c : s) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (std::isalpha(u)) {
        c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
        start = false;
      } else {
        start = true;
      }
    }
    return s;
  }

  Result<std::vector<Value>> EvalArgs(const Expr& e, size_t first) {
    std::vector<Value> out;
    for (size_t k = first; k < e.args.size(); ++k) {
      PW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k]));
      out.push_back(std::move(v));
    }
    return out;
  }

  Result<Value> EvalCall(const Expr& e) {
    const Expr& callee = *e.args[0];
    PW_ASSIGN_OR_RETURN(std::vector<Value> args, EvalArgs(e, 1));
    auto need = [&](size_t lo, size_t hi) -> Status {
      if (args.size() < lo || args.size() > hi) {
        return Err(e.pos, "'" + callee.name + "' takes " + std::to_string(lo) +
                              (hi != lo ? ".." + std::to_string(hi) : "") + " arguments, got " +
                              std::to_string(args.size()));
      }
      return Status::Ok();
    };
    auto str_arg = [&](size_t k) -> Result<std::string> {
      if (args[k].kind != Value::Kind::kString) {
        return Err(e.pos, "argument " + std::to_string(k + 1) + " of '" + callee.name +
                              "' must be a string");
      }
      return args[k].s;
    };
    if (callee.op == Expr::Op::kName) {
      if (callee.name == "raise_exception") {
        PW_RETURN_IF_ERROR(need(1, 1));
        return InvalidArgument("chat template raised: " + ToString(args[0]));
      }
      // range(stop) / range(start, stop[, step]) over integers.
      PW_RETURN_IF_ERROR(need(1, 3));
      for (const Value& a : args) {
        if (a.kind != Value::Kind::kInt) return Err(e.pos, "range() takes integers");
      }
      int64_t start = 0, stop, step = 1;
      if (args.size() == 1) {
        stop = args[0].i;
      } else {
        start = args[0].i;
        stop = args[1].i;
        if (args.size() == 3) step = args[2].i;
      }
      if (step == 0) return Err(e.pos, "range() step must not be zero");
      List items;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (items.size() >= 1000000) return Err(e.pos, "range() longer than 10^6");
        items.push_back(Value::Int(k));
      }
      return Value::MakeList(std::move(items));
    }
    // A method on the value of callee.args[0].
    PW_ASSIGN_OR_RETURN(Value self, Eval(*callee.args[0]));
    const std::string& m = callee.name;
    if (self.kind == Value::Kind::kString) {
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        PW_RETURN_IF_ERROR(need(0, 1));
        std::string chars;
        if (args.size() == 1) {
          PW_ASSIGN_OR_RETURN(chars, str_arg(0));
        }
        return Value::Str(
            Strip(self.s, args.empty() ? nullptr : &chars, m != "rstrip", m != "lstrip"));
      }
      if (m == "upper" || m == "lower" || m == "title" || m == "capitalize") {
        PW_RETURN_IF_ERROR(need(0, 0));
        return Value::Str(m == "upper"   ? Upper(self.s)
                          : m == "lower" ? Lower(self.s)
                          : m == "title" ? Title(self.s)
                                         : Capitalize(self.s));
      }
      if (m == "startswith" || m == "endswith") {
        PW_RETURN_IF_ERROR(need(1, 1));
        PW_ASSIGN_OR_RETURN(std::string a, str_arg(0));
        const bool r =
            a.size() <= self.s.size() &&
            (m == "startswith" ? self.s.compare(0, a.size(), a) == 0
                               : self.s.compare(self.s.size() - a.size(), a.size(), a) == 0);
        return Value::Bool(r);
      }
      if (m == "replace") {
        PW_RETURN_IF_ERROR(need(2, 2));
        PW_ASSIGN_OR_RETURN(std::string from, str_arg(0));
        PW_ASSIGN_OR_RETURN(std::string to, str_arg(1));
        if (from.empty()) return Err(e.pos, "replace() of an empty string is not supported");
        std::string out;
        size_t p = 0, f;
        while ((f = self.s.find(from, p)) != std::string::npos) {
          out.append(self.s, p, f - p);
          out += to;
          p = f + from.size();
          if (out.size() > kMaxOutput) return Err(e.pos, "replace() result too large");
        }
        out.append(self.s, p);
        return Value::Str(std::move(out));
      }
      if (m == "split") {
        PW_RETURN_IF_ERROR(need(0, 1));
        List parts;
        if (args.empty()) {  // runs of whitespace, no empty parts
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
          if (sep.empty()) return Err(e.pos, "split() with an empty separator");
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
        PW_RETURN_IF_ERROR(need(1, 2));
        PW_ASSIGN_OR_RETURN(std::string key, str_arg(0));
        const Value* v = self.Find(key);
        if (v) return *v;
        return args.size() == 2 ? args[1] : Value::None();
      }
      if (m == "keys" || m == "values" || m == "items") {
        PW_RETURN_IF_ERROR(need(0, 0));
        List items;
        for (const auto& [k, v] : *self.dict) {
          if (m == "keys") {
            items.push_back(Value::Str(k));
          } else if (m == "values") {
            items.push_back(v);
          } else {
            items.push_back(Value::MakeList({Value::Str(k), v}));
          }
        }
        return Value::MakeList(std::move(items));
      }
    }
    return Err(e.pos, std::string("'") + KindName(self.kind) + "' has no method '" + m + "'");
  }

  Result<Value> EvalFilter(const Expr& e) {
    PW_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    PW_ASSIGN_OR_RETURN(std::vector<Value> args, EvalArgs(e, 1));
    const std::string& f = e.name;
    auto need = [&](size_t lo, size_t hi) -> Status {
      if (args.size() < lo || args.size() > hi) {
        return Err(e.pos, "filter '" + f + "' got " + std::to_string(args.size()) + " arguments");
      }
      return Status::Ok();
    };
    if (f == "default" || f == "d") {
      PW_RETURN_IF_ERROR(need(0, 2));
      const bool use_default =
          args.size() == 2 && Truthy(args[1]) ? !Truthy(v) : v.kind == Value::Kind::kUndefined;
      if (use_default) return args.empty() ? Value::Str("") : args[0];
      return v;
    }
    if (f == "tojson") {
      PW_RETURN_IF_ERROR(need(0, 0));
      std::string out;
      ToJson(v, &out);
      return Value::Str(std::move(out));
    }
    if (f == "string") {
      PW_RETURN_IF_ERROR(need(0, 0));
      return Value::Str(ToString(v));
    }
    if (f == "length" || f == "count") {
      PW_RETURN_IF_ERROR(need(0, 0));
      if (v.kind == Value::Kind::kString) return Value::Int(v.s.size());
      if (v.kind == Value::Kind::kList) return Value::Int(v.list->size());
      if (v.kind == Value::Kind::kDict) return Value::Int(v.dict->size());
      return Err(e.pos, std::string("object of type '") + KindName(v.kind) + "' has no length");
    }
    if (f == "first" || f == "last") {
      PW_RETURN_IF_ERROR(need(0, 0));
      if (v.kind == Value::Kind::kList) {
        if (v.list->empty()) return Value();
        return f == "first" ? v.list->front() : v.list->back();
      }
      if (v.kind == Value::Kind::kString) {
        if (v.s.empty()) return Value();
        return Value::Str(std::string(1, f == "first" ? v.s.front() : v.s.back()));
      }
      return Err(e.pos, std::string("'") + KindName(v.kind) + "' has no " + f);
    }
    if (f == "list") {
      PW_RETURN_IF_ERROR(need(0, 0));
      if (v.kind == Value::Kind::kList) return v;
      List items;
      if (v.kind == Value::Kind::kString) {
        for (char c : v.s) items.push_back(Value::Str(std::string(1, c)));
      } else if (v.kind == Value::Kind::kDict) {
        for (const auto& kv : *v.dict) items.push_back(Value::Str(kv.first));
      } else {
        return Err(e.pos, std::string("'") + KindName(v.kind) + "' is not iterable");
      }
      return Value::MakeList(std::move(items));
    }
    if (f == "join") {
      PW_RETURN_IF_ERROR(need(0, 1));
      if (v.kind != Value::Kind::kList) return Err(e.pos, "join expects a list");
      const std::string sep = args.empty() ? "" : ToString(args[0]);
      std::string out;
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += sep;
        out += ToString((*v.list)[k]);
      }
      return Value::Str(std::move(out));
    }
    // String filters.
    PW_RETURN_IF_ERROR(need(0, 0));
    if (v.kind != Value::Kind::kString) {
      return Err(e.pos, "filter '" + f + "' expects a string, got '" + KindName(v.kind) + "'");
    }
    if (f == "trim") return Value::Str(Strip(v.s, nullptr, true, true));
    if (f == "upper") return Value::Str(Upper(v.s));
    if (f == "lower") return Value::Str(Lower(v.s));
    if (f == "capitalize") return Value::Str(Capitalize(v.s));
    if (f == "title") return Value::Str(Title(v.s));
    return Err(e.pos, "internal: filter '" + f + "'");
  }

  static bool RunTest(const std::string& t, const Value& v) {
    using K = Value::Kind;
    if (t == "defined") return v.kind != K::kUndefined;
    if (t == "undefined") return v.kind == K::kUndefined;
    if (t == "none") return v.kind == K::kNone;
    if (t == "string") return v.kind == K::kString;
    if (t == "number") return v.kind == K::kInt || v.kind == K::kFloat;
    if (t == "boolean") return v.kind == K::kBool;
    if (t == "sequence" || t == "iterable") {
      return v.kind == K::kList || v.kind == K::kString || v.kind == K::kDict;
    }
    if (t == "mapping") return v.kind == K::kDict;
    if (t == "true") return v.kind == K::kBool && v.b;
    if (t == "false") return v.kind == K::kBool && !v.b;
    return false;
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
      bool found = false;
      if (r.kind == K::kString && l.kind == K::kString) {
        found = r.s.find(l.s) != std::string::npos;
      } else if (r.kind == K::kList) {
        for (const Value& x : *r.list) found = found || Equal(x, l);
      } else if (r.kind == K::kDict && l.kind == K::kString) {
        found = r.Find(l.s) != nullptr;
      } else {
        return type_error();
      }
      return Value::Bool(found != (op == "not in"));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      if (l.IsNumber() && r.IsNumber()) {
        c = l.AsDouble() < r.AsDouble() ? -1 : l.AsDouble() > r.AsDouble() ? 1 : 0;
      } else if (l.kind == K::kString && r.kind == K::kString) {
        c = l.s.compare(r.s);
      } else {
        return type_error();
      }
      return Value::Bool(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (l.kind == K::kString && r.kind == K::kString) {
        if (l.s.size() + r.s.size() > kMaxOutput) return Err(e.pos, "string too large");
        return Value::Str(l.s + r.s);
      }
      if (l.kind == K::kList && r.kind == K::kList) {
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

  std::string_view src_;
  std::vector<std::map<std::string, Value>> scopes_;
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

Result<std::string> ChatTemplate::Render(const ChatTemplateInputs& in) const {
  using jinja::Value;
  jinja::List messages;
  for (const ChatMessage& m : in.messages) {
    messages.push_back(
        Value::MakeDict({{"role", Value::Str(m.role)}, {"content", Value::Str(m.content)}}));
  }
  std::map<std::string, Value> globals;
  globals["messages"] = Value::MakeList(std::move(messages));
  globals["add_generation_prompt"] = Value::Bool(in.add_generation_prompt);
  // HF passes these as None when the request has no tools or documents.
  globals["tools"] = Value::None();
  globals["documents"] = Value::None();
  if (in.bos_token) globals["bos_token"] = Value::Str(*in.bos_token);
  if (in.eos_token) globals["eos_token"] = Value::Str(*in.eos_token);
  jinja::Renderer renderer(source_, std::move(globals));
  std::string out;
  PW_RETURN_IF_ERROR(renderer.Render(*root_, &out));
  return out;
}

}  // namespace pw
