// Supervisor: starts a node's processes, restarts the ones that die (exponential backoff per
// process, reset once a process has stayed up for stable_after_ms), writes one log file per
// process under the run directory, and on Stop() drains: SIGTERM in reverse start order
// (workers, then router, then broker), waiting up to the drain timeout for each group before
// SIGKILL. A process that keeps exiting right after its start (RestartPolicy::fail_fast_*)
// is not restarted: the supervisor fails (failure() names it, its command line and the last
// lines of its log) and Run() stops the node. Every start, exit and restart is recorded in the
// run directory's launcher state file (launcher_state.h), which `pw-cluster status` reads.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/cluster/cluster_config.h"

namespace pw::cluster {

class Supervisor {
 public:
  Supervisor(std::vector<ProcessSpec> specs, RestartPolicy policy, std::string run_dir,
             int64_t drain_timeout_ms);
  ~Supervisor();

  // Creates the run directory, writes the state file (an error if it cannot: status would be
  // blind) and starts every process in start order.
  Status Start();
  // Reaps and restarts until `stop` becomes true or a process fails fast, then drains and
  // returns failure() (Ok after a stop).
  Status Run(const std::atomic<bool>& stop);
  // One supervision pass (reap, schedule and perform restarts; after a failure, nothing).
  // Tests call it directly.
  void Tick();
  // Unavailable once a process has failed fast: "<name> exited N times within T ms of
  // starting (last: code C)", its command line and the last kLogTailLines lines of its log.
  const Status& failure() const { return failure_; }
  static constexpr int kLogTailLines = 20;
  // SIGTERM everything (by stop order), wait, SIGKILL stragglers.
  void Stop();

  struct State {
    ProcessSpec spec;
    pid_t pid = -1;
    uint64_t start_ticks = 0;    // /proc/<pid>/stat starttime of pid
    int restarts = 0;
    int64_t started_ms = 0;
    int64_t restart_at_ms = 0;   // when down: the time of the next start attempt
    int64_t backoff_ms = 0;
    int quick_exits = 0;         // consecutive exits within fail_fast_ms of the start
    std::string log_path;
  };
  const std::vector<State>& states() const { return states_; }
  // <run_dir>/pw-cluster.state
  const std::string& state_path() const { return state_path_; }

 private:
  bool Spawn(State& s);
  // Rewrites the state file from states_.
  Status WriteState();
  // After Start() wrote the file: WriteState(), logging (not failing) when it cannot, since the
  // children are still supervised.
  void RecordState();
  std::vector<State> states_;
  RestartPolicy policy_;
  std::string run_dir_;
  std::string state_path_;
  uint64_t self_start_ticks_ = 0;
  bool recording_ = false;  // Start() wrote the state file
  int64_t drain_timeout_ms_;
  bool stopping_ = false;
  Status failure_ = Status::Ok();
};

// The last `max_lines` lines of the file at `path` (reads at most its last 64 KiB); "" when it
// cannot be read.
std::string LogTail(const std::string& path, int max_lines);

}  // namespace pw::cluster
