// libFuzzer target: loading tokenizer.json text. Malformed input must come back as a status,
// never a crash, hang or exception; a tokenizer that loads must encode a fixed probe string.
#include <string_view>

#include "common/text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto tok = pw::Tokenizer::FromJsonText(text, "fuzz-tokenizer.json");
  if (!tok.ok()) return 0;
  auto ids = (*tok)->Encode("Hello, world! 123 \xc3\xa9t\xc3\xa9");
  if (ids.ok()) {
    for (int32_t id : *ids) PW_CHECK(id >= 0 && id < (*tok)->VocabSize());
  }
  return 0;
}
