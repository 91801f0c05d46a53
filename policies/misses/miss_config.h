// MissConfig: what a miss policy does when a token's selected expert is not resident
// (DESIGN.md 5.2), and the named presets.
//
// Decision rule for a missed expert e of a token (weights are the token's gate weights after
// the router's normalisation; "first choice" = the token's highest-weight selection):
//   kFetchEveryMiss : fetch e synchronously, always.
//   kThreshold      : fetch when e is the first choice or weight(e) >= threshold (0.15);
//                     otherwise substitute.
//   kFirstChoice    : fetch only a missed first choice; substitute every other miss.
//   kWeightBlind    : a control that ignores gate weights: fetch a missed first choice;
//                     substitute any other miss with probability blind_fraction (a fixed hash
//                     of layer, token and expert decides, so runs repeat), fetch it otherwise.
// Substitute = the resident expert with the highest router score for the token that is not
// already among its selections; it takes e's gate weight. With no such expert the miss is
// fetched.
//
// Eviction (which resident expert of the layer leaves when a fetch or admission needs room):
//   kLfu       : lowest decayed use count c_e, c_e <- c_e * decay per token of the layer, +1 per
//                use (a use = the expert computed for a token: hit, fetch or substitute);
//   kLru       : oldest last use;
//   kScoreEma  : lowest exponential moving average of the router probability,
//                s_e <- decay * s_e + (1 - decay) * p_e over every token of the layer, whether
//                e was selected or not (the router's full distribution, not only its choices).
// Ties: lower expert id leaves first. The token being decided never loses one of its own
// selections.
//
// Background admission (admission_beta > 0): per expert, the gate weight lost to substitution
// accumulates; when it reaches beta the expert is admitted asynchronously (resident from the
// admission_delay-th next token of that layer on, evicting per the rule above) and its sum resets.
//
// Presets (ParseMissPreset): fetch-every-miss; rule-0.15; first-choice; weight-blind; quality-first =
// rule-0.15 + LFU + admission beta 0.5; speed-first = first-choice + LFU + admission beta 0.5.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pw::misses {

enum class MissRule : uint8_t { kFetchEveryMiss = 0, kThreshold = 1, kFirstChoice = 2, kWeightBlind = 3 };
enum class Eviction : uint8_t { kLfu = 0, kLru = 1, kScoreEma = 2 };

struct MissConfig {
  MissRule rule = MissRule::kFetchEveryMiss;
  float threshold = 0.15f;     // kThreshold: fetch when weight >= threshold
  float blind_fraction = 0.5f;  // kWeightBlind: share of non-first misses substituted, [0, 1]
  Eviction eviction = Eviction::kLfu;
  double decay = 0.98;         // kLfu and kScoreEma: per-token decay of the layer, in (0, 1)
  float admission_beta = 0.f;  // 0: no background admission; else > 0
  int admission_delay = 1;     // tokens of the layer until an admitted expert is resident, >= 1
};

const char* MissRuleName(MissRule r);  // "fetch-every-miss", "rule-0.15" style, "first-choice"
const char* EvictionName(Eviction e);  // "lfu", "lru", "score-ema"
Result<MissRule> ParseMissRule(std::string_view name);  // fetch-every-miss | threshold | first-choice | weight-blind
Result<Eviction> ParseEviction(std::string_view name);  // lfu | lru | score-ema

// A preset by name (list above); kInvalidArgument naming the presets otherwise.
Result<MissConfig> ParseMissPreset(std::string_view name);
// The preset names, comma separated.
const char* MissPresetNames();

// kInvalidArgument unless threshold and blind_fraction are finite in [0, 1], decay in (0, 1), admission_beta >= 0
// and finite, admission_delay >= 1.
Status ValidateMissConfig(const MissConfig& c);

// One line, no commas: "rule-0.15 lfu(0.98) admit(0.5 delay 1)".
std::string DescribeMissConfig(const MissConfig& c);

}  // namespace pw::misses
