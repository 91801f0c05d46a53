#include "services/broker/broker_options.h"

#include "services/common/main_loop_beat.h"

namespace pw::broker {

void DeclareBrokerOptions(options::OptionSet* s, BrokerOptions* o) {
  s->Add("model_dir", &o->model_dir, "model directory (config.json, *.safetensors)")
      .Flag("--model").Shared().Required().NonEmpty();
  s->Add("model_name", &o->model_name, "model name workers must serve").Shared();
  s->Add("bind", &o->bind, "control endpoint (ZeroMQ ROUTER)").NoKey();
  s->Add("heartbeat_ms", &o->heartbeat_ms, "heartbeat interval").Shared().Range(10, 60000);
  s->Add("metrics", &o->metrics_bind, "Prometheus bind address, e.g. 127.0.0.1:9102").NoKey();
  service::DeclareMainLoopStaleOption(s, &o->main_loop_stale_ms);
  s->Add("store", &o->store_path,
         "any-precision .apw store to serve (default: the checkpoint's bf16 experts)")
      .NonEmpty();
  s->Add("model_hash_cache", &o->model_hash_cache,
         "directory remembering the checkpoint's hash between starts (pw serve's store cache; "
         "services/common/model_hash_cache.h); unset: the experts are hashed at every start")
      .NonEmpty();
  s->Add("initial_bits", &o->initial_bits, "width of every expert block until a plan changes it")
      .Range(3, 8);
  // The quality-aware planner (policies/planner/planner_params.h); needs the store.
  auto& pl = o->planner;
  s->Add("planner.enabled", &pl.enabled, "run the quality-aware planner (needs --store)").Flag("--planner");
  s->Add("planner.static", &pl.static_mode, "ablation: the planner never changes widths");
  s->Add("planner.use_routing", &pl.use_routing,
         "ablation: no routing statistics (every expert average, no hot floor)")
      .Flag("--planner-no-routing").FlagSets(false);
  s->Add("planner.residuals", &o->planner_residuals,
         "prompt residual heads beside the store (pw-quantize residuals)")
      .NonEmpty();
  s->Add("planner.use_residuals", &pl.use_prompt_residuals,
         "ablation: no prompt residuals (every step's prompt factor is 1)")
      .Flag("--planner-no-residuals").FlagSets(false);
  s->Add("planner.low_watermark", &pl.low_watermark, "low watermark, fraction of the pool free")
      .Flag("--planner-low").Range(0, 1);
  s->Add("planner.high_watermark", &pl.high_watermark, "high watermark, fraction of the pool free")
      .Flag("--planner-high").Range(0, 1);
  s->Add("planner.headroom", &pl.headroom, "fraction of the pool freed beyond the shortfall").Range(0, 1);
  s->Add("planner.hot_floor_bits", &pl.hot_floor_bits, "lowest width of a hot expert")
      .Flag("--planner-hot-floor").Range(0, 8);
  s->Add("planner.min_bits", &pl.min_bits, "lowest width the planner lowers a block to").Range(3, 8);
  s->Add("planner.max_bits", &pl.max_bits, "highest width the planner raises a block to").Range(3, 8);
  s->Add("planner.min_mean_bits", &pl.min_mean_bits, "lowest mean width the planner lowers to (0: none)")
      .Range(0, 8);
  s->Add("planner.live_mass_weight", &pl.live_mass_weight,
         "weight of the live routing mass against the calibration share (0..1)")
      .Range(0, 1);
  s->Add("planner.max_mean_bits", &pl.max_mean_bits,
         "highest mean width the planner raises to; a higher mean is lowered to it (0: none)")
      .Range(0, 8);
  s->Add("planner.max_bytes_per_decision", &pl.max_bytes_per_decision,
         "bytes one decision may move (0 = no limit)")
      .Flag("--planner-max-bytes").Range(0, static_cast<double>(int64_t{1} << 50));
  s->Add("planner.min_interval_ms", &pl.min_interval_ms, "least time between two changes").Range(0, 3600000);
  s->Add("planner.interval_ms", &pl.interval_ms, "how often the planner runs").Range(1, 3600000);
  // The rules between keys are PlannerParams::Validate's, for files too: the map is read into
  // a fresh BrokerOptions through these same declarations (the error then carries the file's
  // position).
  s->AddCheck("planner", [](const config::ConfigValue& v) -> std::string {
    BrokerOptions b;
    options::OptionSet set;
    DeclareBrokerOptions(&set, &b);
    config::ConfigValue section = config::ConfigValue::EmptyMap();
    section.Add("planner", v);
    if (Status st = set.ApplyFile(config::ConfigValue::EmptyMap(), section); !st.ok()) return st.message();
    const Status st = b.planner.Validate();
    return st.ok() ? "" : st.message();
  });
  s->AddCheck("", [](const config::ConfigValue& v) -> std::string {
    const bool planner = v.Has("planner") && v["planner"].Has("enabled") && v["planner"]["enabled"].AsBool();
    return planner && !v.Has("store") ? "the planner needs store (an .apw store)" : "";
  });
}

}  // namespace pw::broker
