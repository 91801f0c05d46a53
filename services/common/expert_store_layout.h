// The expert weight store layout shared by the broker (which serves it) and the decode
// workers (which load it over UCX): one region per expert linear block, bf16, row-major.
//
//   gateUp block of (layer l, expert e): [2 * I, H] bf16 = gate_proj rows [0, I) then up_proj
//                                        rows [I, 2I) (the engine's ExpertProj::kGateUp)
//   down block:                          [H, I] bf16 (down_proj)
//   regions in order l (MoE layers only), e, gateUp then down; each 64-byte aligned.
//
// ExpertStoreLayout is computed from the model config alone, so a worker never sizes memory
// from a peer's numbers: it checks the broker's manifest against its own layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/expert_block.h"
#include "common/formats/model_config.h"
#include "common/status.h"

namespace pw::service {

struct ExpertRegion {
  int layer = 0;
  int expert = 0;
  ExpertProj proj = ExpertProj::kGateUp;
  uint64_t offset = 0; // bytes from the store's start
  uint64_t bytes = 0;
  int64_t rows = 0, cols = 0;
};

struct ExpertStoreLayout {
  std::vector<ExpertRegion> regions;
  uint64_t total_bytes = 0;
  // Index of (layer, expert, proj) in regions, or -1.
  int64_t Find(int layer, int expert, ExpertProj proj) const;
  // Builds the layout of `config`'s MoE layers.
  static ExpertStoreLayout For(const ModelConfig& config);

 private:
  std::vector<int64_t> index_;  // [num_layers * num_experts * 2] -> region or -1
  int64_t num_layers_ = 0, num_experts_ = 0;
};

// Region checksums are as the manifest's checksumKind says (services/proto/part_checksum.h).

}  // namespace pw::service
