// pw-cluster: starts, supervises and stops one node's processes from one YAML file.
//
//   pw-cluster up --config deploy/local.yaml [--run-dir DIR] [--insecure]
//   pw-cluster keys --out FILE     (fresh control-plane keys, for processes started by hand)
//   pw-cluster status --config deploy/local.yaml [--run-dir DIR] [--prometheus-targets FILE]
//   pw-cluster config --dump --config deploy/local.yaml
//
// status prints one line per process of the file (name, pid, state, metrics URL), found from the
// state file `up` keeps in the run directory, and exits 0 when every process is up, 1
// otherwise, 2 when the file or the run directory's state file cannot be read; --prometheus-targets
// also writes the file's scrape targets as Prometheus file_sd JSON.
//
// config --dump prints the effective options of every process of the file (defaults filled in),
// as each process prints them (--print-config) from the same file (services/common/node_config.h);
// `up` runs the same check first and starts nothing when a process refuses its options.
//
// `up` writes fresh control-plane keys to <run_dir>/control.keys (0600) and passes them to
// every child; --insecure (tests only) runs the control plane unauthenticated instead.
// SIGINT/SIGTERM drain the cluster (router, then workers, then broker) and exit 0. A process
// that exits within its first seconds 3 times in a row (restart.fail_fast_*) stops the node:
// its command line and the last lines of its log are printed, and the exit code is 3.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdio>
#include <fstream>
#include <string>

#include "common/logging.h"
#include "services/cluster/cluster_config.h"
#include "services/cluster/control_keys.h"
#include "services/cluster/cluster_status.h"
#include "services/cluster/supervisor.h"
#include "services/transport/curve_keys.h"
#include "services/common/self_dir.h"
#include "services/common/stop_signals.h"

int main(int argc, char** argv) {
  CLI::App app{"pw-cluster: run one PagedWeight node"};
  app.require_subcommand(1);
  std::string config_path, run_dir;
  auto* up = app.add_subcommand("up", "start the node's processes and supervise them");
  up->add_option("--config", config_path, "cluster YAML file")->required();
  up->add_option("--run-dir", run_dir, "directory for per-process logs (overrides run_dir)");
  bool insecure = false;
  up->add_flag("--insecure", insecure,
               "unauthenticated control plane: any local process can pose as a worker (tests only)");
  std::string keys_out;
  auto* keys = app.add_subcommand("keys", "write fresh control-plane keys (mode 0600)");
  keys->add_option("--out", keys_out, "key file to write")->required();
  std::string targets_path;
  auto* status =
      app.add_subcommand("status", "one line per process: name, pid, state, metrics URL");
  status->add_option("--config", config_path, "cluster YAML file")->required();
  status->add_option("--run-dir", run_dir, "the run directory given to `up` (overrides run_dir)");
  status->add_option("--prometheus-targets", targets_path,
                     "also write the Prometheus file_sd targets of the file here");
  bool dump = false;
  auto* config = app.add_subcommand("config", "check the file and print every process's effective options");
  config->add_option("--config,file", config_path, "cluster YAML file")->required();
  config->add_flag("--dump", dump, "print the effective options of every process as YAML")->required();
  CLI11_PARSE(app, argc, argv);
  pw::SetLogProcessTag("cluster");
  if (keys->parsed()) {
    auto k = pw::transport::GenerateCurveKeys();
    pw::Status st = k.ok() ? pw::transport::WriteCurveKeys(keys_out, *k) : k.status();
    if (!st.ok()) {
      std::fprintf(stderr, "pw-cluster: %s\n", st.message().c_str());
      return 1;
    }
    return 0;
  }
  auto cfg = pw::cluster::LoadClusterConfig(config_path, pw::service::SelfDir());
  if (!cfg.ok()) {
    std::fprintf(stderr, "pw-cluster: %s\n", cfg.status().message().c_str());
    return 2;
  }
  if (!run_dir.empty()) cfg->run_dir = run_dir;
  if (config->parsed() || up->parsed()) {  // every process checks its own options first
    auto text = pw::cluster::CheckProcesses(*cfg);
    if (!text.ok()) {
      std::fprintf(stderr, "pw-cluster: %s\n", text.status().message().c_str());
      return 2;
    }
    if (config->parsed()) {
      std::printf("%s", text->c_str());
      return 0;
    }
  }
  if (status->parsed()) {
    if (!targets_path.empty()) {
      std::ofstream f(targets_path);
      f << pw::cluster::PrometheusTargets(*cfg);
      if (!f) {
        std::fprintf(stderr, "pw-cluster: cannot write '%s'\n", targets_path.c_str());
        return 2;
      }
    }
    const auto st = pw::cluster::QueryStatus(*cfg);
    if (!st.ok()) {
      std::fprintf(stderr, "pw-cluster: %s\n", st.status().message().c_str());
      return 2;
    }
    std::printf("%s", pw::cluster::FormatStatus(*st).c_str());
    for (const auto& s : *st) {
      if (s.state != "up" && s.state != "running") return 1;
    }
    return 0;
  }
  if (pw::Status st = pw::cluster::PrepareControlKeys(&*cfg, insecure); !st.ok()) {
    std::fprintf(stderr, "pw-cluster: %s\n", st.message().c_str());
    return 1;
  }
  pw::service::InstallStopHandlers();
  pw::cluster::Supervisor sup(cfg->processes, cfg->restart, cfg->run_dir, cfg->drain_timeout_ms);
  pw::Status st = sup.Start();
  if (!st.ok()) {
    std::fprintf(stderr, "pw-cluster: %s\n", st.ToString().c_str());
    sup.Stop();
    return 1;
  }
  const std::string url = "http://" + cfg->host + ":" + std::to_string(cfg->http_port);
  std::printf("PagedWeight is starting at %s (logs in %s)\n", url.c_str(), cfg->run_dir.c_str());
  std::printf(
      "Try:\n  curl %s/v1/completions -H 'Content-Type: application/json' \\\n"
      "    -d '{\"model\": \"%s\", \"prompt\": \"The sea\", \"max_tokens\": 32}'\n",
      url.c_str(), cfg->model_name.c_str());
  std::fflush(stdout);
  pw::Status run = sup.Run(pw::service::StopFlag());
  if (!run.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "pw-cluster: %s\npw-cluster: node stopped\n", run.message().c_str());
    return 3;
  }
  std::printf("PagedWeight stopped\n");
  return 0;
}
