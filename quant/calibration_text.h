// The calibration text that ships inside pw-quantize (quant/calibration/calibration.txt, its
// sources and licences in quant/calibration/README.md): what a store is calibrated on when no
// --calib or --calib-random-tokens is given and the checkpoint has a tokenizer. Compiled in,
// so a binary needs no data file beside it. A pure data library (common/ only): `pw serve`
// keys its store cache by the text's hash without linking the engine.
#pragma once

#include <cstdint>
#include <string_view>

namespace pw::anyprec {

// The text's bytes (UTF-8).
std::string_view BundledCalibrationText();
// FNV-1a 64 of those bytes: names the text in build descriptions and store cache keys.
uint64_t BundledCalibrationTextHash();

}  // namespace pw::anyprec
