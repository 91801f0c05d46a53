// pw-broker: the node's memory broker (services/broker/broker.h). SIGTERM/SIGINT stop it. Its
// options are declared in broker_options.h: flags, or `--config FILE` (the node file's broker
// section).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/logging.h"
#include "services/broker/broker.h"
#include "services/broker/broker_options.h"
#include "services/common/node_config.h"
#include "services/common/stop_signals.h"
#include "services/transport/control_auth.h"
#include "services/transport/service_setup.h"

int main(int argc, char** argv) {
  pw::broker::BrokerOptions o;
  CLI::App app{"PagedWeight memory broker"};
  pw::options::OptionSet options;
  pw::broker::DeclareBrokerOptions(&options, &o);
  options.AddToCli(&app);
  pw::service::ConfigFlags config;
  pw::service::AddConfigFlags(&app, &config);
  pw::transport::ServiceSecurityFlags security;
  app.add_option("--control-keys", security.control_keys, pw::transport::kControlKeysHelp);
  app.add_flag("--insecure", security.insecure, pw::transport::kInsecureHelp);
  CLI11_PARSE(app, argc, argv);
  pw::Status st = pw::service::ApplyNodeConfig(config, pw::service::Role::kBroker, &options);
  if (st.ok()) st = o.planner.Validate();
  if (!st.ok()) {
    std::fprintf(stderr, "pw-broker: %s\n", st.message().c_str());
    return 2;
  }
  if (config.print) {
    std::printf("%s", options.DumpYaml().c_str());
    return 0;
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
  st = (*b)->Run(pw::service::StopFlag());
  return st.ok() ? 0 : 1;
}
