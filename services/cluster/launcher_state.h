// LauncherState: what `pw-cluster up` records about the processes it runs, so that
// `pw-cluster status` finds them by what the launcher started rather than by re-deriving their
// command lines (which the launcher extends, e.g. with --control-keys).
//
// The file is <run_dir>/pw-cluster.state, JSON, rewritten whole (a temp file renamed over it,
// so a reader sees the old or the new record, never a torn one) whenever a child starts, exits
// or is restarted:
//
//   {"version": 1,
//    "launcher": {"pid": 4242, "start_ticks": 8812345},
//    "processes": [{"name": "broker", "pid": 4250, "start_ticks": 8812350, "restarts": 0},
//                  {"name": "decode-0", "pid": -1, "start_ticks": 0, "restarts": 2}, ...]}
//
// start_ticks is field 22 of /proc/<pid>/stat (starttime: clock ticks after boot at which the
// process was forked; exec keeps it). A pid that is alive with another start time was recycled
// by the kernel and is not the recorded process. pid -1: the process is down (awaiting its
// restart, or the node has stopped). The file stays after the node stops, every pid -1.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pw::cluster {

// One process of the node as the launcher last saw it.
struct RecordedProcess {
  std::string name;          // ProcessSpec::name
  pid_t pid = -1;            // -1 when down
  uint64_t start_ticks = 0;  // /proc/<pid>/stat starttime; 0 when down
  int restarts = 0;          // restarts since `pw-cluster up`
};

struct LauncherState {
  static constexpr int kVersion = 1;
  pid_t launcher_pid = -1;  // the `pw-cluster up` process
  uint64_t launcher_start_ticks = 0;
  std::vector<RecordedProcess> processes;  // in start order
};

// <run_dir>/pw-cluster.state
std::string LauncherStatePath(const std::string& run_dir);

// Writes `state` to `path` atomically (path.tmp.<pid>, fsync, rename).
Status WriteLauncherState(const std::string& path, const LauncherState& state);
// Reads and validates the file: NotFound when it does not exist, Corrupt (naming the file and
// what is wrong) when it is not a state file of this version.
Result<LauncherState> ReadLauncherState(const std::string& path);

// Field 22 (starttime) of /proc/<pid>/stat; NotFound when there is no such process.
Result<uint64_t> ProcessStartTicks(pid_t pid);
// True when `pid` is a live process (not a zombie) forked at `start_ticks`.
bool IsRecordedProcessRunning(pid_t pid, uint64_t start_ticks);

}  // namespace pw::cluster
