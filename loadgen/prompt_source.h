// PromptSource: prompts of an exact number of tokens, as token ids.
//
//   - random ids (vLLM's "random" dataset): ids drawn uniformly from [min_id, max_id);
//   - text: a text file encoded once by the model's tokenizer; a prompt is a window of the
//     requested length starting at a random token (wrapping around the end).
// Prompt i depends only on (seed, i), so runs with the same seed send the same prompts. The
// tokenizer, when given, also turns ids into text (for chat requests).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/text/tokenizer.h"

namespace pw::loadgen {

class PromptSource {
 public:
  // `tokenizer` may be null (then Text() is unavailable).
  static Result<PromptSource> RandomIds(int32_t min_id, int32_t max_id, uint64_t seed,
                                        std::shared_ptr<const Tokenizer> tokenizer);
  static Result<PromptSource> FromTextFile(const std::string& path,
                                           std::shared_ptr<const Tokenizer> tokenizer,
                                           uint64_t seed);

  // The `n` prompt tokens of request `index`.
  std::vector<int32_t> Tokens(int32_t n, uint64_t index) const;
  // The same prompt as text (needs the tokenizer).
  Result<std::string> Text(int32_t n, uint64_t index) const;
  bool has_tokenizer() const { return tokenizer_ != nullptr; }

 private:
  int32_t min_id_ = 0, max_id_ = 0;
  uint64_t seed_ = 0;
  std::vector<int32_t> corpus_;  // text mode: the file's tokens
  std::shared_ptr<const Tokenizer> tokenizer_;
};

}  // namespace pw::loadgen
