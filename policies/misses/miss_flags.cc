#include "policies/misses/miss_flags.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace pw::misses {

void AddMissFlags(CLI::App* app, MissFlags* f, bool with_residency) {
  app->add_option("--miss-policy", f->policy, std::string("expert-miss policy preset: ") +
                                                  MissPresetNames());
  app->add_option("--miss-eviction", f->eviction, "lfu, lru or score-ema (overrides the preset)")
      ->check(CLI::IsMember({"lfu", "lru", "score-ema"}));
  app->add_option("--miss-threshold", f->threshold, "threshold rule: fetch when gate weight >= X")
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--miss-blind-fraction", f->blind_fraction, "weight-blind: share of non-first misses substituted")
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--miss-admission-beta", f->admission_beta, "background admission beta (0 = off)")
      ->check(CLI::Range(0.0, 1e6));
  app->add_option("--miss-admission-delay", f->admission_delay, "tokens until an admitted expert is resident")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--miss-decay", f->decay, "per-token decay of LFU counts / score EMAs, (0, 1)");
  app->add_option("--miss-config", f->config, "YAML miss-policy settings (flags win)");
  if (with_residency) {
    app->add_option("--residency", f->residency, "fraction of each MoE layer's experts resident, (0, 1]")
        ->check(CLI::Range(0.0, 1.0));
    app->add_option("--residency-bytes", f->residency_bytes, "bytes of (bf16) experts resident over all MoE layers");
  }
}

void AddTraceFlags(CLI::App* app, TraceFlags* f) {
  app->add_option("--record-trace", f->path, "write a router-logit trace to FILE (docs/formats.md)");
  app->add_option("--trace-max-mb", f->max_mb, "bound the trace file (MB, 0 = unbounded)")
      ->check(CLI::Range(0.0, 1e9))
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            TraceFlags t;
            t.max_mb = std::atof(v.c_str());
            if (t.max_mb == 0 || t.max_bytes() >= kMinTraceBytesAnyModel) return "";
            return "a bound of " + std::to_string(t.max_bytes()) +
                   " bytes holds no record: a router trace with one record takes at least " +
                   std::to_string(kMinTraceBytesAnyModel) +
                   " bytes (0.000164 MB; more for a real model)";
          },
          "0 or >= 0.000164"));
  app->add_option("--trace-sample", f->sample, "record every N-th forward pass")->check(CLI::Range(1, 1 << 30));
}

uint64_t TraceFlags::max_bytes() const { return static_cast<uint64_t>(std::llround(max_mb * 1e6)); }

Result<MissSettings> MissSettingsFrom(const MissFlags& f) {
  MissSettings s;
  s.policy = f.policy;
  if (!f.eviction.empty()) s.eviction = f.eviction;
  if (f.threshold >= 0.f) s.threshold = f.threshold;
  if (f.blind_fraction >= 0.f) s.blind_fraction = f.blind_fraction;
  if (f.admission_beta >= 0.f) s.admission_beta = f.admission_beta;
  if (f.admission_delay > 0) s.admission_delay = f.admission_delay;
  if (f.decay != 0) s.decay = f.decay;
  if (f.residency > 0) s.residency = f.residency;
  if (f.residency_bytes > 0) s.residency_bytes = f.residency_bytes;
  if (!f.config.empty()) {
    std::ifstream in(f.config);
    if (!in) return NotFound("cannot open --miss-config " + f.config);
    std::stringstream text;
    text << in.rdbuf();
    auto file = ParseMissSettingsYaml(text.str(), f.config);
    if (!file.ok()) return file.status();
    s.FillFrom(*file);
  }
  return s;
}

Result<MissConfig> MissConfigFrom(const MissFlags& f) {
  auto s = MissSettingsFrom(f);
  if (!s.ok()) return s.status();
  return ToMissConfig(*s);
}

Result<Budget> BudgetFrom(const MissFlags& f) {
  auto s = MissSettingsFrom(f);
  if (!s.ok()) return s.status();
  Budget b;
  b.fraction = s->residency.value_or(0.0);
  b.bytes = s->residency_bytes.value_or(0);
  return b;
}

}  // namespace pw::misses
