#include "policies/misses/miss_options.h"

namespace pw::misses {

void DeclareMissOptions(options::OptionSet* s, MissSettings* m, const std::string& prefix,
                        PolicyBudget rule) {
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
  s->AddCheck(map, [rule](const config::ConfigValue& v) -> std::string {
    const bool fraction = v.Has("residency"), bytes = v.Has("residency_bytes");
    if (fraction && bytes) return "residency and residency_bytes exclude each other";
    if (rule == PolicyBudget::kInTheMap && v.Has("policy") && !fraction && !bytes) {
      return "a policy needs a budget (residency or residency_bytes)";
    }
    return "";
  });
}

void DeclareMissToolOptions(options::OptionSet* s, MissToolOptions* o) {
  DeclareMissOptions(s, &o->settings, "", PolicyBudget::kMayBeElsewhere);
  s->Add("miss_config", &o->config_file, "YAML file of the miss settings above (flags win)")
      .Flag("--miss-config").NoKey();
}

namespace {

// Applies a checked file (the settings at its top level) to `s`; then a budget flag replaces
// the file's budget.
Status ApplyMissFile(const config::ConfigValue& root, options::OptionSet* s, MissSettings* m) {
  PW_RETURN_IF_ERROR(s->ApplyFile(root, root));
  if (m->residency && m->residency_bytes) {
    const bool fraction_flag = s->Find("residency")->source() == options::Option::Source::kFlag;
    const bool bytes_flag = s->Find("residency_bytes")->source() == options::Option::Source::kFlag;
    if (fraction_flag == bytes_flag) {
      return InvalidArgument("--residency and --residency-bytes exclude each other");
    }
    if (fraction_flag) m->residency_bytes.reset();
    if (bytes_flag) m->residency.reset();
  }
  return Status::Ok();
}

}  // namespace

Status LoadMissToolOptions(options::OptionSet* s, MissToolOptions* o) {
  config::ConfigValue root = config::ConfigValue::EmptyMap();
  if (!o->config_file.empty()) {
    PW_ASSIGN_OR_RETURN(root, config::LoadYamlConfig(o->config_file, s->SectionSchema()));
  }
  return ApplyMissFile(root, s, &o->settings);
}

Result<MissSettings> ParseMissSettingsYaml(std::string_view text, const std::string& label) {
  MissToolOptions o;
  options::OptionSet s;
  DeclareMissToolOptions(&s, &o);
  PW_ASSIGN_OR_RETURN(config::ConfigValue root,
                      config::ParseYamlConfig(text, label, s.SectionSchema()));
  PW_RETURN_IF_ERROR(ApplyMissFile(root, &s, &o.settings));
  return o.settings;
}

}  // namespace pw::misses
