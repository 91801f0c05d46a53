// The cluster YAML file (deploy/local.yaml) and what pw-cluster derives from it: one node's
// processes with their command lines.
//
// Schema (every key but model_dir optional; defaults shown in deploy/local.yaml):
//   model_dir: DIR            model_name: NAME            host: 127.0.0.1
//   run_dir: DIR              bin_dir: DIR (default: the directory of pw-cluster)
//   heartbeat_ms: 500         drain_timeout_ms: 30000
//   router:  {port: 8000, control_port: 5555, lease_ms: 30000, max_waiting: 256}
//   broker:  {enabled: true, control_port: 5556, metrics_port: 9100, store, initial_bits: 8,
//             planner: {enabled: false, static: false, use_routing: true, low_watermark: 0.05,
//                       high_watermark: 0.2, headroom: 0.05, hot_floor_bits: 6, min_bits: 3,
//                       max_bits: 8, min_mean_bits: 0, max_mean_bits: 0, live_mass_weight: 1,
//                       async_movement: true,
//                       max_bytes_per_decision: 0, min_interval_ms: 500, interval_ms: 200,
//                       residuals: HEADS.pwrh, use_residuals: true}}
//            (planner: passed as pw-broker --planner ...; enabled needs store)
//   prefill: [{id, kv_blocks, threads, max_batch_tokens, metrics_port}]   (1..64 entries)
//   decode:  [{id, kv_blocks, threads, max_batch_tokens, max_batch, metrics_port,
//              reserve_wait_ms: 0, demand_horizon_tokens: 0,
//              lynx: {enabled: false, alpha, beta, gate_weights: renorm|mass, exempt_layers: []}}]
//            (1..64; lynx alpha/beta omitted = derived from k/N; passed as pw-decode --lynx ...)
//   restart: {initial_backoff_ms: 500, max_backoff_ms: 10000, stable_after_ms: 10000,
//             fail_fast_ms: 5000, fail_fast_exits: 3}
// Ports must be distinct; ids must be distinct. Relative paths are relative to the current
// directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pw::cluster {

// One process pw-cluster starts.
struct ProcessSpec {
  std::string name;               // "router", "broker", "prefill-0", ...
  std::vector<std::string> argv;  // argv[0] is the binary path
  int start_order = 0;            // lower starts first
  int stop_order = 0;             // lower gets SIGTERM first (router 0, workers 1, broker 2)
};

struct RestartPolicy {
  int64_t initial_backoff_ms = 500;   // first restart delay; doubles per quick death
  int64_t max_backoff_ms = 10000;
  int64_t stable_after_ms = 10000;    // a process up this long resets its backoff
  // Fail fast: a process that exits within fail_fast_ms of its start fail_fast_exits times in
  // a row (a bad model directory, a port in use) stops the node instead of being restarted
  // forever; an exit after a longer run resets the count. fail_fast_exits = 0: never.
  int64_t fail_fast_ms = 5000;
  int64_t fail_fast_exits = 3;
};

// A process's Prometheus endpoint (those with one: the router, and the broker and workers given
// a metrics_port).
struct ScrapeTarget {
  std::string process;    // ProcessSpec::name
  std::string role;       // router | broker | prefill | decode
  std::string host_port;  // "127.0.0.1:9101"; GET /metrics there
};

struct ClusterConfig {
  std::string model_dir;
  std::string host = "127.0.0.1";
  std::string run_dir;
  int64_t http_port = 8000;
  int64_t drain_timeout_ms = 30000;
  RestartPolicy restart;
  std::vector<ProcessSpec> processes;
  std::vector<ScrapeTarget> scrape_targets;
};

// Loads and validates `path` (errors carry file:line:col and the key path) and builds the
// process list. `default_bin_dir` is used when the file has no bin_dir.
Result<ClusterConfig> LoadClusterConfig(const std::string& path, const std::string& default_bin_dir);

}  // namespace pw::cluster
