#include "common/text/tokenizer.h"

#include <algorithm>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "common/text/unicode_tables.h"

namespace pw {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------------------------
namespace utf8 {
namespace {

// For a lead byte: number of continuation bytes and the allowed range of the first one
// (tight ranges exclude overlong forms, surrogates and code points above U+10FFFF).
// Returns false for bytes that cannot start a sequence.
bool LeadInfo(uint8_t b, int* need, uint8_t* lo, uint8_t* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    *need = 1;
  } else if (b == 0xE0) {
    *need = 2;
    *lo = 0xA0;
  } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
    *need = 2;
  } else if (b == 0xED) {
    *need = 2;
    *hi = 0x9F;
  } else if (b == 0xF0) {
    *need = 3;
    *lo = 0x90;
  } else if (b >= 0xF1 && b <= 0xF3) {
    *need = 3;
  } else if (b == 0xF4) {
    *need = 3;
    *hi = 0x8F;
  } else {
    return false;
  }
  return true;
}

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::optional<size_t> FindInvalid(std::string_view bytes) {
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = static_cast<uint8_t>(bytes[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    int need;
    uint8_t lo, hi;
    if (!LeadInfo(b, &need, &lo, &hi)) return i;
    for (int k = 1; k <= need; ++k) {
      if (i + k >= n) return i;
      const uint8_t c = static_cast<uint8_t>(bytes[i + k]);
      if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return i;
    }
    i += need + 1;
  }
  return std::nullopt;
}

size_t AppendLossy(std::string_view bytes, bool final, std::string* out) {
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = static_cast<uint8_t>(bytes[i]);
    if (b < 0x80) {
      out->push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    int need;
    uint8_t lo, hi;
    if (!LeadInfo(b, &need, &lo, &hi)) {
      out->append(kReplacement);
      ++i;
      continue;
    }
    size_t j = i + 1;
    int got = 0;
    while (got < need) {
      if (j >= n) {  // a valid but unfinished character at the end
        if (!final) return i;
        out->append(kReplacement);
        return n;
      }
      const uint8_t c = static_cast<uint8_t>(bytes[j]);
      const bool ok = got == 0 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++j;
      ++got;
    }
    if (got == need) {
      out->append(bytes.substr(i, need + 1));
    } else {
      out->append(kReplacement);  // the maximal subpart [i, j) is one replacement
    }
    i = j;
  }
  return n;
}

}  // namespace utf8

namespace {

// Decodes valid UTF-8 into code points and the byte offset of each (offsets has one extra entry
// for the end). The caller has validated `s`.
void DecodeCodepoints(std::string_view s, std::vector<char32_t>* cps, std::vector<uint32_t>* offs) {
  cps->clear();
  offs->clear();
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t b = static_cast<uint8_t>(s[i]);
    char32_t cp;
    size_t len;
    if (b < 0x80) {
      cp = b;
      len = 1;
    } else if (b < 0xE0) {
      cp = b & 0x1F;
      len = 2;
    } else if (b < 0xF0) {
      cp = b & 0x0F;
      len = 3;
    } else {
      cp = b & 0x07;
      len = 4;
    }
    for (size_t k = 1; k < len && i + k < s.size(); ++k) {
      cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    }
    cps->push_back(cp);
    offs->push_back(static_cast<uint32_t>(i));
    i += len;
  }
  offs->push_back(static_cast<uint32_t>(s.size()));
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The GPT-2 byte <-> printable character map: bytes 33..126, 161..172 and 174..255 stand for
// themselves; the other 68 bytes map, in increasing order, to U+0100, U+0101, ...
struct ByteLevelAlphabet {
  char32_t byte_to_cp[256];
  int16_t cp_to_byte[512];  // -1 when the code point is not in the alphabet
  std::string byte_to_utf8[256];
  ByteLevelAlphabet() {
    std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), int16_t{-1});
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      byte_to_cp[b] = printable ? static_cast<char32_t>(b) : next++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
      AppendUtf8(byte_to_cp[b], &byte_to_utf8[b]);
    }
  }
};

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet kAlphabet;
  return kAlphabet;
}

// Bytes a token string stands for under the ByteLevel decoder: each character mapped back to its
// byte, or the token's own UTF-8 when any character is outside the alphabet (as HF does).
std::string TokenStringToBytes(const std::string& token) {
  const ByteLevelAlphabet& a = Alphabet();
  std::vector<char32_t> cps;
  std::vector<uint32_t> offs;
  if (utf8::FindInvalid(token)) return token;
  DecodeCodepoints(token, &cps, &offs);
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) {
    if (cp >= 512 || a.cp_to_byte[cp] < 0) return token;
    out.push_back(static_cast<char>(a.cp_to_byte[cp]));
  }
  return out;
}

using unicode::CharClass;
using unicode::Classify;

// The split patterns, matched by hand. Each returns the length in code points of the match the
// regex would find starting at i (the patterns match at every position, so no gaps arise).
//
// GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Qwen2:   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
//          | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Llama-3: as Qwen2 with \p{N}{1,3} in place of \p{N}.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct ClassView {
  const std::vector<char32_t>& cps;
  std::vector<CharClass> cls;
  explicit ClassView(const std::vector<char32_t>& c) : cps(c), cls(c.size()) {
    for (size_t i = 0; i < c.size(); ++i) cls[i] = Classify(c[i]);
  }
  size_t size() const { return cps.size(); }
  size_t RunOf(size_t i, CharClass k) const {
    while (i < cls.size() && cls[i] == k) ++i;
    return i;
  }
};

// Length of 's|'t|'re|'ve|'m|'ll|'d at i (0 if none). Case-insensitive matching folds ASCII
// letters and U+017F (long s, which case-folds to 's').
size_t MatchContraction(const ClassView& v, size_t i, bool ignore_case) {
  const size_t n = v.size();
  if (v.cps[i] != U'\'' || i + 1 >= n) return 0;
  auto fold = [ignore_case](char32_t c) -> char32_t {
    if (!ignore_case) return c;
    if (c >= U'A' && c <= U'Z') return c - U'A' + U'a';
    if (c == 0x017F) return U's';
    return c;
  };
  const char32_t a = fold(v.cps[i + 1]);
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if (i + 2 < n) {
    const char32_t b = fold(v.cps[i + 2]);
    if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  }
  return 0;
}

// \s+(?!\S)|\s+ at a whitespace position i whose run ends at k.
size_t MatchTrailingSpace(size_t i, size_t k, size_t n) {
  if (k == n) return k - i;
  if (k - i >= 2) return k - i - 1;  // leave the last space to prefix the next word
  return 1;
}

size_t MatchGpt2(const ClassView& v, size_t i) {
  const size_t n = v.size();
  if (size_t m = MatchContraction(v, i, /*ignore_case=*/false)) return m;
  const size_t j = v.cps[i] == U' ' ? i + 1 : i;
  if (j < n && v.cls[j] != CharClass::kWhiteSpace) return v.RunOf(j, v.cls[j]) - i;
  // Whitespace at i (a lone ' ' followed by whitespace or the end also lands here).
  return MatchTrailingSpace(i, v.RunOf(i, CharClass::kWhiteSpace), n);
}

size_t MatchQwen2(const ClassView& v, size_t i, size_t max_digits) {
  const size_t n = v.size();
  if (size_t m = MatchContraction(v, i, /*ignore_case=*/true)) return m;
  const char32_t c = v.cps[i];
  const CharClass k = v.cls[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c != U'\r' && c != U'\n' && k != CharClass::kLetter && k != CharClass::kNumber && i + 1 < n &&
      v.cls[i + 1] == CharClass::kLetter) {
    return v.RunOf(i + 1, CharClass::kLetter) - i;
  }
  if (k == CharClass::kLetter) return v.RunOf(i, CharClass::kLetter) - i;
  // \p{N}{1,max_digits}
  if (k == CharClass::kNumber) return std::min(v.RunOf(i, CharClass::kNumber) - i, max_digits);
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  const size_t j = c == U' ' ? i + 1 : i;
  if (j < n && v.cls[j] == CharClass::kOther) {
    size_t e = v.RunOf(j, CharClass::kOther);
    while (e < n && (v.cps[e] == U'\r' || v.cps[e] == U'\n')) ++e;
    return e - i;
  }
  // Whitespace at i. \s*[\r\n]+ ends after the last line break of the run, if it has one.
  const size_t e = v.RunOf(i, CharClass::kWhiteSpace);
  for (size_t p = e; p > i; --p) {
    if (v.cps[p - 1] == U'\r' || v.cps[p - 1] == U'\n') return p - i;
  }
  return MatchTrailingSpace(i, e, n);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

// Builds a Tokenizer from parsed JSON; every accessor checks the shape first, so a malformed file
// yields a Status naming the field rather than an exception.
class TokenizerLoader {
 public:
  explicit TokenizerLoader(std::string source) : src_(std::move(source)) {}

  Status Corrupt(const std::string& field, const std::string& what) const {
    return pw::Corrupt(src_ + ": field '" + field + "': " + what);
  }
  Status Unsupported(const std::string& field, const std::string& what) const {
    return pw::Unsupported(src_ + ": field '" + field + "': " + what);
  }

  Result<std::unique_ptr<Tokenizer>> Load(const json& root) {
    if (!root.is_object()) return Corrupt("<root>", "expected a JSON object");
    std::unique_ptr<Tokenizer> t(new Tokenizer());
    PW_RETURN_IF_ERROR(CheckNullOrAbsent(root, "truncation"));
    PW_RETURN_IF_ERROR(CheckNullOrAbsent(root, "padding"));
    PW_RETURN_IF_ERROR(CheckNullOrAbsent(root, "normalizer"));
    PW_RETURN_IF_ERROR(LoadModel(root, t.get()));
    PW_RETURN_IF_ERROR(LoadPreTokenizer(root, t.get()));
    PW_RETURN_IF_ERROR(LoadDecoder(root));
    PW_RETURN_IF_ERROR(LoadPostProcessor(root));
    PW_RETURN_IF_ERROR(LoadAddedTokens(root, t.get()));
    return t;
  }

 private:
  static std::string TypeOf(const json& j) {
    auto it = j.find("type");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
    return "<no type>";
  }

  // Fields whose only supported value is null: anything else is kUnsupported with its type.
  Status CheckNullOrAbsent(const json& root, const char* field) const {
    auto it = root.find(field);
    if (it == root.end() || it->is_null()) return Status::Ok();
    if (it->is_object())
      return Unsupported(
          field, "unsupported " + std::string(field) + " type '" + TypeOf(*it) + "' (only null)");
    return Unsupported(field, "only null is supported");
  }

  Status GetBool(const json& obj, const std::string& path, const char* key, bool dflt,
                 bool* out) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      *out = dflt;
      return Status::Ok();
    }
    if (!it->is_boolean()) return Corrupt(path + "." + key, "expected a boolean");
    *out = it->get<bool>();
    return Status::Ok();
  }

  Status LoadModel(const json& root, Tokenizer* t) {
    auto mit = root.find("model");
    if (mit == root.end()) return Corrupt("model", "missing");
    if (!mit->is_object()) return Corrupt("model", "expected an object");
    const json& model = *mit;
    auto tit = model.find("type");
    if (tit != model.end()) {
      if (!tit->is_string()) return Corrupt("model.type", "expected a string");
      if (tit->get<std::string>() != "BPE") {
        return Unsupported("model.type",
                           "unsupported model type '" + tit->get<std::string>() + "' (only BPE)");
      }
    }
    // Options this implementation does not have.
    if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
      if (!it->is_number()) return Corrupt("model.dropout", "expected a number or null");
      if (it->get<double>() != 0.0) return Unsupported("model.dropout", "BPE dropout");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      auto it = model.find(key);
      if (it == model.end() || it->is_null()) continue;
      if (!it->is_string())
        return Corrupt(std::string("model.") + key, "expected a string or null");
      if (!it->get<std::string>().empty()) {
        return Unsupported(std::string("model.") + key, "non-empty value");
      }
    }
    bool byte_fallback;
    PW_RETURN_IF_ERROR(GetBool(model, "model", "byte_fallback", false, &byte_fallback));
    if (byte_fallback) return Unsupported("model.byte_fallback", "byte_fallback=true");
    PW_RETURN_IF_ERROR(GetBool(model, "model", "ignore_merges", false, &t->ignore_merges_));
    PW_RETURN_IF_ERROR(GetBool(model, "model", "fuse_unk", false, &t->fuse_unk_));

    // Vocabulary.
    auto vit = model.find("vocab");
    if (vit == model.end()) return Corrupt("model.vocab", "missing");
    if (!vit->is_object()) return Corrupt("model.vocab", "expected an object of token: id");
    if (vit->empty()) return Corrupt("model.vocab", "empty");
    int64_t max_id = -1;
    for (auto it = vit->begin(); it != vit->end(); ++it) {
      if (!it.value().is_number_integer()) {
        return Corrupt("model.vocab[\"" + it.key() + "\"]", "expected an integer id");
      }
      const int64_t id = it.value().get<int64_t>();
      if (id < 0 || id >= (int64_t{1} << 30)) {
        return Corrupt("model.vocab[\"" + it.key() + "\"]",
                       "id " + std::to_string(id) + " out of range [0, 2^30)");
      }
      max_id = std::max(max_id, id);
    }
    if (max_id >= static_cast<int64_t>(vit->size()) * 4 + 1024) {
      return Corrupt("model.vocab", "ids are sparse: largest id " + std::to_string(max_id) +
                                        " for " + std::to_string(vit->size()) + " tokens");
    }
    t->id_to_token_.assign(max_id + 1, std::string());
    t->id_flags_.assign(max_id + 1, 0);
    t->vocab_.reserve(vit->size());
    for (auto it = vit->begin(); it != vit->end(); ++it) {
      const int32_t id = static_cast<int32_t>(it.value().get<int64_t>());
      if (t->id_flags_[id] & 1) {
        return Corrupt(
            "model.vocab[\"" + it.key() + "\"]",
            "id " + std::to_string(id) + " also used by \"" + t->id_to_token_[id] + "\"");
      }
      t->id_flags_[id] |= 1;
      t->id_to_token_[id] = it.key();
      t->vocab_.emplace(it.key(), id);
    }

    // Single-byte tokens.
    const ByteLevelAlphabet& a = Alphabet();
    for (int b = 0; b < 256; ++b) {
      auto it = t->vocab_.find(a.byte_to_utf8[b]);
      t->byte_to_id_[b] = it == t->vocab_.end() ? -1 : it->second;
    }

    if (auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
      if (!it->is_string()) return Corrupt("model.unk_token", "expected a string or null");
      auto u = t->vocab_.find(it->get<std::string>());
      if (u == t->vocab_.end()) {
        return Corrupt("model.unk_token",
                       "\"" + it->get<std::string>() + "\" is not in model.vocab");
      }
      t->unk_id_ = u->second;
    }

    // Merges, in rank order.
    auto git = model.find("merges");
    if (git == model.end()) return Corrupt("model.merges", "missing");
    if (!git->is_array()) return Corrupt("model.merges", "expected an array");
    t->merges_.reserve(git->size() * 2);
    std::string left, right;
    for (size_t r = 0; r < git->size(); ++r) {
      const json& m = (*git)[r];
      const std::string field = "model.merges[" + std::to_string(r) + "]";
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          return Corrupt(field,
                         "expected \"left right\" with exactly one space, got \"" + s + "\"");
        }
        left = s.substr(0, sp);
        right = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return Corrupt(field, "expected a \"left right\" string or a [left, right] pair");
      }
      auto li = t->vocab_.find(left);
      auto ri = t->vocab_.find(right);
      auto mi = t->vocab_.find(left + right);
      if (li == t->vocab_.end() || ri == t->vocab_.end() || mi == t->vocab_.end()) {
        const std::string& missing = li == t->vocab_.end()   ? left
                                     : ri == t->vocab_.end() ? right
                                                             : left + right;
        return Corrupt(field, "token \"" + missing + "\" is not in model.vocab");
      }
      const uint64_t key = (static_cast<uint64_t>(li->second) << 32) | uint32_t(ri->second);
      // A pair listed twice keeps its last rank (HF builds a map from the list).
      t->merges_[key] = {static_cast<int32_t>(r), mi->second};
      t->rank_to_new_id_.push_back(mi->second);
    }
    return Status::Ok();
  }

  Status ParseByteLevel(const json& pt, const std::string& path, Tokenizer::PreTokStage* st) {
    st->is_byte_level = true;
    PW_RETURN_IF_ERROR(GetBool(pt, path, "add_prefix_space", true, &st->add_prefix_space));
    PW_RETURN_IF_ERROR(GetBool(pt, path, "use_regex", true, &st->use_regex));
    return Status::Ok();
  }

  Status ParseSplit(const json& pt, const std::string& path, Tokenizer::PreTokStage* st) {
    auto pit = pt.find("pattern");
    if (pit == pt.end() || !pit->is_object()) {
      return Corrupt(path + ".pattern", "expected an object {\"Regex\": ...}");
    }
    auto rit = pit->find("Regex");
    if (rit == pit->end() || !rit->is_string()) {
      return Unsupported(path + ".pattern", "only Regex patterns are supported");
    }
    const std::string& re = rit->get_ref<const std::string&>();
    if (re == kGpt2Pattern) {
      st->pattern = Tokenizer::SplitPattern::kGpt2;
    } else if (re == kQwen2Pattern) {
      st->pattern = Tokenizer::SplitPattern::kQwen2;
    } else if (re == kLlama3Pattern) {
      st->pattern = Tokenizer::SplitPattern::kLlama3;
    } else {
      return Unsupported(path + ".pattern.Regex",
                         "unsupported split pattern \"" + re +
                             "\" (supported: the GPT-2, Qwen2 and Llama-3 patterns)");
    }
    auto bit = pt.find("behavior");
    if (bit == pt.end() || !bit->is_string())
      return Corrupt(path + ".behavior", "expected a string");
    if (bit->get<std::string>() != "Isolated") {
      return Unsupported(path + ".behavior", "unsupported split behavior '" +
                                                 bit->get<std::string>() + "' (only Isolated)");
    }
    bool invert;
    PW_RETURN_IF_ERROR(GetBool(pt, path, "invert", false, &invert));
    if (invert) return Unsupported(path + ".invert", "invert=true");
    return Status::Ok();
  }

  Status LoadPreTokenizer(const json& root, Tokenizer* t) {
    auto it = root.find("pre_tokenizer");
    if (it == root.end() || it->is_null()) {
      return Unsupported("pre_tokenizer", "null (a ByteLevel pre-tokenizer is required)");
    }
    if (!it->is_object()) return Corrupt("pre_tokenizer", "expected an object");
    const std::string type = TypeOf(*it);
    if (type == "ByteLevel") {
      Tokenizer::PreTokStage st;
      PW_RETURN_IF_ERROR(ParseByteLevel(*it, "pre_tokenizer", &st));
      t->stages_.push_back(st);
      return Status::Ok();
    }
    if (type != "Sequence") {
      return Unsupported("pre_tokenizer.type",
                         "unsupported pre_tokenizer type '" + type +
                             "' (ByteLevel, or Sequence of Split and ByteLevel)");
    }
    auto sit = it->find("pretokenizers");
    if (sit == it->end() || !sit->is_array()) {
      return Corrupt("pre_tokenizer.pretokenizers", "expected an array");
    }
    for (size_t i = 0; i < sit->size(); ++i) {
      const json& p = (*sit)[i];
      const std::string path = "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]";
      if (!p.is_object()) return Corrupt(path, "expected an object");
      const std::string ptype = TypeOf(p);
      Tokenizer::PreTokStage st;
      if (!t->stages_.empty() && t->stages_.back().is_byte_level) {
        return Unsupported(path, "a pre-tokenizer after ByteLevel");
      }
      if (ptype == "ByteLevel") {
        PW_RETURN_IF_ERROR(ParseByteLevel(p, path, &st));
      } else if (ptype == "Split") {
        PW_RETURN_IF_ERROR(ParseSplit(p, path, &st));
      } else {
        return Unsupported(path + ".type", "unsupported pre_tokenizer type '" + ptype + "'");
      }
      t->stages_.push_back(st);
    }
    if (t->stages_.empty() || !t->stages_.back().is_byte_level) {
      return Unsupported("pre_tokenizer.pretokenizers", "the sequence must end with ByteLevel");
    }
    return Status::Ok();
  }

  Status LoadDecoder(const json& root) {
    auto it = root.find("decoder");
    if (it == root.end() || it->is_null()) {
      return Unsupported("decoder", "null (a ByteLevel decoder is required)");
    }
    if (!it->is_object()) return Corrupt("decoder", "expected an object");
    if (TypeOf(*it) != "ByteLevel") {
      return Unsupported("decoder.type",
                         "unsupported decoder type '" + TypeOf(*it) + "' (only ByteLevel)");
    }
    return Status::Ok();
  }

  Status LoadPostProcessor(const json& root) {
    auto it = root.find("post_processor");
    if (it == root.end() || it->is_null()) return Status::Ok();
    if (!it->is_object()) return Corrupt("post_processor", "expected an object");
    if (TypeOf(*it) != "ByteLevel") {
      return Unsupported("post_processor.type", "unsupported post_processor type '" + TypeOf(*it) +
                                                    "' (only null or ByteLevel)");
    }
    return Status::Ok();
  }

  Status LoadAddedTokens(const json& root, Tokenizer* t) {
    auto it = root.find("added_tokens");
    if (it == root.end() || it->is_null()) return Status::Ok();
    if (!it->is_array()) return Corrupt("added_tokens", "expected an array");
    if (it->size() > (1u << 20)) return Corrupt("added_tokens", "more than 2^20 entries");
    int32_t max_added = -1;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& a = (*it)[i];
      const std::string path = "added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object()) return Corrupt(path, "expected an object");
      AddedToken tok;
      auto idit = a.find("id");
      if (idit == a.end() || !idit->is_number_integer()) {
        return Corrupt(path + ".id", "expected an integer");
      }
      if (idit->get<int64_t>() < 0) return Corrupt(path + ".id", "negative id");
      auto cit = a.find("content");
      if (cit == a.end() || !cit->is_string())
        return Corrupt(path + ".content", "expected a string");
      tok.content = cit->get<std::string>();
      if (tok.content.empty()) return Corrupt(path + ".content", "empty");
      if (auto bad = utf8::FindInvalid(tok.content)) {
        return Corrupt(path + ".content", "invalid UTF-8 at byte " + std::to_string(*bad));
      }
      PW_RETURN_IF_ERROR(GetBool(a, path, "special", false, &tok.special));
      PW_RETURN_IF_ERROR(GetBool(a, path, "lstrip", false, &tok.lstrip));
      PW_RETURN_IF_ERROR(GetBool(a, path, "rstrip", false, &tok.rstrip));
      PW_RETURN_IF_ERROR(GetBool(a, path, "single_word", false, &tok.single_word));
      PW_RETURN_IF_ERROR(GetBool(a, path, "normalized", !tok.special, &tok.normalized));
      if (t->added_to_id_.count(tok.content)) {
        return Corrupt(path + ".content", "\"" + tok.content + "\" listed twice");
      }
      // The id is derived as HF derives it (the "id" field is only checked for shape): the
      // model's id when the vocabulary has the content, otherwise the next free id after the
      // model vocabulary and the added tokens so far.
      if (auto v = t->vocab_.find(tok.content); v != t->vocab_.end()) {
        tok.id = v->second;
      } else {
        const int32_t model_size = static_cast<int32_t>(t->vocab_.size());
        tok.id = model_size;
        if (max_added >= model_size) tok.id = max_added + 1;
      }
      max_added = std::max(max_added, tok.id);
      t->added_to_id_.emplace(tok.content, tok.id);
      t->added_.push_back(std::move(tok));
    }
    // Matching tables: per pass, per first byte, longest content first.
    for (int pass = 0; pass < 2; ++pass) t->added_by_first_byte_[pass].assign(256, {});
    for (size_t i = 0; i < t->added_.size(); ++i) {
      const AddedToken& a = t->added_[i];
      const int pass = a.normalized ? 1 : 0;
      t->added_by_first_byte_[pass][static_cast<uint8_t>(a.content[0])].push_back(
          static_cast<int32_t>(i));
    }
    for (int pass = 0; pass < 2; ++pass) {
      for (auto& list : t->added_by_first_byte_[pass]) {
        std::stable_sort(list.begin(), list.end(), [t](int32_t x, int32_t y) {
          return t->added_[x].content.size() > t->added_[y].content.size();
        });
      }
    }
    // Ids: added tokens take precedence over model tokens with the same id.
    for (const AddedToken& a : t->added_) {
      if (a.id >= static_cast<int32_t>(t->id_to_token_.size())) {
        t->id_to_token_.resize(a.id + 1);
        t->id_flags_.resize(a.id + 1, 0);
      }
      t->id_to_token_[a.id] = a.content;
      t->id_flags_[a.id] = 1 | (a.special ? 2 : 0);
    }
    return Status::Ok();
  }

  std::string src_;
};

Tokenizer::Tokenizer() { std::fill(std::begin(byte_to_id_), std::end(byte_to_id_), -1); }
Tokenizer::~Tokenizer() = default;

namespace {

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError(path + ": read failed");
  return ss.str();
}

Result<json> ParseJson(std::string_view text, const std::string& source) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return Corrupt(source + ": not valid JSON: " + e.what());
  }
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromJsonText(std::string_view json_text,
                                                           const std::string& source_name) {
  PW_ASSIGN_OR_RETURN(json root, ParseJson(json_text, source_name));
  try {
    TokenizerLoader loader(source_name);
    auto t = loader.Load(root);
    if (t.ok()) {
      // Each model token's bytes under the ByteLevel decoder.
      Tokenizer& tok = **t;
      tok.id_to_bytes_.resize(tok.id_to_token_.size());
      for (size_t id = 0; id < tok.id_to_token_.size(); ++id) {
        if (!(tok.id_flags_[id] & 1)) continue;
        tok.id_to_bytes_[id] = TokenStringToBytes(tok.id_to_token_[id]);
      }
    }
    return t;
  } catch (const std::exception& e) {  // a shape check missed above: still an error, not a crash
    return Corrupt(source_name + ": " + e.what());
  }
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  PW_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  return FromJsonText(text, path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromModelDir(const std::string& dir) {
  PW_ASSIGN_OR_RETURN(auto tok, FromFile(dir + "/tokenizer.json"));
  const std::string cfg_path = dir + "/tokenizer_config.json";
  std::ifstream probe(cfg_path);
  if (!probe) return tok;  // optional
  probe.close();
  PW_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(cfg_path));
  PW_ASSIGN_OR_RETURN(json cfg, ParseJson(text, cfg_path));
  if (!cfg.is_object()) return Corrupt(cfg_path + ": expected a JSON object");
  // A special token is written as a string or as {"content": ..., ...}.
  auto token_field = [&](const char* key, std::string* out, std::optional<int32_t>* id) -> Status {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return Status::Ok();
    const json* v = &*it;
    if (v->is_object()) {
      auto c = v->find("content");
      if (c == v->end()) return Corrupt(cfg_path + ": field '" + key + ".content': missing");
      v = &*c;
    }
    if (!v->is_string()) return Corrupt(cfg_path + ": field '" + key + "': expected a string");
    *out = v->get<std::string>();
    *id = tok->TokenToId(*out);
    if (!*id) {
      return Corrupt(cfg_path + ": field '" + key + "': token \"" + *out +
                     "\" is not in the vocabulary of " + dir + "/tokenizer.json");
    }
    return Status::Ok();
  };
  PW_RETURN_IF_ERROR(token_field("bos_token", &tok->bos_token_, &tok->bos_token_id_));
  PW_RETURN_IF_ERROR(token_field("eos_token", &tok->eos_token_, &tok->eos_token_id_));
  if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
    if (it->is_string()) {
      tok->chat_template_ = it->get<std::string>();
    } else if (it->is_array()) {
      for (size_t i = 0; i < it->size(); ++i) {
        const json& e = (*it)[i];
        auto n = e.is_object() ? e.find("name") : e.end();
        auto tpl = e.is_object() ? e.find("template") : e.end();
        if (!e.is_object() || n == e.end() || !n->is_string() || tpl == e.end() ||
            !tpl->is_string()) {
          return Corrupt(cfg_path + ": field 'chat_template[" + std::to_string(i) +
                         "]': expected {\"name\": string, \"template\": string}");
        }
        if (n->get<std::string>() == "default") tok->chat_template_ = tpl->get<std::string>();
      }
    } else {
      return Corrupt(cfg_path + ": field 'chat_template': expected a string or a list");
    }
  }
  return tok;
}

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------

namespace {

// A piece of input after added-token splitting: an added token (index into added_) or text.
struct Segment {
  int32_t added_index;  // -1 for text
  std::string_view text;
};

// Length of the UTF-8 sequence a lead byte starts (the text is valid UTF-8).
size_t SeqLen(uint8_t b) { return b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1; }

// Code point starting at byte i of valid UTF-8 text.
char32_t CodepointAt(std::string_view s, size_t i) {
  const uint8_t b = static_cast<uint8_t>(s[i]);
  const size_t len = SeqLen(b);
  char32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < len && i + k < s.size(); ++k) {
    cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  }
  return cp;
}

// Code point that ends at byte `end` (exclusive) of valid UTF-8 text; end > 0.
char32_t CodepointBefore(std::string_view s, size_t end, size_t* start) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  *start = i;
  return CodepointAt(s, i);
}

}  // namespace

void Tokenizer::EncodeSegment(std::string_view segment, std::vector<int32_t>* ids) const {
  std::vector<std::string_view> pieces{segment}, next;
  std::deque<std::string> storage;  // pieces that got a prefix space
  std::vector<char32_t> cps;
  std::vector<uint32_t> offs;
  auto split = [&](SplitPattern pattern, std::string_view p) {
    DecodeCodepoints(p, &cps, &offs);
    ClassView v(cps);
    size_t i = 0;
    while (i < cps.size()) {
      size_t m = 0;
      switch (pattern) {
        case SplitPattern::kGpt2:
          m = MatchGpt2(v, i);
          break;
        case SplitPattern::kQwen2:
          m = MatchQwen2(v, i, 1);
          break;
        case SplitPattern::kLlama3:
          m = MatchQwen2(v, i, 3);
          break;
      }
      PW_CHECK(m > 0);  // the patterns match at every position
      next.push_back(p.substr(offs[i], offs[i + m] - offs[i]));
      i += m;
    }
  };
  for (const PreTokStage& st : stages_) {
    next.clear();
    for (std::string_view p : pieces) {
      if (p.empty()) continue;
      if (st.is_byte_level) {
        if (st.add_prefix_space && p[0] != ' ') {
          std::string& prefixed = storage.emplace_back();
          prefixed.reserve(p.size() + 1);
          prefixed.push_back(' ');
          prefixed.append(p);
          p = prefixed;
        }
        if (st.use_regex) {
          split(SplitPattern::kGpt2, p);
        } else {
          next.push_back(p);
        }
      } else {
        split(st.pattern, p);
      }
    }
    pieces.swap(next);
  }
  for (std::string_view w : pieces) EncodeWord(w, ids);
}

void Tokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    std::string mapped;
    const ByteLevelAlphabet& a = Alphabet();
    for (char c : word) mapped += a.byte_to_utf8[static_cast<uint8_t>(c)];
    auto it = vocab_.find(mapped);
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = ids->size();
  MergeWord(word, ids);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::vector<int32_t>(ids->begin() + before, ids->end()));
  }
}

void Tokenizer::MergeWord(std::string_view word, std::vector<int32_t>* ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  bool last_was_unk = false;
  for (char c : word) {
    const int32_t id = byte_to_id_[static_cast<uint8_t>(c)];
    if (id >= 0) {
      syms.push_back({id, 0, 0, true});
      last_was_unk = false;
    } else if (unk_id_) {  // a byte with no token: unk (fused with a preceding unk if asked)
      if (!(fuse_unk_ && last_was_unk)) syms.push_back({*unk_id_, 0, 0, true});
      last_was_unk = true;
    }  // else dropped, as HF does without an unk token
  }
  const int32_t n = static_cast<int32_t>(syms.size());
  for (int32_t i = 0; i < n; ++i) {
    syms[i].prev = i - 1;
    syms[i].next = i + 1 < n ? i + 1 : -1;
  }
  // Candidate merges ordered by (rank, position), smallest first, as HF orders them; one
  // entry is the key rank << 32 | position (a rank names its merge, so also the merged id).
  auto lookup = [this](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
    auto it = merges_.find((static_cast<uint64_t>(a) << 32) | uint32_t(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  auto key = [](int32_t rank, int32_t pos) {
    return (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(pos);
  };
  std::vector<uint64_t> heap;
  heap.reserve(n);
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (auto m = lookup(syms[i].id, syms[i + 1].id)) heap.push_back(key(m->first, i));
  }
  std::greater<uint64_t> later;  // min-heap
  std::make_heap(heap.begin(), heap.end(), later);
  auto push = [&](int32_t rank, int32_t pos) {
    heap.push_back(key(rank, pos));
    std::push_heap(heap.begin(), heap.end(), later);
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const uint64_t top = heap.back();
    heap.pop_back();
    const int32_t pos = static_cast<int32_t>(top & 0xFFFFFFFFu);
    const int32_t new_id = rank_to_new_id_[top >> 32];
    Symbol& cur = syms[pos];
    if (!cur.alive || cur.next < 0) continue;
    const int32_t right_pos = cur.next;
    // A stale entry: the pair at this position changed since it was queued (compared by the
    // merged id, as HF compares).
    auto m = lookup(cur.id, syms[right_pos].id);
    if (m == nullptr || m->second != new_id) continue;
    cur.id = new_id;
    syms[right_pos].alive = false;
    cur.next = syms[right_pos].next;
    if (cur.next >= 0) syms[cur.next].prev = pos;
    if (cur.prev >= 0) {
      if (auto pm = lookup(syms[cur.prev].id, cur.id)) push(pm->first, cur.prev);
    }
    if (cur.next >= 0) {
      if (auto nm = lookup(cur.id, syms[cur.next].id)) push(nm->first, pos);
    }
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = syms[i].next) ids->push_back(syms[i].id);
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  if (auto bad = utf8::FindInvalid(text)) {
    return InvalidArgument("invalid UTF-8 in input at byte offset " + std::to_string(*bad));
  }
  // Split off added tokens: pass 0 (normalized=false) over the input, then pass 1
  // (normalized=true) over the remaining text, as HF's AddedVocabulary does.
  std::vector<Segment> segs{{-1, text}}, next;
  for (int pass = 0; pass < 2; ++pass) {
    if (added_by_first_byte_[pass].empty()) continue;
    const auto& by_first = added_by_first_byte_[pass];
    next.clear();
    for (const Segment& seg : segs) {
      if (seg.added_index >= 0 || seg.text.empty()) {
        next.push_back(seg);
        continue;
      }
      const std::string_view s = seg.text;
      size_t start_offset = 0;  // end of the last emitted piece
      size_t pos = 0;           // where the search for the next match resumes
      while (pos < s.size()) {
        // Leftmost-longest match at or after pos.
        int32_t found = -1;
        size_t mstart = pos;
        for (; mstart < s.size() && found < 0; ++mstart) {
          for (int32_t idx : by_first[static_cast<uint8_t>(s[mstart])]) {
            const std::string& c = added_[idx].content;
            if (s.compare(mstart, c.size(), c) == 0) {
              found = idx;
              break;
            }
          }
          if (found >= 0) break;
        }
        if (found < 0) break;
        const AddedToken& tok = added_[found];
        size_t start = mstart;
        size_t stop = mstart + tok.content.size();
        pos = stop;
        if (tok.single_word) {
          size_t unused;
          const bool start_ok =
              start == 0 || !unicode::IsWordChar(CodepointBefore(s, start, &unused));
          const bool stop_ok = stop == s.size() || !unicode::IsWordChar(CodepointAt(s, stop));
          if (!start_ok || !stop_ok) continue;
        }
        if (tok.lstrip) {
          size_t b = start;
          while (b > 0) {
            size_t k;
            if (!unicode::IsWhiteSpace(CodepointBefore(s, b, &k))) break;
            b = k;
          }
          start = std::max(b, start_offset);
        }
        if (tok.rstrip) {
          while (stop < s.size() && unicode::IsWhiteSpace(CodepointAt(s, stop))) {
            stop += SeqLen(static_cast<uint8_t>(s[stop]));
          }
        }
        start = std::max(start, start_offset);
        if (start_offset < start)
          next.push_back({-1, s.substr(start_offset, start - start_offset)});
        next.push_back({found, s.substr(start, stop - start)});
        start_offset = stop;
      }
      if (start_offset < s.size()) next.push_back({-1, s.substr(start_offset)});
    }
    segs.swap(next);
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const Segment& seg : segs) {
    if (seg.added_index >= 0) {
      ids.push_back(added_[seg.added_index].id);
    } else {
      EncodeSegment(seg.text, &ids);
    }
  }
  return ids;
}

// ---------------------------------------------------------------------------------------------
// Decoding and lookup
// ---------------------------------------------------------------------------------------------

Result<std::string_view> Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= VocabSize() || !(id_flags_[id] & 1)) {
    return OutOfRange("token id " + std::to_string(id) + " is not in the vocabulary (size " +
                      std::to_string(VocabSize()) + ")");
  }
  return std::string_view(id_to_bytes_[id]);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < VocabSize() && (id_flags_[id] & 2);
}

Result<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                      bool skip_special_tokens) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto b = TokenBytes(ids[i]);
    if (!b.ok()) return b.status().WithContext("decode: position " + std::to_string(i));
    if (skip_special_tokens && IsSpecial(ids[i])) continue;
    bytes.append(*b);
  }
  std::string out;
  out.reserve(bytes.size());
  utf8::AppendLossy(bytes, /*final=*/true, &out);
  return out;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  const std::string key(token);
  if (auto it = added_to_id_.find(key); it != added_to_id_.end()) return it->second;
  if (auto it = vocab_.find(key); it != vocab_.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= VocabSize() || !(id_flags_[id] & 1)) return std::nullopt;
  return id_to_token_[id];
}

Result<std::string> IncrementalDecoder::Push(int32_t id) {
  PW_ASSIGN_OR_RETURN(std::string_view bytes, tokenizer_.TokenBytes(id));
  std::string out;
  if (skip_special_ && tokenizer_.IsSpecial(id)) return out;
  pending_.append(bytes);
  const size_t used = utf8::AppendLossy(pending_, /*final=*/false, &out);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDecoder::Finish() {
  std::string out;
  utf8::AppendLossy(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

}  // namespace pw
