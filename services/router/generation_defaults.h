// GenerationDefaults: the sampling defaults a checkpoint ships in generation_config.json, used
// for what a request leaves out (vLLM's --generation-config auto): temperature, top_p, top_k,
// and its end-of-sequence ids (eos_token_id, one id or a list), which stop generation in
// addition to the tokenizer's. A request's own temperature / top_p / top_k override them;
// `ignore_eos` drops every stop id. Other keys of the file (do_sample, bos/pad ids,
// max_new_tokens, repetition_penalty, ...) are not used, as in vLLM, which reads only its
// sampling keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pw::router {

struct GenerationDefaults {
  float temperature = 1.f;  // the OpenAI defaults when the file gives none
  float top_p = 1.f;
  int32_t top_k = 0;  // 0 = off
  std::vector<int32_t> eos_token_ids;
};

// Reads `model_dir`/generation_config.json; a directory without one gives the defaults above.
// A key present with a wrong type or out of range (temperature [0, 2], top_p (0, 1], top_k >= 0,
// ids in [0, vocab_size)) is an error naming the file and the key, never a silent default.
Result<GenerationDefaults> LoadGenerationDefaults(const std::string& model_dir,
                                                  int64_t vocab_size);
// Same, from the file's text; `label` names it in messages.
Result<GenerationDefaults> ParseGenerationDefaults(const std::string& json_text,
                                                   const std::string& label, int64_t vocab_size);

}  // namespace pw::router
