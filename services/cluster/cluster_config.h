// What pw-cluster derives from the node file (services/common/node_config.h,
// deploy/local.yaml): one node's processes with their command lines.
//
// Every process is started as `<bin_dir>/pw-<kind> --config <the file> --section <name>` (plus
// the control keys, control_keys.h): it reads the same file as the launcher, so the launcher
// passes none of its options. LoadClusterConfig checks the file's wiring (ports, ids, the
// launcher's keys; errors carry file:line:col and the key path); CheckProcesses then has every
// process check its own section (`--print-config`) before anything starts. Ports and ids must
// be distinct. Relative paths are relative to the current directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/common/node_config.h"

namespace pw::cluster {

using service::RestartPolicy;
using service::Role;

// One process pw-cluster starts.
struct ProcessSpec {
  std::string name;               // "router", "broker", "prefill-0", ...
  std::vector<std::string> argv;  // argv[0] is the binary path
  int start_order = 0;            // lower starts first
  int stop_order = 0;             // lower gets SIGTERM first (router 0, workers 1, broker 2)
  Role role = Role::kRouter;
};

// A process's Prometheus endpoint (those with one: the router, and the broker and workers given
// a metrics_port).
struct ScrapeTarget {
  std::string process;    // ProcessSpec::name
  std::string role;       // router | broker | prefill | decode
  std::string host_port;  // "127.0.0.1:9101"; GET /metrics there
};

struct ClusterConfig {
  std::string config_path;  // the node file, absolute: every process reads it
  std::string model_dir;
  std::string model_name;  // what clients send as "model": the file's, else the directory's name
  std::string host = "127.0.0.1";
  std::string run_dir;
  int64_t http_port = 0;  // the router's (router_options.h: port)
  int64_t drain_timeout_ms = 30000;
  RestartPolicy restart;
  std::vector<ProcessSpec> processes;
  std::vector<ScrapeTarget> scrape_targets;
};

// Loads and validates `path` (errors carry file:line:col and the key path) and builds the
// process list. `default_bin_dir` is used when the file has no bin_dir.
Result<ClusterConfig> LoadClusterConfig(const std::string& path, const std::string& default_bin_dir);

// Runs every process's command line with --print-config: each loads the file as it will when
// started and prints its effective options. Returns them all (`<name>:  # <role>` then its
// options indented), or the first process's error (kInvalidArgument naming it, with what it
// printed). `pw-cluster config --dump` prints this; `pw-cluster up` runs it before starting.
Result<std::string> CheckProcesses(const ClusterConfig& cfg);

}  // namespace pw::cluster
