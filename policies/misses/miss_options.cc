#include "policies/misses/miss_options.h"

namespace pw::misses {

void DeclareMissOptions(options::OptionSet* s, MissSettings* m, const std::string& prefix) {
  s->Add(prefix + "policy", &m->policy, std::string("expert-miss policy preset: ") + MissPresetNames())
      .Flag("--miss-policy").NonEmpty();
  s->Add(prefix + "eviction", &m->eviction, "lfu, lru or score-ema (overrides the preset)")
      .Flag("--miss-eviction").OneOf({"lfu", "lru", "score-ema"});
  s->Add(prefix + "threshold", &m->threshold, "threshold rule: fetch when gate weight >= X")
      .Flag("--miss-threshold").Range(0, 1);
  s->Add(prefix + "blind_fraction", &m->blind_fraction, "weight-blind: share of non-first misses substituted")
      .Flag("--miss-blind-fraction").Range(0, 1);
  s->Add(prefix + "admission_beta", &m->admission_beta, "background admission beta (0 = off)")
      .Flag("--miss-admission-beta").Range(0, 1e6);
  s->Add(prefix + "admission_delay", &m->admission_delay, "tokens until an admitted expert is resident")
      .Flag("--miss-admission-delay").Range(1, 1 << 20);
  s->Add(prefix + "decay", &m->decay, "per-token decay of LFU counts / score EMAs, (0, 1)")
      .Flag("--miss-decay").Range(0, 1);
  s->Add(prefix + "residency", &m->residency, "fraction of each MoE layer's experts resident, (0, 1]")
      .Flag("--residency").Range(0, 1);
  s->Add(prefix + "residency_bytes", &m->residency_bytes, "bytes of (bf16) experts resident over all MoE layers")
      .Flag("--residency-bytes").Range(1, static_cast<double>(int64_t{1} << 50));
  std::string map = prefix;
  if (!map.empty() && map.back() == '.') map.pop_back();
  s->AddCheck(map, [](const config::ConfigValue& v) -> std::string {
    if (v.Has("residency") && v.Has("residency_bytes")) return "residency and residency_bytes exclude each other";
    if (v.Has("policy") && !v.Has("residency") && !v.Has("residency_bytes")) {
      return "a policy needs a budget (residency or residency_bytes)";
    }
    return "";
  });
}

}  // namespace pw::misses
