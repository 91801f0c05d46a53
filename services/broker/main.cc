// pw-broker: the node's memory broker (services/broker/broker.h). SIGTERM/SIGINT stop it.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/logging.h"
#include "services/transport/control_auth.h"
#include "services/transport/service_setup.h"
#include "services/broker/broker.h"
#include "services/common/stop_signals.h"

int main(int argc, char** argv) {
  pw::broker::BrokerOptions o;
  CLI::App app{"PagedWeight memory broker"};
  app.add_option("--model", o.model_dir, "model directory (config.json, *.safetensors)")->required();
  app.add_option("--model-name", o.model_name, "model name workers must serve");
  app.add_option("--bind", o.bind, "control endpoint (ZeroMQ ROUTER)");
  app.add_option("--heartbeat-ms", o.heartbeat_ms, "heartbeat interval")->check(CLI::Range(10, 60000));
  app.add_option("--metrics", o.metrics_bind, "Prometheus bind address, e.g. 127.0.0.1:9102");
  app.add_option("--store", o.store_path, "any-precision .apw store to serve (default: the checkpoint's bf16 experts)");
  app.add_option("--initial-bits", o.initial_bits, "width of every expert block until a plan changes it")
      ->check(CLI::Range(3, 8));
  pw::transport::ServiceSecurityFlags security;
  app.add_option("--control-keys", security.control_keys, pw::transport::kControlKeysHelp);
  app.add_flag("--insecure", security.insecure, pw::transport::kInsecureHelp);
  auto& pl = o.planner;
  app.add_flag("--planner", pl.enabled, "run the quality-aware planner (needs --store)");
  app.add_flag("--planner-static", pl.static_mode, "ablation: the planner never changes widths");
  app.add_flag("--planner-no-routing", [&pl](int64_t) { pl.use_routing = false; },
               "ablation: no routing statistics (every expert average, no hot floor)");
  app.add_option("--planner-residuals", o.planner_residuals,
                 "prompt residual heads beside the store (pw-quantize residuals)");
  app.add_flag("--planner-no-residuals", [&pl](int64_t) { pl.use_prompt_residuals = false; },
               "ablation: no prompt residuals (every step's prompt factor is 1)");
  app.add_option("--planner-low", pl.low_watermark, "low watermark, fraction of the pool free");
  app.add_option("--planner-high", pl.high_watermark, "high watermark, fraction of the pool free");
  app.add_option("--planner-headroom", pl.headroom, "fraction of the pool freed beyond the shortfall");
  app.add_option("--planner-hot-floor", pl.hot_floor_bits, "lowest width of a hot expert");
  app.add_option("--planner-min-bits", pl.min_bits, "lowest width the planner lowers a block to");
  app.add_option("--planner-max-bits", pl.max_bits, "highest width the planner raises a block to");
  app.add_option("--planner-min-mean-bits", pl.min_mean_bits, "lowest mean width the planner lowers to (0: none)");
  app.add_option("--planner-live-mass-weight", pl.live_mass_weight,
                 "weight of the live routing mass against the calibration share (0..1)");
  app.add_option("--planner-max-mean-bits", pl.max_mean_bits,
                 "highest mean width the planner raises to; a higher mean is lowered to it (0: none)");
  app.add_option("--planner-max-bytes", pl.max_bytes_per_decision, "bytes one decision may move (0 = no limit)");
  app.add_option("--planner-min-interval-ms", pl.min_interval_ms, "least time between two changes");
  app.add_option("--planner-interval-ms", pl.interval_ms, "how often the planner runs");
  CLI11_PARSE(app, argc, argv);
  if (pw::Status st = pl.Validate(); !st.ok()) {
    std::fprintf(stderr, "pw-broker: %s\n", st.ToString().c_str());
    return 1;
  }
  pw::SetLogProcessTag("broker");
  if (pw::Status s = pw::transport::SetUpServiceTransport(security, "pw-broker", o.bind); !s.ok()) {
    std::fprintf(stderr, "pw-broker: %s\n", s.message().c_str());
    return 2;
  }
  pw::service::InstallStopHandlers();
  auto b = pw::broker::Broker::Create(o);
  if (!b.ok()) {
    std::fprintf(stderr, "pw-broker: %s\n", b.status().ToString().c_str());
    return 1;
  }
  pw::Status st = (*b)->Run(pw::service::StopFlag());
  return st.ok() ? 0 : 1;
}
