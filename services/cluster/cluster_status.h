// ClusterStatus: which of a cluster file's processes are running on this machine, for
// `pw-cluster status --config FILE`, and the Prometheus scrape targets of that file.
//
// A process counts as running when some /proc/<pid>/cmdline has the arguments pw-cluster would
// start it with (the binary compared by file name, so another build directory still matches).
// A running process with a metrics endpoint is probed with GET /metrics (1 s timeout):
//   state "up" (HTTP 200), "running" (no metrics endpoint configured),
//   "unresponsive" (running, /metrics does not answer 200), "stopped" (no such process).
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

std::vector<ProcessStatus> QueryStatus(const ClusterConfig& cfg);
// One line per process: NAME PID STATE METRICS_URL (aligned columns, a header line first).
std::string FormatStatus(const std::vector<ProcessStatus>& st);
// Prometheus file_sd JSON: one target group per process with a metrics endpoint, labelled
// job="pagedweight", pw_process=<name>, pw_role=<router|broker|prefill|decode>.
std::string PrometheusTargets(const ClusterConfig& cfg);

}  // namespace pw::cluster
