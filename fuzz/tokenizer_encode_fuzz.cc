// libFuzzer target: Tokenizer::Encode on arbitrary bytes with the embedded model's tokenizer
// (models/tiny-moe/tokenizer.json, or the file named by PW_FUZZ_TOKENIZER). Invalid UTF-8 must
// be refused with a status; valid input must give in-range ids whose decoding is the input
// (byte-level BPE loses nothing, apart from whitespace that lstrip/rstrip added tokens absorb).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "common/text/tokenizer.h"

namespace {

const pw::Tokenizer* Load() {
  static std::unique_ptr<pw::Tokenizer> tok = [] {
    const char* env = std::getenv("PW_FUZZ_TOKENIZER");
    std::string path = env ? env : PW_SOURCE_DIR "/models/tiny-moe/tokenizer.json";
    auto r = pw::Tokenizer::FromFile(path);
    if (!r.ok()) {
      std::fprintf(stderr, "tokenizer_encode_fuzz: %s\n", r.status().ToString().c_str());
      std::abort();
    }
    return std::move(r).value();
  }();
  return tok.get();
}

bool AnyStrippingAddedToken(const pw::Tokenizer& t) {
  for (const auto& a : t.added_tokens()) {
    if (a.lstrip || a.rstrip) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const pw::Tokenizer* tok = Load();
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto ids = tok->Encode(text);
  const bool valid = !pw::utf8::FindInvalid(text).has_value();
  if (!ids.ok()) {
    PW_CHECK_MSG(!valid, ids.status().ToString().c_str());
    return 0;
  }
  PW_CHECK(valid);
  for (int32_t id : *ids) PW_CHECK(id >= 0 && id < tok->VocabSize());
  auto back = tok->Decode(*ids);
  PW_CHECK(back.ok());
  static const bool stripping = AnyStrippingAddedToken(*tok);
  if (!stripping) PW_CHECK_MSG(*back == text, "decode(encode(text)) != text");
  return 0;
}
