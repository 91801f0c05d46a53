#include "services/cluster/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "services/cluster/launcher_state.h"

extern char** environ;

namespace pw::cluster {

namespace {
int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Supervisor::Supervisor(std::vector<ProcessSpec> specs, RestartPolicy policy, std::string run_dir,
                       int64_t drain_timeout_ms)
    : policy_(policy),
      run_dir_(std::move(run_dir)),
      state_path_(LauncherStatePath(run_dir_)),
      drain_timeout_ms_(drain_timeout_ms) {
  std::stable_sort(specs.begin(), specs.end(), [](const ProcessSpec& a, const ProcessSpec& b) {
    return a.start_order < b.start_order;
  });
  for (auto& s : specs) {
    State st;
    st.spec = std::move(s);
    st.backoff_ms = policy_.initial_backoff_ms;
    st.log_path = run_dir_ + "/" + st.spec.name + ".log";
    states_.push_back(std::move(st));
  }
}

Supervisor::~Supervisor() {
  for (auto& s : states_) {
    if (s.pid > 0) {
      kill(s.pid, SIGKILL);
      waitpid(s.pid, nullptr, 0);
    }
  }
}

bool Supervisor::Spawn(State& s) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, s.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (auto& a : s.spec.argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    PW_LOG(ERROR) << "cannot start " << s.spec.name << " (" << s.spec.argv[0]
                  << "): " << std::strerror(rc);
    return false;
  }
  s.pid = pid;
  s.started_ms = NowMs();
  // The child is not reaped yet, so its /proc entry exists even if it already exited.
  auto ticks = ProcessStartTicks(pid);
  s.start_ticks = ticks.ok() ? *ticks : 0;
  if (!ticks.ok()) {
    PW_LOG(ERROR) << "cannot read the start time of " << s.spec.name << " (pid " << pid
                  << "): " << ticks.status().message() << "; status will not find it";
  }
  PW_LOG(INFO) << "started " << s.spec.name << " (pid " << pid << "), log " << s.log_path;
  return true;
}

Status Supervisor::Start() {
  std::error_code ec;
  std::filesystem::create_directories(run_dir_, ec);
  if (ec) return IoError("cannot create run directory '" + run_dir_ + "': " + ec.message());
  for (auto& s : states_) {
    if (access(s.spec.argv[0].c_str(), X_OK) != 0) {
      return NotFound("binary '" + s.spec.argv[0] + "' for " + s.spec.name + " is missing");
    }
  }
  PW_ASSIGN_OR_RETURN(self_start_ticks_, ProcessStartTicks(getpid()));
  PW_RETURN_IF_ERROR(WriteState());
  recording_ = true;
  for (auto& s : states_) {
    const bool started = Spawn(s);
    RecordState();
    if (!started) return Unavailable("cannot start " + s.spec.name);
  }
  return Status::Ok();
}

Status Supervisor::WriteState() {
  LauncherState st;
  st.launcher_pid = getpid();
  st.launcher_start_ticks = self_start_ticks_;
  for (const auto& s : states_) {
    st.processes.push_back({s.spec.name, s.pid, s.pid > 0 ? s.start_ticks : 0, s.restarts});
  }
  return WriteLauncherState(state_path_, st);
}

void Supervisor::RecordState() {
  if (!recording_) return;
  Status st = WriteState();
  if (!st.ok()) PW_LOG(ERROR) << st.message() << "; pw-cluster status will be out of date";
}

std::string LogTail(const std::string& path, int max_lines) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return "";
  constexpr std::streamoff kMaxBytes = 64 * 1024;
  const std::streamoff size = f.tellg();
  const std::streamoff start = std::max<std::streamoff>(0, size - kMaxBytes);
  f.seekg(start);
  std::string text(static_cast<size_t>(size - start), '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(f.gcount()));
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.empty()) return text;
  size_t pos = text.size();
  for (int n = 0; n < max_lines && pos != std::string::npos && pos > 0; ++n) {
    pos = text.rfind('\n', pos - 1);
  }
  return pos == std::string::npos ? text : text.substr(pos + 1);
}

void Supervisor::Tick() {
  if (!failure_.ok()) return;
  const int64_t now = NowMs();
  bool changed = false;  // a child exited or started: the state file is rewritten
  for (auto& s : states_) {
    if (s.pid > 0) {
      int status = 0;
      pid_t r = waitpid(s.pid, &status, WNOHANG);
      if (r != s.pid) continue;
      const int64_t up = now - s.started_ms;
      s.pid = -1;
      changed = true;
      if (stopping_) continue;
      const std::string how = WIFEXITED(status) ? "code " + std::to_string(WEXITSTATUS(status))
                                                : "signal " + std::to_string(WTERMSIG(status));
      s.quick_exits = up < policy_.fail_fast_ms ? s.quick_exits + 1 : 0;
      if (policy_.fail_fast_exits > 0 && s.quick_exits >= policy_.fail_fast_exits) {
        std::string cmd;
        for (const auto& a : s.spec.argv) cmd += (cmd.empty() ? "" : " ") + a;
        std::string indented;
        std::istringstream lines(LogTail(s.log_path, kLogTailLines));
        for (std::string line; std::getline(lines, line);) indented += "  | " + line + "\n";
        failure_ = Unavailable(
            s.spec.name + " exited " + std::to_string(s.quick_exits) + " times within " +
            std::to_string(policy_.fail_fast_ms) + " ms of starting (last: " + how + " after " +
            std::to_string(up) + " ms); not restarting it\ncommand: " + cmd + "\nlast lines of " +
            s.log_path + ":\n" + (indented.empty() ? "  (empty)\n" : indented));
        PW_LOG(ERROR) << s.spec.name << " keeps exiting at start; stopping the node";
        RecordState();
        return;
      }
      if (up >= policy_.stable_after_ms) s.backoff_ms = policy_.initial_backoff_ms;
      s.restart_at_ms = now + s.backoff_ms;
      PW_LOG(WARNING) << s.spec.name << " exited (" << how << " after " << up
                      << " ms); restarting in " << s.backoff_ms << " ms";
      s.backoff_ms = std::min(policy_.max_backoff_ms, std::max<int64_t>(1, s.backoff_ms * 2));
    } else if (!stopping_ && now >= s.restart_at_ms) {
      if (Spawn(s)) {
        ++s.restarts;
        changed = true;
      } else {
        s.restart_at_ms = now + s.backoff_ms;
      }
    }
  }
  if (changed) RecordState();
}

Status Supervisor::Run(const std::atomic<bool>& stop) {
  while (!stop.load() && failure_.ok()) {
    Tick();
    if (!failure_.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Stop();
  return failure_;
}

void Supervisor::Stop() {
  stopping_ = true;
  // Groups by stop order: the router drains first (its in-flight requests still have workers),
  // then the workers finish what they hold, then the broker goes.
  std::vector<int> orders;
  for (auto& s : states_) orders.push_back(s.spec.stop_order);
  std::sort(orders.begin(), orders.end());
  orders.erase(std::unique(orders.begin(), orders.end()), orders.end());
  for (auto it = orders.begin(); it != orders.end(); ++it) {
    for (auto& s : states_) {
      if (s.spec.stop_order == *it && s.pid > 0) kill(s.pid, SIGTERM);
    }
    const int64_t deadline = NowMs() + drain_timeout_ms_;
    while (true) {
      bool any = false;
      for (auto& s : states_) {
        if (s.spec.stop_order != *it || s.pid <= 0) continue;
        if (waitpid(s.pid, nullptr, WNOHANG) == s.pid) {
          PW_LOG(INFO) << s.spec.name << " stopped";
          s.pid = -1;
        } else {
          any = true;
        }
      }
      if (!any) break;
      if (NowMs() > deadline) {
        for (auto& s : states_) {
          if (s.spec.stop_order == *it && s.pid > 0) {
            PW_LOG(WARNING) << s.spec.name << " did not drain in " << drain_timeout_ms_
                            << " ms; killing it";
            kill(s.pid, SIGKILL);
            waitpid(s.pid, nullptr, 0);
            s.pid = -1;
          }
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // Every pid is -1 now: status reports the node stopped, not the pids of the last run.
  RecordState();
}

}  // namespace pw::cluster
