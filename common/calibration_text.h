// The calibration text that ships inside the binaries (common/calibration/calibration.txt, its
// sources and licences in common/calibration/README.md): what pw-quantize calibrates a store
// on when no --calib or --calib-random-tokens is given and the checkpoint has a tokenizer
// (quant/calibration_tokens.h). Compiled in, so a binary needs no data file beside it; in
// common/ so that `pw serve` keys its store cache by the text's hash without quant/.
#pragma once

#include <cstdint>
#include <string_view>

namespace pw {

// The text's bytes (UTF-8).
std::string_view BundledCalibrationText();
// FNV-1a 64 of those bytes: names the text in build descriptions and store cache keys.
uint64_t BundledCalibrationTextHash();

}  // namespace pw
