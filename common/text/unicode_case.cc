#include "common/text/unicode_case.h"

#include <algorithm>
#include <vector>

namespace pw::unicode {

namespace {

constexpr char32_t kInvalid = 0xFFFFFFFF;  // a byte that starts no valid UTF-8 sequence

// One code point of `s` at `i` (advancing i), or kInvalid for a bad byte (i advances by one).
char32_t Next(std::string_view s, size_t* i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(*i);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || *i + n > s.size()) {
    ++*i;
    return n == 1 ? c : kInvalid;
  }
  char32_t cp = n == 1 ? c : c & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    if ((b(*i + k) & 0xC0) != 0x80) {
      ++*i;
      return kInvalid;
    }
    cp = (cp << 6) | (b(*i + k) & 0x3F);
  }
  static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++*i;
    return kInvalid;
  }
  *i += n;
  return cp;
}

// Code points of `s`, with the bytes of the invalid ones to copy back unchanged.
struct Decoded {
  std::vector<char32_t> cps;
  std::vector<unsigned char> raw;  // the byte of each kInvalid entry, in order
};

Decoded Decode(std::string_view s) {
  Decoded d;
  d.cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const char32_t cp = Next(s, &i);
    d.cps.push_back(cp);
    if (cp == kInvalid) d.raw.push_back(static_cast<unsigned char>(s[at]));
  }
  return d;
}

void Append(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool InRanges(const CodepointRange* r, size_t n, char32_t cp) {
  const CodepointRange* end = r + n;
  const CodepointRange* it =
      std::upper_bound(r, end, cp, [](char32_t c, const CodepointRange& x) { return c < x.first; });
  return it != r && cp <= (it - 1)->last;
}

// Appends the mapping of cp in `m` (cp itself when it has none).
void AppendMapped(std::string* out, const CaseMapping* m, size_t n, char32_t cp) {
  const CaseMapping* end = m + n;
  const CaseMapping* it =
      std::lower_bound(m, end, cp, [](const CaseMapping& x, char32_t c) { return x.cp < c; });
  if (it == end || it->cp != cp) return Append(out, cp);
  for (char32_t t : it->to) {
    if (t != 0) Append(out, t);
  }
}

bool Cased(char32_t cp) { return cp != kInvalid && InRanges(kCasedRanges, kCasedRangesSize, cp); }
bool Ignorable(char32_t cp) {
  return cp != kInvalid && InRanges(kCaseIgnorableRanges, kCaseIgnorableRangesSize, cp);
}

// Python's lower_ucs4: U+03A3 becomes final sigma U+03C2 after a cased code point (case-ignorable
// ones skipped) and not before one, else U+03C3.
char32_t LowerSigma(const std::vector<char32_t>& cps, size_t i) {
  size_t j = i;
  while (j > 0 && Ignorable(cps[j - 1])) --j;
  bool final_sigma = j > 0 && Cased(cps[j - 1]);
  if (final_sigma) {
    size_t k = i + 1;
    while (k < cps.size() && Ignorable(cps[k])) ++k;
    final_sigma = k == cps.size() || !Cased(cps[k]);
  }
  return final_sigma ? 0x03C2 : 0x03C3;
}

// Writes each code point through `f(out, cps, i)`, invalid bytes copied as they were.
template <typename F>
std::string Map(std::string_view s, F f) {
  const Decoded d = Decode(s);
  std::string out;
  out.reserve(s.size());
  size_t raw = 0;
  for (size_t i = 0; i < d.cps.size(); ++i) {
    if (d.cps[i] == kInvalid) {
      out += static_cast<char>(d.raw[raw++]);
    } else {
      f(&out, d.cps, i);
    }
  }
  return out;
}

void LowerAt(std::string* out, const std::vector<char32_t>& cps, size_t i) {
  if (cps[i] == 0x03A3) return Append(out, LowerSigma(cps, i));
  AppendMapped(out, kLowerMap, kLowerMapSize, cps[i]);
}

}  // namespace

std::string PyUpper(std::string_view s) {
  return Map(s, [](std::string* out, const std::vector<char32_t>& cps, size_t i) {
    AppendMapped(out, kUpperMap, kUpperMapSize, cps[i]);
  });
}

std::string PyLower(std::string_view s) { return Map(s, LowerAt); }

std::string PyTitle(std::string_view s) {
  bool previous_is_cased = false;
  return Map(s, [&](std::string* out, const std::vector<char32_t>& cps, size_t i) {
    if (previous_is_cased) {
      LowerAt(out, cps, i);
    } else {
      AppendMapped(out, kTitleMap, kTitleMapSize, cps[i]);
    }
    previous_is_cased = Cased(cps[i]);
  });
}

std::string PyCapitalize(std::string_view s) {
  return Map(s, [](std::string* out, const std::vector<char32_t>& cps, size_t i) {
    if (i == 0) return AppendMapped(out, kTitleMap, kTitleMapSize, cps[i]);
    LowerAt(out, cps, i);
  });
}

bool PyIsLower(std::string_view s) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = Next(s, &i);
    if (cp == kInvalid) continue;
    if (InRanges(kUppercaseRanges, kUppercaseRangesSize, cp) ||
        InRanges(kTitlecaseRanges, kTitlecaseRangesSize, cp)) {
      return false;
    }
    cased |= InRanges(kLowercaseRanges, kLowercaseRangesSize, cp);
  }
  return cased;
}

bool PyIsUpper(std::string_view s) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = Next(s, &i);
    if (cp == kInvalid) continue;
    if (InRanges(kLowercaseRanges, kLowercaseRangesSize, cp) ||
        InRanges(kTitlecaseRanges, kTitlecaseRangesSize, cp)) {
      return false;
    }
    cased |= InRanges(kUppercaseRanges, kUppercaseRangesSize, cp);
  }
  return cased;
}

}  // namespace pw::unicode
