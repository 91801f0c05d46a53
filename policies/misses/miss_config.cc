#include "policies/misses/miss_config.h"

#include <cmath>
#include <cstdio>

namespace pw::misses {

const char* MissRuleName(MissRule r) {
  switch (r) {
    case MissRule::kFetchEveryMiss: return "fetch-every-miss";
    case MissRule::kThreshold: return "threshold";
    case MissRule::kFirstChoice: return "first-choice";
    case MissRule::kWeightBlind: return "weight-blind";
  }
  return "?";
}

const char* EvictionName(Eviction e) {
  switch (e) {
    case Eviction::kLfu: return "lfu";
    case Eviction::kLru: return "lru";
    case Eviction::kScoreEma: return "score-ema";
  }
  return "?";
}

Result<MissRule> ParseMissRule(std::string_view name) {
  if (name == "fetch-every-miss") return MissRule::kFetchEveryMiss;
  if (name == "threshold") return MissRule::kThreshold;
  if (name == "first-choice") return MissRule::kFirstChoice;
  if (name == "weight-blind") return MissRule::kWeightBlind;
  return InvalidArgument("miss rule must be fetch-every-miss, threshold, first-choice or weight-blind, got '" +
                         std::string(name) + "'");
}

Result<Eviction> ParseEviction(std::string_view name) {
  if (name == "lfu") return Eviction::kLfu;
  if (name == "lru") return Eviction::kLru;
  if (name == "score-ema") return Eviction::kScoreEma;
  return InvalidArgument("eviction must be lfu, lru or score-ema, got '" + std::string(name) + "'");
}

const char* MissPresetNames() {
  return "fetch-every-miss, rule-0.15, first-choice, weight-blind, quality-first, speed-first";
}

Result<MissConfig> ParseMissPreset(std::string_view name) {
  MissConfig c;
  if (name == "fetch-every-miss") return c;
  if (name == "rule-0.15") {
    c.rule = MissRule::kThreshold;
    return c;
  }
  if (name == "first-choice") {
    c.rule = MissRule::kFirstChoice;
    return c;
  }
  if (name == "weight-blind") {
    c.rule = MissRule::kWeightBlind;
    return c;
  }
  if (name == "quality-first" || name == "speed-first") {
    c.rule = name == "quality-first" ? MissRule::kThreshold : MissRule::kFirstChoice;
    c.eviction = Eviction::kLfu;
    c.admission_beta = 0.5f;
    return c;
  }
  return InvalidArgument("unknown miss policy '" + std::string(name) + "' (presets: " +
                         MissPresetNames() + ")");
}

Status ValidateMissConfig(const MissConfig& c) {
  if (!std::isfinite(c.threshold) || c.threshold < 0.f || c.threshold > 1.f) {
    return InvalidArgument("miss threshold must be in [0, 1], got " + std::to_string(c.threshold));
  }
  if (!std::isfinite(c.blind_fraction) || c.blind_fraction < 0.f || c.blind_fraction > 1.f) {
    return InvalidArgument("weight-blind fraction must be in [0, 1], got " + std::to_string(c.blind_fraction));
  }
  if (!(c.decay > 0.0 && c.decay < 1.0)) {
    return InvalidArgument("eviction decay must be in (0, 1), got " + std::to_string(c.decay));
  }
  if (!std::isfinite(c.admission_beta) || c.admission_beta < 0.f) {
    return InvalidArgument("admission beta must be >= 0 (0 = off), got " +
                           std::to_string(c.admission_beta));
  }
  if (c.admission_delay < 1) {
    return InvalidArgument("admission delay must be >= 1 token, got " +
                           std::to_string(c.admission_delay));
  }
  return Status::Ok();
}

std::string DescribeMissConfig(const MissConfig& c) {
  char buf[160];
  std::string rule = MissRuleName(c.rule);
  if (c.rule == MissRule::kThreshold) {
    std::snprintf(buf, sizeof buf, "rule-%g", static_cast<double>(c.threshold));
    rule = buf;
  } else if (c.rule == MissRule::kWeightBlind) {
    std::snprintf(buf, sizeof buf, "weight-blind-%g", static_cast<double>(c.blind_fraction));
    rule = buf;
  }
  std::string ev = EvictionName(c.eviction);
  if (c.eviction != Eviction::kLru) {
    std::snprintf(buf, sizeof buf, "(%g)", c.decay);
    ev += buf;
  }
  std::string out = rule + " " + ev;
  if (c.admission_beta > 0.f) {
    std::snprintf(buf, sizeof buf, " admit(%g delay %d)", static_cast<double>(c.admission_beta),
                  c.admission_delay);
    out += buf;
  }
  return out;
}

}  // namespace pw::misses
