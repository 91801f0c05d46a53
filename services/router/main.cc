// pw-router: the OpenAI-compatible HTTP front end of a PagedWeight cluster. Its options are
// declared in router_options.h: flags, or `--config FILE` (the node file's router section).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "services/common/node_config.h"
#include "services/router/api_keys.h"
#include "services/router/router_app.h"
#include "services/router/router_options.h"
#include "services/transport/control_auth.h"
#include "services/transport/service_setup.h"

int main(int argc, char** argv) {
  pw::router::RouterAppOptions o;
  CLI::App app{"pw-router: OpenAI-compatible HTTP router for PagedWeight workers"};
  pw::options::OptionSet options;
  pw::router::DeclareRouterOptions(&options, &o);
  options.AddToCli(&app);
  pw::service::ConfigFlags config;
  pw::service::AddConfigFlags(&app, &config);
  pw::transport::ServiceSecurityFlags security;
  app.add_option("--control-keys", security.control_keys, pw::transport::kControlKeysHelp);
  app.add_flag("--insecure", security.insecure, pw::transport::kInsecureHelp);
  CLI11_PARSE(app, argc, argv);
  if (pw::Status s = pw::service::ApplyNodeConfig(config, pw::service::Role::kRouter, &options); !s.ok()) {
    std::fprintf(stderr, "pw-router: %s\n", s.message().c_str());
    return 2;
  }
  if (config.print) {
    std::printf("%s", options.DumpYaml().c_str());
    return 0;
  }
  auto keys = pw::router::LoadApiKeys(o.api_keys, o.api_key_file, std::getenv(pw::router::kApiKeyEnv));
  if (!keys.ok()) {
    std::fprintf(stderr, "pw-router: %s\n", keys.status().ToString().c_str());
    return 1;
  }
  o.router.api_keys = std::move(*keys);
  if (pw::Status s = pw::transport::SetUpServiceTransport(security, "pw-router", o.cluster.bind);
      !s.ok()) {
    std::fprintf(stderr, "pw-router: %s\n", s.message().c_str());
    return 2;
  }
  return pw::router::RunRouterApp(std::move(o));
}
