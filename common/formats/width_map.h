// The width of every expert block: 3..8 bits (that many of the store's bit-planes), or 16 (the
// checkpoint's bf16 block). Read and written as a JSON/YAML file (docs/formats.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/expert_block.h"
#include "common/formats/apw_store.h"
#include "common/status.h"

namespace pw::anyprec {

inline constexpr int kBf16Bits = 16;  // width-map value selecting the checkpoint's bf16 block

// Whether `bits` is a width a map may hold: 3..8 or 16.
constexpr bool ValidWidth(int bits) {
  return (bits >= kMinBits && bits <= kMaxBits) || bits == kBf16Bits;
}

// Per-block widths: [layer][expert][proj] with proj 0 = gate_up, 1 = down.
class WidthMap {
 public:
  WidthMap() = default;
  // Every block at `bits` (3..8 or 16).
  static Result<WidthMap> Uniform(int bits, int num_layers, int num_experts);
  // JSON (or YAML) file: {"default_bits": 4, "blocks": [{"layer": 0, "expert": 3,
  // "proj": "down", "bits": 5}, ...]}; entries override the default. Errors name the file and
  // the entry.
  static Result<WidthMap> FromFile(const std::string& path, int num_layers, int num_experts);
  // The same for `info`'s store: an entry naming a layer without blocks (a dense layer) is
  // refused, naming it.
  static Result<WidthMap> FromFile(const std::string& path, const apw::StoreInfo& info);
  // Writes the map in the FromFile format (every block listed; with `info`, only the blocks
  // of its store's layers).
  Status Save(const std::string& path, const apw::StoreInfo* info = nullptr) const;

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  int Get(int layer, int expert, ExpertProj proj) const {
    return bits_[Index(layer, expert, proj)];
  }
  // bits must be 3..8 or 16.
  Status Set(int layer, int expert, ExpertProj proj, int bits);
  // Mean bits per weight over the store's blocks (dense layers have none), each weighted by its
  // rows*cols.
  double AverageBits(const apw::StoreInfo& info) const;

 private:
  size_t Index(int layer, int expert, ExpertProj proj) const {
    return ExpertBlockIndex(layer, expert, proj, num_experts_);
  }
  int num_layers_ = 0;
  int num_experts_ = 0;
  std::vector<uint8_t> bits_;
};

}  // namespace pw::anyprec
