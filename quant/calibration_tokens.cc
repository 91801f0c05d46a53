#include "quant/calibration_tokens.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "common/calibration_text.h"
#include "common/text/tokenizer.h"

namespace pw::anyprec {
namespace {

Result<std::string> ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound(path + ": cannot read calibration text");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// n ids uniform over [0, vocab) from a 64-bit xorshift* generator: the same ids for the same
// seed on every platform (std:: distributions are not specified bit for bit).
std::vector<int32_t> RandomTokens(int64_t n, int vocab, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  if (s == 0) s = 1;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    const uint64_t r = s * 0x2545F4914F6CDD1Dull;
    id = static_cast<int32_t>((r >> 32) % static_cast<uint64_t>(vocab));
  }
  return ids;
}

std::string TokenizerPath(const CalibrationSource& src) {
  return src.tokenizer_path.empty() ? src.model_dir + "/tokenizer.json" : src.tokenizer_path;
}

}  // namespace

CalibrationSource ResolveDefaultCalibration(CalibrationSource src) {
  if (src.random_tokens > 0 || src.bundled_text || !src.text_path.empty()) return src;
  std::error_code ec;
  if (std::filesystem::exists(TokenizerPath(src), ec)) {
    src.bundled_text = true;
  } else {
    src.random_tokens = kDefaultRandomCalibrationTokens;
  }
  return src;
}

std::string DescribeCalibration(const CalibrationSource& src) {
  if (src.random_tokens > 0) {
    return std::to_string(src.random_tokens) + " random ids, seed " + std::to_string(src.seed);
  }
  if (src.bundled_text) {
    char hash[17];
    std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(BundledCalibrationTextHash()));
    return std::string("bundled text ") + hash + " (" + std::to_string(BundledCalibrationText().size()) +
           " bytes) through " + TokenizerPath(src);
  }
  std::error_code ec;
  const auto size = std::filesystem::file_size(src.text_path, ec);
  return "text " + src.text_path + " (" + std::to_string(ec ? 0 : size) + " bytes) through " + TokenizerPath(src);
}

Result<std::vector<int32_t>> CalibrationTokens(const CalibrationSource& src, int vocab) {
  std::vector<int32_t> ids;
  if (src.random_tokens > 0) {
    const int64_t n =
        src.max_tokens > 0 ? std::min(src.random_tokens, src.max_tokens) : src.random_tokens;
    ids = RandomTokens(n, vocab, src.seed);
    if (ids.size() < 2) return InvalidArgument("random calibration tokens: fewer than 2 tokens");
    return ids;
  }
  const std::string tok_path = TokenizerPath(src);
  PW_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromFile(tok_path));
  std::string text;
  if (src.bundled_text) {
    text = std::string(BundledCalibrationText());
  } else {
    PW_ASSIGN_OR_RETURN(text, ReadText(src.text_path));
  }
  PW_ASSIGN_OR_RETURN(ids, tokenizer->Encode(text));
  if (src.max_tokens > 0 && static_cast<int64_t>(ids.size()) > src.max_tokens) {
    ids.resize(static_cast<size_t>(src.max_tokens));
  }
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      return InvalidArgument(tok_path + ": token id " + std::to_string(id) +
                             " outside the model's vocabulary");
    }
  }
  if (ids.size() < 2) {
    return InvalidArgument((src.bundled_text ? std::string("the bundled calibration text") : src.text_path) +
                           ": calibration text has fewer than 2 tokens");
  }
  return ids;
}

}  // namespace pw::anyprec
