#include "services/cluster/launcher_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace pw::cluster {

namespace {

struct ProcStat {
  char state = '?';  // field 3: R, S, D, Z, X, ...
  uint64_t start_ticks = 0;
};

Result<ProcStat> ReadProcStat(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  std::ifstream f(path);
  if (!f) return NotFound("no process " + std::to_string(pid));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields are counted
  // from the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return Corrupt("unexpected " + path + ": " + text);
  std::istringstream rest(text.substr(close + 1));
  std::vector<std::string> fields;  // fields[0] is field 3
  for (std::string w; fields.size() < 20 && rest >> w;) fields.push_back(w);
  if (fields.size() < 20 || fields[0].size() != 1) {
    return Corrupt("unexpected " + path + ": " + text);
  }
  ProcStat st;
  st.state = fields[0][0];
  char* end = nullptr;
  errno = 0;
  st.start_ticks = std::strtoull(fields[19].c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return Corrupt("unexpected starttime in " + path + ": " + text);
  return st;
}

}  // namespace

std::string LauncherStatePath(const std::string& run_dir) { return run_dir + "/pw-cluster.state"; }

Status WriteLauncherState(const std::string& path, const LauncherState& state) {
  nlohmann::json procs = nlohmann::json::array();
  for (const auto& p : state.processes) {
    procs.push_back({{"name", p.name},
                     {"pid", p.pid},
                     {"start_ticks", p.start_ticks},
                     {"restarts", p.restarts}});
  }
  const nlohmann::json j = {
      {"version", LauncherState::kVersion},
      {"launcher", {{"pid", state.launcher_pid}, {"start_ticks", state.launcher_start_ticks}}},
      {"processes", procs}};
  const std::string text = j.dump(1) + "\n";
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return IoError("cannot create " + tmp + ": " + std::strerror(errno));
  bool ok = true;
  size_t off = 0;
  while (ok && off < text.size()) {
    const ssize_t n = write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) off += static_cast<size_t>(n);
  }
  ok = ok && fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    unlink(tmp.c_str());
    return IoError("cannot write " + path + ": " + std::strerror(e));
  }
  return Status::Ok();
}

Result<LauncherState> ReadLauncherState(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return NotFound("no launcher state file " + path + ": " + std::strerror(errno));
  }
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto bad = [&](const std::string& why) {
    return Corrupt("launcher state file " + path + " is not usable: " + why);
  };
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("not valid JSON");
  if (!j.is_object()) return bad("not a JSON object");
  if (!j.contains("version") || !j["version"].is_number_integer()) return bad("no \"version\"");
  if (j["version"].get<int64_t>() != LauncherState::kVersion) {
    return bad("version " + j["version"].dump() + ", this pw-cluster reads version " +
               std::to_string(LauncherState::kVersion));
  }
  // A pid is a positive integer or -1; start_ticks a non-negative integer.
  const auto pid_of = [](const nlohmann::json& o, pid_t* out) {
    if (!o.contains("pid") || !o["pid"].is_number_integer()) return false;
    const int64_t v = o["pid"].get<int64_t>();
    if (v != -1 && (v <= 0 || v > INT32_MAX)) return false;
    *out = static_cast<pid_t>(v);
    return true;
  };
  const auto ticks_of = [](const nlohmann::json& o, uint64_t* out) {
    if (!o.contains("start_ticks") || !o["start_ticks"].is_number_unsigned()) return false;
    *out = o["start_ticks"].get<uint64_t>();
    return true;
  };
  LauncherState st;
  if (!j.contains("launcher") || !j["launcher"].is_object() ||
      !pid_of(j["launcher"], &st.launcher_pid) ||
      !ticks_of(j["launcher"], &st.launcher_start_ticks)) {
    return bad("\"launcher\" needs an integer pid and start_ticks");
  }
  if (!j.contains("processes") || !j["processes"].is_array()) return bad("no \"processes\" list");
  for (const auto& p : j["processes"]) {
    RecordedProcess r;
    if (!p.is_object() || !p.contains("name") || !p["name"].is_string() ||
        p["name"].get<std::string>().empty()) {
      return bad("a process without a name: " + p.dump());
    }
    r.name = p["name"].get<std::string>();
    if (!pid_of(p, &r.pid) || !ticks_of(p, &r.start_ticks)) {
      return bad("process '" + r.name + "' needs an integer pid (-1 when down) and start_ticks");
    }
    if (p.contains("restarts")) {
      if (!p["restarts"].is_number_unsigned()) return bad("process '" + r.name + "': bad restarts");
      r.restarts = static_cast<int>(p["restarts"].get<uint64_t>());
    }
    for (const auto& seen : st.processes) {
      if (seen.name == r.name) return bad("process '" + r.name + "' listed twice");
    }
    st.processes.push_back(std::move(r));
  }
  return st;
}

Result<uint64_t> ProcessStartTicks(pid_t pid) {
  PW_ASSIGN_OR_RETURN(ProcStat st, ReadProcStat(pid));
  return st.start_ticks;
}

bool IsRecordedProcessRunning(pid_t pid, uint64_t start_ticks) {
  if (pid <= 0) return false;
  auto st = ReadProcStat(pid);
  return st.ok() && st->state != 'Z' && st->state != 'X' && st->start_ticks == start_ticks;
}

}  // namespace pw::cluster
