// pw-prefill: prefill worker (services/workers/prefill/prefill_worker.h). SIGTERM/SIGINT drain.
// Its options are declared in prefill_options.h: flags, or `--config FILE` (its entry in the
// node file's prefill list, by --section or --id).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/logging.h"
#include "services/common/node_config.h"
#include "services/common/stop_signals.h"
#include "services/transport/control_auth.h"
#include "services/transport/service_setup.h"
#include "services/workers/common/kernel_options.h"
#include "services/workers/common/kernel_report.h"
#include "services/workers/prefill/prefill_options.h"
#include "services/workers/prefill/prefill_worker.h"

int main(int argc, char** argv) {
  pw::workers::PrefillWorkerOptions o;
  CLI::App app{"PagedWeight prefill worker"};
  pw::options::OptionSet options;
  pw::workers::DeclarePrefillOptions(&options, &o);
  pw::cpu::KernelSettings kernels;
  pw::workers::DeclareKernelOptions(&options, &kernels);
  options.AddToCli(&app);
  pw::service::ConfigFlags config;
  pw::service::AddConfigFlags(&app, &config);
  pw::transport::ServiceSecurityFlags security;
  app.add_option("--control-keys", security.control_keys, pw::transport::kControlKeysHelp);
  app.add_flag("--insecure", security.insecure, pw::transport::kInsecureHelp);
  CLI11_PARSE(app, argc, argv);
  if (pw::Status s = pw::service::ApplyNodeConfig(config, pw::service::Role::kPrefill, &options); !s.ok()) {
    std::fprintf(stderr, "pw-prefill: %s\n", s.message().c_str());
    return 2;
  }
  kernels = pw::workers::ApplyKernelOptions(kernels);  // before any kernel runs
  if (config.print) {
    std::printf("%s", options.DumpYaml().c_str());
    return 0;
  }
  pw::SetLogProcessTag(o.id.empty() ? "prefill" : o.id);
  PW_LOG(INFO) << pw::workers::KernelBackendsLine();
  if (o.router_endpoints.empty()) {
    std::fprintf(stderr, "pw-prefill: router is required (--router or the key router of --config)\n");
    return 2;
  }
  if (pw::Status s = pw::transport::SetUpServiceTransport(security, "pw-prefill", o.router_endpoints.front(), o.advertise_host); !s.ok()) {
    std::fprintf(stderr, "pw-prefill: %s\n", s.message().c_str());
    return 2;
  }
  pw::service::InstallStopHandlers();
  auto w = pw::workers::PrefillWorker::Create(o);
  if (!w.ok()) {
    std::fprintf(stderr, "pw-prefill: %s\n", w.status().ToString().c_str());
    return 1;
  }
  pw::Status st = (*w)->Run(pw::service::StopFlag());
  if (!st.ok()) {
    std::fprintf(stderr, "pw-prefill: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
