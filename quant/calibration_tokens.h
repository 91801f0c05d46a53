// Calibration token ids for pw-quantize's passes over a model: reproducible random ids (for a
// checkpoint without a tokenizer), or a text file through the model's tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pw::anyprec {

struct CalibrationSource {
  int64_t random_tokens = 0;   // > 0: this many uniform random ids (the text is not read)
  uint64_t seed = 0;           // of the random ids
  std::string text_path;       // otherwise this text,
  std::string tokenizer_path;  // through this tokenizer ("": model_dir/tokenizer.json)
  std::string model_dir;
  int64_t max_tokens = 0;      // > 0: at most this many ids (the first ones)
};

// The source named by a pw-quantize subcommand's options (their calib_random_tokens,
// calib_seed, calib_path, tokenizer_path and model_dir fields); no token limit.
template <typename Options>
CalibrationSource CalibrationSourceOf(const Options& o) {
  CalibrationSource s;
  s.random_tokens = o.calib_random_tokens;
  s.seed = o.calib_seed;
  s.text_path = o.calib_path;
  s.tokenizer_path = o.tokenizer_path;
  s.model_dir = o.model_dir;
  return s;
}

// The ids, each checked against `vocab`. Random ids are uniform over [0, vocab), the same for
// the same seed on every platform, and a prefix of the ids of any larger count. Errors name
// the file: kNotFound for an unreadable text or tokenizer, kInvalidArgument for an id outside
// the vocabulary or fewer than 2 ids.
Result<std::vector<int32_t>> CalibrationTokens(const CalibrationSource& source, int vocab);

}  // namespace pw::anyprec
