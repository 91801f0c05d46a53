// MissSettings: a miss policy and its residency budget as configuration names them — a preset
// plus optional overrides. Their keys, flags and YAML form are declared once in miss_options.h,
// so a serving process's `misses:` map and the tools' --miss-config file read the same way:
//
//   policy: quality-first        # a preset (miss_config.h); default fetch-every-miss
//   eviction: lru                # lfu | lru | score-ema
//   threshold: 0.15              # the threshold rule's gate weight
//   blind_fraction: 0.5          # the weight-blind control's share
//   admission_beta: 0.5          # 0 = no background admission
//   admission_delay: 1           # tokens until an admitted expert is resident
//   decay: 0.98                  # LFU / score-EMA per-token decay
//   residency: 0.25              # fraction of each MoE layer's experts resident
//   residency_bytes: 1000000     # or bytes of experts over all MoE layers
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "policies/misses/miss_config.h"

namespace pw::misses {

struct MissSettings {
  std::string policy;  // preset; empty: fetch-every-miss
  std::optional<std::string> eviction;
  std::optional<float> threshold, blind_fraction, admission_beta;
  std::optional<int> admission_delay;
  std::optional<double> decay;
  std::optional<double> residency;
  std::optional<uint64_t> residency_bytes;
};

// The preset, then the overrides; validated (ValidateMissConfig).
Result<MissConfig> ToMissConfig(const MissSettings& s);

}  // namespace pw::misses
