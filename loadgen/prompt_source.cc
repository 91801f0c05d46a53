#include "loadgen/prompt_source.h"

#include <fstream>
#include <random>
#include <sstream>

namespace pw::loadgen {

Result<PromptSource> PromptSource::RandomIds(int32_t min_id, int32_t max_id, uint64_t seed,
                                             std::shared_ptr<const Tokenizer> tokenizer) {
  if (min_id < 0 || max_id <= min_id) {
    return InvalidArgument("token ids must satisfy 0 <= min < max (got " + std::to_string(min_id) +
                           ", " + std::to_string(max_id) + ")");
  }
  if (tokenizer && max_id > tokenizer->VocabSize()) {
    return InvalidArgument("token id range ends at " + std::to_string(max_id) +
                           ", beyond the tokenizer's vocabulary of " +
                           std::to_string(tokenizer->VocabSize()));
  }
  PromptSource p;
  p.min_id_ = min_id;
  p.max_id_ = max_id;
  p.seed_ = seed;
  p.tokenizer_ = std::move(tokenizer);
  return p;
}

Result<PromptSource> PromptSource::FromTextFile(const std::string& path,
                                                std::shared_ptr<const Tokenizer> tokenizer,
                                                uint64_t seed) {
  if (!tokenizer)
    return InvalidArgument("--dataset-path needs the model's tokenizer (--tokenizer DIR)");
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("cannot open the prompt text '" + path + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  auto ids = tokenizer->Encode(ss.str());
  if (!ids.ok()) return ids.status().WithContext(path);
  if (ids->size() < 16) return InvalidArgument(path + ": under 16 tokens of text");
  PromptSource p;
  p.seed_ = seed;
  p.corpus_ = std::move(*ids);
  p.tokenizer_ = std::move(tokenizer);
  return p;
}

std::vector<int32_t> PromptSource::Tokens(int32_t n, uint64_t index) const {
  std::mt19937_64 rng(seed_ * 0x100000001b3ULL + index * 0x9e3779b97f4a7c15ULL + 1);
  std::vector<int32_t> out(static_cast<size_t>(std::max(1, n)));
  if (corpus_.empty()) {
    std::uniform_int_distribution<int32_t> id(min_id_, max_id_ - 1);
    for (auto& t : out) t = id(rng);
  } else {
    size_t pos = std::uniform_int_distribution<size_t>(0, corpus_.size() - 1)(rng);
    for (auto& t : out) {
      t = corpus_[pos];
      pos = (pos + 1) % corpus_.size();
    }
  }
  return out;
}

Result<std::string> PromptSource::Text(int32_t n, uint64_t index) const {
  if (!tokenizer_)
    return InvalidArgument("text prompts (chat) need the tokenizer (--tokenizer DIR)");
  const auto ids = Tokens(n, index);
  return tokenizer_->Decode(ids, /*skip_special_tokens=*/true);
}

}  // namespace pw::loadgen
