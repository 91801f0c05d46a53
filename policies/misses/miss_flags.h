// The expert-miss and router-trace command-line flags pw-eval, pw-generate, pw-sim and
// pw-decode share (CLI11), turned into MissSettings / MissConfig / Budget.
//
//   --miss-policy P            preset: fetch-every-miss, rule-0.15, first-choice, weight-blind,
//                              quality-first, speed-first (policies/misses/miss_config.h)
//   --miss-eviction E          lfu | lru | score-ema (overrides the preset's)
//   --miss-threshold X         the threshold rule's gate-weight threshold (default 0.15)
//   --miss-blind-fraction Q    weight-blind: share of non-first misses substituted (default 0.5)
//   --miss-admission-beta B    background admission at beta (0 = off; overrides the preset's)
//   --miss-admission-delay D   tokens until an admitted expert is resident (default 1)
//   --miss-decay G             per-token decay of LFU counts and score EMAs (default 0.98)
//   --residency F              fraction of each MoE layer's experts resident, (0, 1]
//   --residency-bytes N        or bytes of experts resident over all MoE layers (bf16 sizes)
//   --miss-config FILE         YAML with any of the above (policies/misses/miss_settings.h);
//                              flags given on the command line win
//   --record-trace FILE        write a router-logit trace (docs/formats.md)
//   --trace-max-mb M           bound the trace (0 = none; else at least 0.000164, the smallest
//                              trace with a record: router_trace.h); --trace-sample N: every N-th
//                              pass
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "policies/misses/miss_config.h"
#include "policies/misses/miss_settings.h"
#include "policies/misses/trace_replay.h"

namespace CLI {
class App;
}

namespace pw::misses {

struct MissFlags {
  std::string policy;  // empty: no miss policy
  std::string eviction;
  float threshold = -1.f;
  float blind_fraction = -1.f;
  float admission_beta = -1.f;
  int admission_delay = 0;
  double decay = 0;
  double residency = 0;
  uint64_t residency_bytes = 0;
  std::string config;  // --miss-config FILE
};

struct TraceFlags {
  std::string path;
  double max_mb = 0;  // 0, or at least kMinTraceBytesAnyModel bytes (checked when parsed)
  int sample = 1;
  // max_mb in bytes (1 MB = 1e6 bytes), rounded to the nearest byte.
  uint64_t max_bytes() const;
};

// `with_policy`: the --miss-* flags (pw-eval, pw-sim); `with_residency`: --residency(-bytes).
void AddMissFlags(CLI::App* app, MissFlags* f, bool with_residency);
void AddTraceFlags(CLI::App* app, TraceFlags* f);

// The settings the flags name, over the --miss-config file's. kInvalidArgument on bad flags
// or a bad file (kNotFound when it cannot be read).
Result<MissSettings> MissSettingsFrom(const MissFlags& f);
// The config (preset, then the overrides) and the budget (fraction and bytes 0 when none).
Result<MissConfig> MissConfigFrom(const MissFlags& f);
Result<Budget> BudgetFrom(const MissFlags& f);

}  // namespace pw::misses
