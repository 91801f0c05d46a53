// pw-decode: decode worker (services/workers/decode/decode_worker.h). SIGTERM/SIGINT drain. Its
// options are declared in decode_options.h: flags, or `--config FILE` (its entry in the node
// file's decode list, by --section or --id).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/logging.h"
#include "kernels/anyprec/q8.h"
#include "services/common/node_config.h"
#include "services/common/stop_signals.h"
#include "services/transport/control_auth.h"
#include "services/transport/service_setup.h"
#include "services/workers/common/kernel_options.h"
#include "services/workers/common/kernel_report.h"
#include "services/workers/decode/decode_options.h"
#include "services/workers/decode/decode_worker.h"

int main(int argc, char** argv) {
  pw::workers::DecodeProcessOptions p;
  pw::workers::DecodeWorkerOptions& o = p.worker;
  CLI::App app{"PagedWeight decode worker"};
  pw::options::OptionSet options;
  pw::workers::DeclareDecodeOptions(&options, &p);
  options.AddToCli(&app);
  pw::service::ConfigFlags config;
  pw::service::AddConfigFlags(&app, &config);
  pw::transport::ServiceSecurityFlags security;
  app.add_option("--control-keys", security.control_keys, pw::transport::kControlKeysHelp);
  app.add_flag("--insecure", security.insecure, pw::transport::kInsecureHelp);
  CLI11_PARSE(app, argc, argv);
  pw::Status st = pw::workers::LoadDecodeOptions(config, &options, &p);
  if (!st.ok()) {
    std::fprintf(stderr, "pw-decode: %s\n", st.message().c_str());
    return 2;
  }
  p.kernels = pw::workers::ApplyKernelOptions(p.kernels);  // before any kernel runs
  if (config.print) {
    std::printf("%s", options.DumpYaml().c_str());
    return 0;
  }
  pw::SetLogProcessTag(o.id.empty() ? "decode" : o.id);
  PW_LOG(INFO) << pw::workers::KernelBackendsLine();
  if (!o.broker_endpoint.empty()) {  // expert blocks from the store, at the widths planned
    const std::string warn =
        pw::workers::WideBlockWarning(pw::anyprec::BestQ8Backend(), o.lower_floors.max_bits);
    if (!warn.empty()) PW_LOG(WARNING) << warn;
  }
  if (o.router_endpoints.empty()) {
    std::fprintf(stderr, "pw-decode: router is required (--router or the key router of --config)\n");
    return 2;
  }
  if (pw::Status s = pw::transport::SetUpServiceTransport(security, "pw-decode", o.router_endpoints.front(), o.advertise_host); !s.ok()) {
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
  st = (*w)->Run(pw::service::StopFlag());
  if (!st.ok()) {
    std::fprintf(stderr, "pw-decode: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
