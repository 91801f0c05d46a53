#include "services/cluster/cluster_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "common/formats/yaml_config.h"
#include "policies/misses/router_trace.h"

namespace pw::cluster {

using config::ConfigValue;
using config::Schema;

namespace {

Schema PortSchema(int64_t def) { return Schema::Int().Range(1, 65535).Default(def); }
Schema OptPort() { return Schema::Int().Range(0, 65535).Default(int64_t{0}); }

// A decode trace's max_mb: one that holds no record of any model is refused (the worker refuses
// one below its own model's floor at start, misses::MinTraceBytes).
std::string TraceBound(const ConfigValue& v) {
  const double mb = v.AsDouble();
  const long long bytes = mb > 0 ? std::llround(mb * 1e6) : 0;  // as pw-decode converts it
  if (bytes >= static_cast<long long>(misses::kMinTraceBytesAnyModel)) return "";
  char m[64];
  std::snprintf(m, sizeof m, "%g MB (%lld bytes)", mb, bytes);
  return std::string(m) + " holds no record: a router trace with one record takes at least " +
         std::to_string(misses::kMinTraceBytesAnyModel) +
         " bytes (0.000164 MB: its 64-byte header, a record, the end record; more for a real "
         "model)";
}

const Schema& ClusterSchema() {
  static const Schema schema = Schema::Map({
      {"model_dir", Schema::String().NonEmpty().Required()},
      {"model_name", Schema::String()},
      {"host", Schema::String().NonEmpty().Default("127.0.0.1")},
      {"run_dir", Schema::String().NonEmpty().Default("build/run")},
      {"bin_dir", Schema::String()},
      {"heartbeat_ms", Schema::Int().Range(10, 60000).Default(int64_t{500})},
      {"drain_timeout_ms", Schema::Int().Range(0, 3600000).Default(int64_t{30000})},
      // KV elements on prefill and decode workers (memory/kv_blocks.h).
      {"kv_dtype", Schema::String().OneOf({"bf16", "fp32"}).Default("bf16")},
      {"router", Schema::Map({
                     {"port", PortSchema(8000)},
                     {"control_port", PortSchema(5555)},
                     {"lease_ms", Schema::Int().Range(100, 3600000).Default(int64_t{30000})},
                     {"max_waiting", Schema::Int().Range(1, 1000000).Default(int64_t{256})},
                     // Waiting requests may need this many times the KV the decode workers can
                     // hold (services/router/kv_admission.h); then 429.
                     {"max_queued_kv", Schema::Double().Range(0.01, 1000).Default(1.0)},
                 })},
      {"broker", Schema::Map({
                     {"enabled", Schema::Bool().Default(true)},
                     {"control_port", PortSchema(5556)},
                     {"metrics_port", OptPort()},
                     // Any-precision .apw store (pw-quantize); absent = bf16 experts.
                     {"store", Schema::String().NonEmpty()},
                     {"initial_bits", Schema::Int().Range(3, 8).Default(int64_t{8})},
                     // The quality-aware planner (policies/planner/planner_params.h); needs
                     // the store.
                     {"planner", Schema::Map({
                                     {"enabled", Schema::Bool().Default(false)},
                                     {"static", Schema::Bool().Default(false)},
                                     {"use_routing", Schema::Bool().Default(true)},
                                     // Prompt residual heads (pw-quantize residuals) and
                                     // the "no prompt residuals" ablation.
                                     {"residuals", Schema::String().NonEmpty()},
                                     {"use_residuals", Schema::Bool().Default(true)},
                                     {"low_watermark", Schema::Double().Range(0, 1).Default(0.05)},
                                     {"high_watermark", Schema::Double().Range(0, 1).Default(0.20)},
                                     {"headroom", Schema::Double().Range(0, 1).Default(0.05)},
                                     {"hot_floor_bits", Schema::Int().Range(0, 8).Default(int64_t{6})},
                                     // The widths the planner moves blocks between.
                                     {"min_bits", Schema::Int().Range(3, 8).Default(int64_t{3})},
                                     {"max_bits", Schema::Int().Range(3, 8).Default(int64_t{8})},
                                     // Floor on the mean width (0: none), policies/planner/planner_params.h.
                                     {"min_mean_bits", Schema::Double().Range(0, 8).Default(0.0)},
                                     // Share of live routing mass against the calibration share.
                                     {"live_mass_weight", Schema::Double().Range(0, 1).Default(1.0)},
                                     // Ceiling on the mean width (0: none), the same header.
                                     {"max_mean_bits", Schema::Double().Range(0, 8).Default(0.0)},
                                     // false: the "no async movement" ablation (pw-decode
                                     // --plans-at-request-boundaries on every decode worker).
                                     {"async_movement", Schema::Bool().Default(true)},
                                     {"max_bytes_per_decision",
                                      Schema::Int().Range(0, int64_t{1} << 50).Default(int64_t{0})},
                                     {"min_interval_ms", Schema::Int().Range(0, 3600000).Default(int64_t{500})},
                                     {"interval_ms", Schema::Int().Range(1, 3600000).Default(int64_t{200})},
                                 }).Check([](const ConfigValue& v) -> std::string {
                                   if (v["high_watermark"].AsDouble() < v["low_watermark"].AsDouble()) {
                                     return "high_watermark is below low_watermark";
                                   }
                                   if (v["max_bits"].AsInt() < v["min_bits"].AsInt()) {
                                     return "max_bits is below min_bits";
                                   }
                                   const double ceiling = v["max_mean_bits"].AsDouble();
                                   if (ceiling > 0 && (ceiling < v["min_mean_bits"].AsDouble() ||
                                                       ceiling > v["max_bits"].AsInt())) {
                                     return "max_mean_bits is outside [min_mean_bits, max_bits]";
                                   }
                                   return "";
                                 })},
                 })},
      {"prefill", Schema::List(Schema::Map({
                      {"id", Schema::String().NonEmpty().Required()},
                      {"kv_blocks", Schema::Int().Range(1, 1 << 24).Default(int64_t{1024})},
                      {"threads", Schema::Int().Range(1, 1024).Default(int64_t{1})},
                      {"max_batch_tokens", Schema::Int().Range(1, 1 << 20).Default(int64_t{256})},
                      // The checkpoint read into the worker's memory instead of mapped (--no-mmap).
                      {"no_mmap", Schema::Bool().Default(false)},
                      {"metrics_port", OptPort()},
                  })).Size(1, 64).Required()},
      {"decode", Schema::List(Schema::Map({
                     {"id", Schema::String().NonEmpty().Required()},
                     {"kv_blocks", Schema::Int().Range(1, 1 << 24).Default(int64_t{2048})},
                     {"threads", Schema::Int().Range(1, 1024).Default(int64_t{1})},
                     {"max_batch_tokens", Schema::Int().Range(1, 1 << 20).Default(int64_t{256})},
                     {"no_mmap", Schema::Bool().Default(false)},
                     {"max_batch", Schema::Int().Range(1, 65536).Default(int64_t{64})},
                     // A reservation that fits only after lowering expert widths waits up to
                     // this long (services/workers/decode/reserve_wait.h); 0 = answered at once. Below
                     // the router's 30 s reservation timeout.
                     {"reserve_wait_ms", Schema::Int().Range(0, 20000).Default(int64_t{0})},
                     // KV demand horizon in tokens (services/workers/decode/kv_demand.h); 0 = to max_tokens.
                     {"demand_horizon_tokens", Schema::Int().Range(0, int64_t{1} << 20).Default(int64_t{0})},
                     {"metrics_port", OptPort()},
                     // Page pool shared by KV and expert planes: MiB (0 = kv_blocks of KV plus
                     // every expert at 8 bits), page size (0 = one layer of one KV block), and
                     // the plane transfer rate limit (0 = none).
                     {"pool_mb", Schema::Int().Range(0, 1 << 24).Default(int64_t{0})},
                     {"page_bytes", Schema::Int().Range(0, 1 << 30).Default(int64_t{0})},
                     {"weight_rate_mb_s", Schema::Int().Range(0, 1 << 20).Default(int64_t{0})},
                     // How background width changes give way to the step
                     // (services/workers/weights/paged_weights.h, MoverPacing).
                     {"weight_pacing", Schema::String().OneOf({"free", "fetches", "steps", "auto"}).Default("auto")},
                     // LYNX (DESIGN.md 5.3): alpha 0 / beta -1 = derived from k/N.
                     {"lynx", Schema::Map({
                                  {"enabled", Schema::Bool().Default(false)},
                                  {"alpha", Schema::Double().Range(0, 1000).Default(0.0)},
                                  {"beta", Schema::Int().Range(-1, 64).Default(int64_t{-1})},
                                  {"gate_weights", Schema::String().OneOf({"renorm", "mass"})
                                                       .Default("renorm")},
                                  {"exempt_layers", Schema::List(Schema::Int().Range(0, 100000))},
                              }).Check([](const ConfigValue& v) -> std::string {
                                if ((v["alpha"].AsDouble() > 0) != (v["beta"].AsInt() >= 0)) {
                                  return "alpha and beta go together (or neither: from k/N)";
                                }
                                return "";
                              })},
                     // Expert residency budget and miss policy (policies/misses/miss_settings.h,
                     // the same keys); absent or without a budget = every expert resident.
                     {"misses", Schema::Map({
                                    {"policy", Schema::String().NonEmpty()},
                                    {"eviction", Schema::String().OneOf({"lfu", "lru", "score-ema"})},
                                    {"threshold", Schema::Double().Range(0, 1)},
                                    {"blind_fraction", Schema::Double().Range(0, 1)},
                                    {"admission_beta", Schema::Double().Range(0, 1e6)},
                                    {"admission_delay", Schema::Int().Range(1, 1 << 20)},
                                    {"decay", Schema::Double().Range(0, 1)},
                                    {"residency", Schema::Double().Range(0, 1)},
                                    {"residency_bytes", Schema::Int().Range(1, int64_t{1} << 50)},
                                }).Check([](const ConfigValue& v) -> std::string {
                                  if (v.Has("residency") && v.Has("residency_bytes")) {
                                    return "residency and residency_bytes exclude each other";
                                  }
                                  if (v.Has("policy") && !v.Has("residency") && !v.Has("residency_bytes")) {
                                    return "a policy needs a budget (residency or residency_bytes)";
                                  }
                                  return "";
                                })},
                     // Router-logit trace of the served tokens (services/workers/decode/decode_trace.h):
                     // every `sample`-th forward pass, the file bounded by max_mb (MB, TraceBound).
                     {"trace", Schema::Map({
                                   {"path", Schema::String().NonEmpty().Required()},
                                   {"max_mb", Schema::Double().Max(1e6).Default(64.0).Check(TraceBound)},
                                   {"sample", Schema::Int().Range(1, 1 << 30).Default(int64_t{1})},
                               })},
                 })).Size(1, 64).Required()},
      {"restart", Schema::Map({
                      {"initial_backoff_ms", Schema::Int().Range(0, 600000).Default(int64_t{500})},
                      {"max_backoff_ms", Schema::Int().Range(0, 3600000).Default(int64_t{10000})},
                      {"stable_after_ms", Schema::Int().Range(0, 3600000).Default(int64_t{10000})},
                      {"fail_fast_ms", Schema::Int().Range(0, 3600000).Default(int64_t{5000})},
                      {"fail_fast_exits", Schema::Int().Range(0, 1000).Default(int64_t{3})},
                  })},
  });
  return schema;
}

}  // namespace

Result<ClusterConfig> LoadClusterConfig(const std::string& path, const std::string& default_bin_dir) {
  PW_ASSIGN_OR_RETURN(ConfigValue cfg, config::LoadYamlConfig(path, ClusterSchema()));
  ClusterConfig out;
  out.model_dir = cfg["model_dir"].AsString();
  out.host = cfg["host"].AsString();
  out.run_dir = cfg["run_dir"].AsString();
  out.drain_timeout_ms = cfg["drain_timeout_ms"].AsInt();
  const std::string bin = cfg.Has("bin_dir") ? cfg["bin_dir"].AsString() : default_bin_dir;
  const std::string model_name = cfg.Has("model_name") ? cfg["model_name"].AsString() : "";
  const std::string hb = std::to_string(cfg["heartbeat_ms"].AsInt());
  const auto& router = cfg["router"];
  const auto& broker = cfg["broker"];
  const auto& restart = cfg["restart"];
  out.restart.initial_backoff_ms = restart["initial_backoff_ms"].AsInt();
  out.restart.max_backoff_ms = restart["max_backoff_ms"].AsInt();
  out.restart.stable_after_ms = restart["stable_after_ms"].AsInt();
  out.restart.fail_fast_ms = restart["fail_fast_ms"].AsInt();
  out.restart.fail_fast_exits = restart["fail_fast_exits"].AsInt();
  out.http_port = router["port"].AsInt();

  // Distinct ports and ids, each error pointing at the offending value.
  std::set<int64_t> ports;
  std::set<std::string> ids = {"router", "broker"};
  auto use_port = [&](const ConfigValue& v) -> Status {
    const int64_t p = v.AsInt();
    if (p == 0) return Status::Ok();
    if (!ports.insert(p).second) return v.Error("port " + std::to_string(p) + " is used twice");
    return Status::Ok();
  };
  PW_RETURN_IF_ERROR(use_port(router["port"]));
  PW_RETURN_IF_ERROR(use_port(router["control_port"]));
  const bool broker_on = broker["enabled"].AsBool();
  if (broker_on) {
    PW_RETURN_IF_ERROR(use_port(broker["control_port"]));
    PW_RETURN_IF_ERROR(use_port(broker["metrics_port"]));
  }
  const std::string router_ep = "tcp://" + out.host + ":" + std::to_string(router["control_port"].AsInt());
  const std::string broker_ep = "tcp://" + out.host + ":" + std::to_string(broker["control_port"].AsInt());
  auto name_args = [&](std::vector<std::string>* a) {
    if (!model_name.empty()) {
      a->push_back("--model-name");
      a->push_back(model_name);
    }
  };

  if (broker_on) {
    ProcessSpec b{"broker", {bin + "/pw-broker", "--model", out.model_dir, "--bind", broker_ep,
                             "--heartbeat-ms", hb}, 0, 2};
    if (broker["metrics_port"].AsInt() != 0) {
      b.argv.push_back("--metrics");
      b.argv.push_back(out.host + ":" + std::to_string(broker["metrics_port"].AsInt()));
      out.scrape_targets.push_back({"broker", "broker", b.argv.back()});
    }
    if (broker.Has("store")) {
      b.argv.insert(b.argv.end(), {"--store", broker["store"].AsString(), "--initial-bits",
                                   std::to_string(broker["initial_bits"].AsInt())});
    }
    const ConfigValue& pl = broker["planner"];
    if (pl["enabled"].AsBool()) {
      if (!broker.Has("store")) return pl["enabled"].Error("the planner needs broker.store (an .apw store)");
      b.argv.insert(b.argv.end(), {"--planner", "--planner-low", std::to_string(pl["low_watermark"].AsDouble()),
                                   "--planner-high", std::to_string(pl["high_watermark"].AsDouble()),
                                   "--planner-headroom", std::to_string(pl["headroom"].AsDouble()),
                                   "--planner-hot-floor", std::to_string(pl["hot_floor_bits"].AsInt()),
                                   "--planner-min-bits", std::to_string(pl["min_bits"].AsInt()),
                                   "--planner-max-bits", std::to_string(pl["max_bits"].AsInt()),
                                   "--planner-min-mean-bits", std::to_string(pl["min_mean_bits"].AsDouble()),
                                   "--planner-live-mass-weight", std::to_string(pl["live_mass_weight"].AsDouble()),
                                   "--planner-max-mean-bits", std::to_string(pl["max_mean_bits"].AsDouble()),
                                   "--planner-max-bytes", std::to_string(pl["max_bytes_per_decision"].AsInt()),
                                   "--planner-min-interval-ms", std::to_string(pl["min_interval_ms"].AsInt()),
                                   "--planner-interval-ms", std::to_string(pl["interval_ms"].AsInt())});
      if (pl["static"].AsBool()) b.argv.push_back("--planner-static");
      if (!pl["use_routing"].AsBool()) b.argv.push_back("--planner-no-routing");
      if (pl.Has("residuals")) b.argv.insert(b.argv.end(), {"--planner-residuals", pl["residuals"].AsString()});
      if (!pl["use_residuals"].AsBool()) b.argv.push_back("--planner-no-residuals");
    }
    name_args(&b.argv);
    out.processes.push_back(std::move(b));
  }
  ProcessSpec r{"router", {bin + "/pw-router", "--model", out.model_dir, "--host", out.host,
                           "--port", std::to_string(router["port"].AsInt()), "--workers", router_ep,
                           "--heartbeat-ms", hb, "--lease-ms",
                           std::to_string(router["lease_ms"].AsInt()), "--max-waiting",
                           std::to_string(router["max_waiting"].AsInt()), "--max-queued-kv",
                           std::to_string(router["max_queued_kv"].AsDouble()), "--drain-timeout-ms",
                           std::to_string(out.drain_timeout_ms)}, 1, 0};
  name_args(&r.argv);
  out.scrape_targets.push_back(
      {"router", "router", out.host + ":" + std::to_string(router["port"].AsInt())});
  out.processes.push_back(std::move(r));
  for (const char* kind : {"prefill", "decode"}) {
    for (const auto& w : cfg[kind].Items()) {
      const std::string id = w["id"].AsString();
      if (!ids.insert(id).second) return w["id"].Error("id '" + id + "' is used twice");
      PW_RETURN_IF_ERROR(use_port(w["metrics_port"]));
      ProcessSpec p{id, {bin + (kind[0] == 'p' ? "/pw-prefill" : "/pw-decode"), "--model",
                         out.model_dir, "--router", router_ep, "--id", id, "--kv-blocks",
                         std::to_string(w["kv_blocks"].AsInt()), "--threads",
                         std::to_string(w["threads"].AsInt()), "--max-batch-tokens",
                         std::to_string(w["max_batch_tokens"].AsInt()), "--heartbeat-ms", hb,
                         "--kv-dtype", cfg["kv_dtype"].AsString()}, 2, 1};
      if (w["no_mmap"].AsBool()) p.argv.push_back("--no-mmap");
      if (kind[0] == 'd') {
        p.argv.push_back("--max-batch");
        p.argv.push_back(std::to_string(w["max_batch"].AsInt()));
        if (w["reserve_wait_ms"].AsInt() > 0) {
          p.argv.insert(p.argv.end(), {"--reserve-wait-ms", std::to_string(w["reserve_wait_ms"].AsInt())});
        }
        if (w["demand_horizon_tokens"].AsInt() > 0) {
          p.argv.insert(p.argv.end(), {"--demand-horizon-tokens", std::to_string(w["demand_horizon_tokens"].AsInt())});
        }
        const ConfigValue& planner = cfg["broker"]["planner"];
        if (broker_on && planner["enabled"].AsBool() && !planner["async_movement"].AsBool()) {
          p.argv.push_back("--plans-at-request-boundaries");
        }
        if (broker_on && planner["enabled"].AsBool()) {  // held reservations respect its floors
          p.argv.insert(p.argv.end(), {"--planner-min-bits", std::to_string(planner["min_bits"].AsInt()),
                                       "--planner-max-bits", std::to_string(planner["max_bits"].AsInt()),
                                       "--planner-min-mean-bits", std::to_string(planner["min_mean_bits"].AsDouble())});
        }
        p.argv.insert(p.argv.end(), {"--pool-bytes", std::to_string(w["pool_mb"].AsInt() << 20),
                                     "--page-bytes", std::to_string(w["page_bytes"].AsInt()),
                                     "--weight-rate-mb-s", std::to_string(w["weight_rate_mb_s"].AsInt())});
        if (w["weight_pacing"].AsString() != "auto") {  // pw-decode's default
          p.argv.insert(p.argv.end(), {"--weight-pacing", w["weight_pacing"].AsString()});
        }
        const ConfigValue& lynx = w["lynx"];
        if (lynx["enabled"].AsBool()) {
          p.argv.insert(p.argv.end(), {"--lynx", "--lynx-gate-weights", lynx["gate_weights"].AsString()});
          if (lynx["beta"].AsInt() >= 0) {
            p.argv.insert(p.argv.end(), {"--lynx-alpha", std::to_string(lynx["alpha"].AsDouble()),
                                         "--lynx-beta", std::to_string(lynx["beta"].AsInt())});
          }
          if (lynx.Has("exempt_layers") && !lynx["exempt_layers"].Items().empty()) {
            std::string layers;
            for (const auto& l : lynx["exempt_layers"].Items()) {
              if (!layers.empty()) layers += ',';
              layers += std::to_string(l.AsInt());
            }
            p.argv.insert(p.argv.end(), {"--lynx-exempt", layers});
          }
        }
        const ConfigValue& misses = w["misses"];
        for (const char* key : {"policy", "eviction", "threshold", "blind_fraction", "admission_beta",
                                "admission_delay", "decay", "residency", "residency_bytes"}) {
          if (!misses.Has(key)) continue;
          std::string flag = key;
          std::replace(flag.begin(), flag.end(), '_', '-');
          const bool budget = flag.rfind("residency", 0) == 0;
          p.argv.push_back(budget ? "--" + flag : "--miss-" + flag);
          const ConfigValue& v = misses[key];
          if (v.kind() == ConfigValue::Kind::kString) {
            p.argv.push_back(v.AsString());
          } else if (v.kind() == ConfigValue::Kind::kInt) {
            p.argv.push_back(std::to_string(v.AsInt()));
          } else {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.17g", v.AsDouble());
            p.argv.push_back(buf);
          }
        }
        if (w.Has("trace")) {
          const ConfigValue& t = w["trace"];
          char mb[32];
          std::snprintf(mb, sizeof mb, "%.17g", t["max_mb"].AsDouble());
          p.argv.insert(p.argv.end(), {"--record-trace", t["path"].AsString(), "--trace-max-mb", mb,
                                       "--trace-sample", std::to_string(t["sample"].AsInt())});
        }
      }
      if (broker_on) {
        p.argv.push_back("--broker");
        p.argv.push_back(broker_ep);
      }
      if (w["metrics_port"].AsInt() != 0) {
        p.argv.push_back("--metrics");
        p.argv.push_back(out.host + ":" + std::to_string(w["metrics_port"].AsInt()));
        out.scrape_targets.push_back({id, kind, p.argv.back()});
      }
      name_args(&p.argv);
      out.processes.push_back(std::move(p));
    }
  }
  return out;
}

}  // namespace pw::cluster
