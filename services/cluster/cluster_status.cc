#include "services/cluster/cluster_status.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "services/cluster/launcher_state.h"

namespace pw::cluster {

namespace {

// GET http://host:port/metrics answers 200 within `timeout_ms`.
bool MetricsAnswer(const std::string& host_port, int timeout_ms) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return false;
  const std::string host = host_port.substr(0, colon), port = host_port.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || !res) return false;
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  bool ok = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now())
               .count()));
  };
  if (fd >= 0) {
    connect(fd, res->ai_addr, res->ai_addrlen);
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    if (poll(&p, 1, left()) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
        err == 0) {
      const std::string req =
          "GET /metrics HTTP/1.1\r\nHost: " + host_port + "\r\nConnection: close\r\n\r\n";
      if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
        std::string got;
        char buf[256];
        while (got.size() < 12) {
          pollfd r{fd, POLLIN, 0};
          if (poll(&r, 1, left()) != 1) break;
          const ssize_t n = recv(fd, buf, sizeof(buf), 0);
          if (n <= 0) break;
          got.append(buf, static_cast<size_t>(n));
        }
        ok = got.size() >= 12 && got.compare(0, 5, "HTTP/") == 0 && got.compare(9, 3, "200") == 0;
      }
    }
    close(fd);
  }
  freeaddrinfo(res);
  return ok;
}

}  // namespace

Result<std::vector<ProcessStatus>> QueryStatus(const ClusterConfig& cfg) {
  const std::string path = LauncherStatePath(cfg.run_dir);
  auto recorded = ReadLauncherState(path);
  if (!recorded.ok()) {
    if (recorded.status().code() == StatusCode::kNotFound) {
      return NotFound(recorded.status().message() +
                      " (no `pw-cluster up` has run with this run directory; `up --run-dir` "
                      "needs the same --run-dir here)");
    }
    return recorded.status();
  }
  // The same processes, by name, as the file: otherwise the node runs another cluster file.
  std::string missing, extra;
  for (const auto& spec : cfg.processes) {
    bool found = false;
    for (const auto& r : recorded->processes) found |= r.name == spec.name;
    if (!found) missing += (missing.empty() ? "" : ", ") + spec.name;
  }
  for (const auto& r : recorded->processes) {
    bool found = false;
    for (const auto& spec : cfg.processes) found |= r.name == spec.name;
    if (!found) extra += (extra.empty() ? "" : ", ") + r.name;
  }
  if (!missing.empty() || !extra.empty()) {
    return InvalidArgument(
        "the launcher recorded in " + path + " runs other processes than the cluster file" +
        (missing.empty() ? "" : "; not started by it: " + missing) +
        (extra.empty() ? "" : "; started by it but not in the file: " + extra) +
        " (was the node started from another file?)");
  }
  std::vector<ProcessStatus> out;
  for (const auto& spec : cfg.processes) {
    ProcessStatus s;
    s.name = spec.name;
    std::string host_port;
    for (const auto& t : cfg.scrape_targets) {
      if (t.process == spec.name) host_port = t.host_port;
    }
    if (!host_port.empty()) s.metrics_url = "http://" + host_port + "/metrics";
    for (const auto& r : recorded->processes) {
      if (r.name == spec.name && IsRecordedProcessRunning(r.pid, r.start_ticks)) s.pid = r.pid;
    }
    if (s.pid < 0) {
      s.state = "stopped";
    } else if (host_port.empty()) {
      s.state = "running";
    } else {
      s.state = MetricsAnswer(host_port, 1000) ? "up" : "unresponsive";
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string FormatStatus(const std::vector<ProcessStatus>& st) {
  size_t w = 4;
  for (const auto& s : st) w = std::max(w, s.name.size());
  std::string o;
  char line[512];
  std::snprintf(line, sizeof(line), "%-*s %8s %-12s %s\n", static_cast<int>(w), "NAME", "PID",
                "STATE", "METRICS");
  o += line;
  for (const auto& s : st) {
    std::snprintf(line, sizeof(line), "%-*s %8s %-12s %s\n", static_cast<int>(w), s.name.c_str(),
                  s.pid > 0 ? std::to_string(s.pid).c_str() : "-", s.state.c_str(),
                  s.metrics_url.empty() ? "-" : s.metrics_url.c_str());
    o += line;
  }
  return o;
}

std::string PrometheusTargets(const ClusterConfig& cfg) {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& t : cfg.scrape_targets) {
    groups.push_back(
        {{"targets", {t.host_port}},
         {"labels", {{"job", "pagedweight"}, {"pw_process", t.process}, {"pw_role", t.role}}}});
  }
  return groups.dump(2) + "\n";
}

}  // namespace pw::cluster
