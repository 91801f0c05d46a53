// ClusterStatus: which of a cluster file's processes are running on this machine, for
// `pw-cluster status --config FILE`, and the Prometheus scrape targets of that file.
//
// The processes are the ones `pw-cluster up` recorded in <cfg.run_dir>/pw-cluster.state
// (launcher_state.h): a process counts as running when its recorded pid is alive and was
// started at the recorded time (so a recycled pid is not taken for it). A running process with
// a metrics endpoint is probed with GET /metrics (1 s timeout):
//   state "up" (HTTP 200), "running" (no metrics endpoint configured),
//   "unresponsive" (running, /metrics does not answer 200), "stopped" (down, or its pid gone).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "services/cluster/cluster_config.h"

namespace pw::cluster {

struct ProcessStatus {
  std::string name;
  pid_t pid = -1;           // -1 when stopped
  std::string state;        // up | running | unresponsive | stopped
  std::string metrics_url;  // "" when the process has no metrics endpoint
};

// One entry per process of `cfg`, in the file's order. Errors: NotFound when the run directory
// has no state file (no `pw-cluster up` ran there), Corrupt when it cannot be read, and
// InvalidArgument when it records other processes than `cfg` has (started from another file).
Result<std::vector<ProcessStatus>> QueryStatus(const ClusterConfig& cfg);
// One line per process: NAME PID STATE METRICS_URL (aligned columns, a header line first).
std::string FormatStatus(const std::vector<ProcessStatus>& st);
// Prometheus file_sd JSON: one target group per process with a metrics endpoint, labelled
// job="pagedweight", pw_process=<name>, pw_role=<router|broker|prefill|decode>.
std::string PrometheusTargets(const ClusterConfig& cfg);

}  // namespace pw::cluster
