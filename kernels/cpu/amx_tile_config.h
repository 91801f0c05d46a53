// The tile configuration an AMX kernel loads (LDTILECFG) before its first tile instruction.
// Plain data: AMX kernels, built with their own ISA flags, include it.
#pragma once

#include <cstdint>

namespace pw::cpu {

// Palette 1 tile configuration (64 bytes): per tile its rows and bytes per row.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace pw::cpu
