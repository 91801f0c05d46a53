// Calibration token ids for pw-quantize's passes over a model: reproducible random ids (for a
// checkpoint without a tokenizer), a text file, or the bundled text (calibration_text.h)
// through the model's tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pw::anyprec {

struct CalibrationSource {
  int64_t random_tokens = 0;   // > 0: this many uniform random ids (the text is not read)
  uint64_t seed = 0;           // of the random ids
  bool bundled_text = false;   // otherwise the bundled text (text_path unused),
  std::string text_path;       // or this text,
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

// Random ids a checkpoint without a tokenizer is calibrated on when nothing is asked for: about
// the bundled text's length in tokens of a typical tokenizer.
inline constexpr int64_t kDefaultRandomCalibrationTokens = 4096;

// The source itself when it names random ids or a text; otherwise (the default) the bundled
// text when the tokenizer exists (tokenizer_path, else model_dir/tokenizer.json), else
// kDefaultRandomCalibrationTokens random ids with the source's seed.
CalibrationSource ResolveDefaultCalibration(CalibrationSource source);

// One line naming what the ids come from ("bundled text <hash> (<bytes> bytes) through
// <tokenizer>", "text <path> (<bytes> bytes) through <tokenizer>", "<n> random ids, seed <s>"):
// for build descriptions and messages.
std::string DescribeCalibration(const CalibrationSource& source);

// The ids, each checked against `vocab`. Random ids are uniform over [0, vocab), the same for
// the same seed on every platform, and a prefix of the ids of any larger count. Errors name
// the file: kNotFound for an unreadable text or tokenizer, kInvalidArgument for an id outside
// the vocabulary or fewer than 2 ids.
Result<std::vector<int32_t>> CalibrationTokens(const CalibrationSource& source, int vocab);

}  // namespace pw::anyprec
