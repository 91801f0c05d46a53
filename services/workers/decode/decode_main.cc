// pw-decode: decode worker (services/workers/decode/decode_worker.h). SIGTERM/SIGINT drain.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/logging.h"
#include "services/transport/control_auth.h"
#include "services/transport/service_setup.h"
#include "services/workers/decode/decode_worker.h"
#include "kernels/anyprec/q8.h"
#include "services/workers/common/kernel_report.h"
#include "services/common/stop_signals.h"
#include "policies/misses/miss_flags.h"

int main(int argc, char** argv) {
  pw::workers::DecodeWorkerOptions o;
  CLI::App app{"PagedWeight decode worker"};
  app.add_option("--model", o.model_dir, "model directory (config.json, *.safetensors)")->required();
  app.add_option("--router", o.router_endpoint, "router control endpoint, e.g. tcp://127.0.0.1:5555")->required();
  app.add_option("--broker", o.broker_endpoint, "broker control endpoint (experts come from it); empty = checkpoint");
  app.add_option("--id", o.id, "worker id (default decode-<pid>)");
  app.add_option("--model-name", o.model_name, "model name reported to the router");
  app.add_option("--kv-blocks", o.num_kv_blocks, "KV pool blocks")->check(CLI::Range(1, 1 << 24));
  app.add_option("--block-size", o.block_size, "tokens per KV block")->check(CLI::Range(1, 4096));
  app.add_option("--threads", o.threads, "compute threads")->check(CLI::Range(1, 1024));
  app.add_flag("--no-mmap", o.copy_weights,
               "read the checkpoint into this process's memory instead of mapping it (llama.cpp's --no-mmap)");
  app.add_option("--max-batch-tokens", o.max_batch_tokens, "tokens per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-batch", o.max_batch, "running sequences")->check(CLI::Range(1, 1 << 16));
  app.add_option("--heartbeat-ms", o.heartbeat_ms, "heartbeat interval")->check(CLI::Range(10, 60000));
  app.add_option("--quarantine-max-ms", o.quarantine_max_ms,
                 "quarantined KV blocks return to the pool after this long without the router's word")
      ->check(CLI::Range(1, 86400000));
  app.add_option("--router-lost-quarantine-ms", o.router_lost_quarantine_ms,
                 "... or this long once the router is lost")
      ->check(CLI::Range(1, 86400000));
  app.add_option("--metrics", o.metrics_bind, "Prometheus bind address, e.g. 127.0.0.1:9101");
  std::string kv_dtype = "bf16";
  app.add_option("--kv-dtype", kv_dtype, "KV elements")->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--pool-bytes", o.pool_bytes,
                 "page pool budget shared by KV and expert planes (0: kv-blocks of KV plus every expert at 8 bits)");
  app.add_option("--page-bytes", o.page_bytes, "page size (0: one layer of one KV block)");
  uint64_t rate_mb_s = 0;
  app.add_option("--weight-rate-mb-s", rate_mb_s, "plane transfer rate limit in MiB/s (0: none)");
  app.add_option("--weight-max-in-flight", o.weight_max_in_flight, "expert width changes in flight")
      ->check(CLI::Range(1, 4096));
  std::string pacing = "auto";
  app.add_option("--weight-pacing", pacing,
                 "background width changes give way to the step: free, fetches (while a synchronous fetch runs), "
                 "steps (for every whole step) or auto (steps with a residency budget, else free)")
      ->check(CLI::IsMember({"free", "fetches", "steps", "auto"}));
  app.add_option("--reserve-wait-ms", o.reserve_wait_ms,
                 "a KV reservation that fits only after lowering expert widths waits up to this long (0: answered at once)")
      ->check(CLI::Range(0, 20000));
  app.add_option("--planner-min-bits", o.lower_floors.min_bits,
                 "the broker planner's lowest width: a reservation is held only if lowering to it makes room; "
                 "given (with the other --planner-* floors), the KV capacity the router admits against counts "
                 "what lowering to them frees")
      ->check(CLI::Range(pw::anyprec::kMinBits, pw::anyprec::kMaxBits));
  app.add_option("--planner-max-bits", o.lower_floors.max_bits, "the broker planner's highest width")
      ->check(CLI::Range(pw::anyprec::kMinBits, pw::anyprec::kMaxBits));
  app.add_option("--planner-min-mean-bits", o.lower_floors.min_mean_bits,
                 "the broker planner's floor on the mean width (0: none)")
      ->check(CLI::Range(0.0, static_cast<double>(pw::anyprec::kMaxBits)));
  app.add_option("--demand-horizon-tokens", o.demand_horizon_tokens,
                 "KV demand counts each request's next this many tokens only (0: its growth to max_tokens)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_flag("--plans-at-request-boundaries", o.plans_at_request_boundaries,
               "ablation: expert width changes only where a request joins or leaves the batch");
  app.add_flag("--lynx", o.lynx, "LYNX: remap decode batches' expert choices (pagedweight_lynx_*)");
  float lynx_alpha = 0.f;
  int lynx_beta = -1;
  std::string lynx_gate = "renorm";
  app.add_option("--lynx-alpha", lynx_alpha, "LYNX bins per logit (default from k/N)");
  app.add_option("--lynx-beta", lynx_beta, "LYNX lowest bin -beta (default from k/N)");
  app.add_option("--lynx-gate-weights", lynx_gate, "renorm or mass")->check(CLI::IsMember({"renorm", "mass"}));
  app.add_option("--lynx-exempt", o.lynx_options.exempt_layers, "layers LYNX leaves unchanged")
      ->delimiter(',');
  pw::misses::MissFlags miss;  // a residency budget and its miss policy (paged_residency.h)
  pw::misses::AddMissFlags(&app, &miss, /*with_residency=*/true);
  pw::misses::TraceFlags trace;  // router-logit trace of the served tokens (decode_trace.h)
  pw::misses::AddTraceFlags(&app, &trace);
  pw::transport::ServiceSecurityFlags security;
  app.add_option("--control-keys", security.control_keys, pw::transport::kControlKeysHelp);
  app.add_flag("--insecure", security.insecure, pw::transport::kInsecureHelp);
  CLI11_PARSE(app, argc, argv);
  // Told the planner's floors (pw-cluster passes them when the broker runs the planner): the KV
  // capacity the router admits against counts what lowering to them frees.
  o.planner_lowers = app.count("--planner-min-bits") + app.count("--planner-max-bits") +
                         app.count("--planner-min-mean-bits") > 0;
  o.kv_dtype = kv_dtype == "fp32" ? pw::engine::KvDtype::kF32 : pw::engine::KvDtype::kBf16;
  o.weight_bytes_per_s = rate_mb_s << 20;
  o.weight_pacing = *pw::workers::ParseMoverPacing(pacing);  // checked by CLI11
  if (o.lower_floors.max_bits < o.lower_floors.min_bits) {
    std::fprintf(stderr, "pw-decode: --planner-max-bits is below --planner-min-bits\n");
    return 2;
  }
  if (lynx_alpha != 0.f || lynx_beta >= 0) {
    if (lynx_alpha == 0.f || lynx_beta < 0) {
      std::fprintf(stderr, "pw-decode: --lynx-alpha and --lynx-beta go together\n");
      return 2;
    }
    o.lynx_options.params = pw::lynx::LynxParams{lynx_alpha, lynx_beta};
    if (pw::Status s = pw::lynx::ValidateLynxParams(*o.lynx_options.params); !s.ok()) {
      std::fprintf(stderr, "pw-decode: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  o.lynx_options.gate_weights =
      lynx_gate == "mass" ? pw::lynx::GateWeights::kOriginalMass : pw::lynx::GateWeights::kRenormalize;
  auto miss_settings = pw::misses::MissSettingsFrom(miss);
  if (miss_settings.ok() && !pw::workers::PagedResidency::Enabled(*miss_settings) && !miss_settings->policy.empty()) {
    miss_settings = pw::InvalidArgument("--miss-policy needs --residency F or --residency-bytes N");
  }
  if (miss_settings.ok() && pw::workers::PagedResidency::Enabled(*miss_settings)) {
    if (auto c = pw::misses::ToMissConfig(*miss_settings); !c.ok()) miss_settings = c.status();
    if (o.broker_endpoint.empty()) miss_settings = pw::InvalidArgument("--residency needs --broker (an .apw store)");
  }
  if (!miss_settings.ok()) {
    std::fprintf(stderr, "pw-decode: %s\n", miss_settings.status().ToString().c_str());
    return 2;
  }
  o.misses = *miss_settings;
  if (!trace.path.empty()) {
    if (trace.max_mb <= 0) {
      std::fprintf(stderr, "pw-decode: --record-trace needs --trace-max-mb M > 0 (a serving process's trace is bounded)\n");
      return 2;
    }
    o.trace.path = trace.path;
    o.trace.sample_every = trace.sample;
    o.trace.max_bytes = trace.max_bytes();
  }
  pw::SetLogProcessTag(o.id.empty() ? "decode" : o.id);
  PW_LOG(INFO) << pw::workers::KernelBackendsLine();
  if (!o.broker_endpoint.empty()) {  // expert blocks from the store, at the widths planned
    const std::string warn =
        pw::workers::WideBlockWarning(pw::anyprec::BestQ8Backend(), o.lower_floors.max_bits);
    if (!warn.empty()) PW_LOG(WARNING) << warn;
  }
  if (pw::Status s = pw::transport::SetUpServiceTransport(security, "pw-decode", o.router_endpoint); !s.ok()) {
    std::fprintf(stderr, "pw-decode: %s\n", s.message().c_str());
    return 2;
  }
  pw::service::InstallStopHandlers();
  o.stop = &pw::service::StopFlag();
  auto w = pw::workers::DecodeWorker::Create(o);
  if (!w.ok() && w.status().code() == pw::StatusCode::kCancelled) {
    PW_LOG(INFO) << "stopped before serving: " << w.status().message();
    return 0;
  }
  if (!w.ok()) {
    std::fprintf(stderr, "pw-decode: %s\n", w.status().ToString().c_str());
    return 1;
  }
  pw::Status st = (*w)->Run(pw::service::StopFlag());
  if (!st.ok()) {
    std::fprintf(stderr, "pw-decode: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
