#include "policies/misses/miss_settings.h"

namespace pw::misses {

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
