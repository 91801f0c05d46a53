#include "policies/misses/miss_settings.h"

#include <yaml-cpp/yaml.h>

#include <cmath>

namespace pw::misses {

void MissSettings::FillFrom(const MissSettings& f) {
  if (policy.empty()) policy = f.policy;
  if (!eviction) eviction = f.eviction;
  if (!threshold) threshold = f.threshold;
  if (!blind_fraction) blind_fraction = f.blind_fraction;
  if (!admission_beta) admission_beta = f.admission_beta;
  if (!admission_delay) admission_delay = f.admission_delay;
  if (!decay) decay = f.decay;
  if (!residency && !residency_bytes) {
    residency = f.residency;
    residency_bytes = f.residency_bytes;
  }
}

Result<MissSettings> ParseMissSettingsYaml(const std::string& text, const std::string& where) {
  YAML::Node y;
  try {
    y = YAML::Load(text);
  } catch (const std::exception& e) {
    return InvalidArgument(where + ": bad YAML: " + e.what());
  }
  MissSettings s;
  if (y.IsNull()) return s;
  if (!y.IsMap()) return InvalidArgument(where + ": expected a mapping of miss-policy settings");
  static const char* kKeys = "policy, eviction, threshold, blind_fraction, admission_beta, "
                             "admission_delay, decay, residency, residency_bytes";
  for (const auto& kv : y) {
    const std::string key = kv.first.as<std::string>("");
    const YAML::Node& v = kv.second;
    try {
      if (key == "policy") {
        s.policy = v.as<std::string>();
      } else if (key == "eviction") {
        s.eviction = v.as<std::string>();
      } else if (key == "threshold") {
        s.threshold = v.as<float>();
      } else if (key == "blind_fraction") {
        s.blind_fraction = v.as<float>();
      } else if (key == "admission_beta") {
        s.admission_beta = v.as<float>();
      } else if (key == "admission_delay") {
        s.admission_delay = v.as<int>();
      } else if (key == "decay") {
        s.decay = v.as<double>();
      } else if (key == "residency") {
        s.residency = v.as<double>();
      } else if (key == "residency_bytes") {
        s.residency_bytes = v.as<uint64_t>();
      } else {
        return InvalidArgument(where + ": unknown key '" + key + "' (known keys: " + kKeys + ")");
      }
    } catch (const std::exception&) {
      return InvalidArgument(where + ": " + key + ": bad value '" + v.as<std::string>("?") + "'");
    }
  }
  if (s.residency && !(*s.residency > 0 && *s.residency <= 1)) {
    return InvalidArgument(where + ": residency must be in (0, 1], got " + std::to_string(*s.residency));
  }
  if (s.residency && s.residency_bytes) {
    return InvalidArgument(where + ": give residency or residency_bytes, not both");
  }
  return s;
}

Result<MissConfig> ToMissConfig(const MissSettings& s) {
  auto c = ParseMissPreset(s.policy.empty() ? "fetch-every-miss" : s.policy);
  if (!c.ok()) return c.status();
  MissConfig cfg = *c;
  if (s.eviction) {
    auto e = ParseEviction(*s.eviction);
    if (!e.ok()) return e.status();
    cfg.eviction = *e;
  }
  if (s.threshold) cfg.threshold = *s.threshold;
  if (s.blind_fraction) cfg.blind_fraction = *s.blind_fraction;
  if (s.admission_beta) cfg.admission_beta = *s.admission_beta;
  if (s.admission_delay) cfg.admission_delay = *s.admission_delay;
  if (s.decay) cfg.decay = *s.decay;
  PW_RETURN_IF_ERROR(ValidateMissConfig(cfg));
  return cfg;
}

}  // namespace pw::misses
