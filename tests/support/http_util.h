// Helpers for tests that drive a whole cluster from outside: a minimal HTTP/1.1 client, the
// pids of processes by command line, whole-file reads, waiting for a node to serve, its logs.
// In tests/support/ because tests in two folders use it: tests/integration/ and
// tests/services/cluster/ (pw-cluster status on stand-in processes).
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <initializer_list>
#include <thread>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/process_util.h"

namespace pw::testing {

// Minimal HTTP/1.1 client (Connection: close). Returns {status, body}; status 0 on I/O error.
inline std::pair<int, std::string> Http(int port, const std::string& method, const std::string& path,
                                 const std::string& body = "", int timeout_s = 120) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{timeout_s, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(s);
    return {0, ""};
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty()) {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  if (send(s, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(s);
    return {0, ""};
  }
  std::string resp;
  char buf[65536];
  ssize_t n;
  while ((n = recv(s, buf, sizeof(buf), 0)) > 0) resp.append(buf, static_cast<size_t>(n));
  close(s);
  size_t sp = resp.find(' ');
  size_t hdr_end = resp.find("\r\n\r\n");
  if (sp == std::string::npos || hdr_end == std::string::npos) return {0, resp};
  int status = std::atoi(resp.c_str() + sp + 1);
  std::string headers = resp.substr(0, hdr_end);
  std::string payload = resp.substr(hdr_end + 4);
  if (headers.find("chunked") != std::string::npos) {  // de-chunk
    std::string out;
    size_t pos = 0;
    while (pos < payload.size()) {
      size_t eol = payload.find("\r\n", pos);
      if (eol == std::string::npos) break;
      size_t len = std::strtoul(payload.substr(pos, eol - pos).c_str(), nullptr, 16);
      if (len == 0) break;
      out += payload.substr(eol + 2, len);
      pos = eol + 2 + len + 2;
    }
    payload = out;
  }
  return {status, payload};
}

// Pids of processes whose command line contains `needle` (to signal one child of pw-cluster).
inline std::vector<pid_t> PidsWithCmdline(const std::string& needle) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    // A process may exit while its cmdline is read (the read then fails with ESRCH, which
    // libstdc++'s filebuf throws): it is not one of the processes looked for.
    std::string cmd;
    try {
      std::ifstream f("/proc/" + std::string(e->d_name) + "/cmdline");
      cmd.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    } catch (const std::exception&) {
      continue;
    }
    for (auto& c : cmd) if (c == '\0') c = ' ';
    if (cmd.find(needle) != std::string::npos) out.push_back(pid);
  }
  closedir(d);
  return out;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// True once a one-token completion of `model` succeeds on `http_port` (within `timeout_s`).
inline bool WaitServing(int http_port, int timeout_s, const std::string& model = "tiny-moe") {
  const std::string body = R"({"model":")" + model + R"(","prompt":[1,2,3],"max_tokens":1})";
  for (int i = 0; i < timeout_s * 5; ++i) {
    if (Http(http_port, "POST", "/v1/completions", body, 10).first == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

// What became of a node started as `node` (pw-cluster) on `http_port` within `timeout_s`.
enum class NodeStart { kServing, kPortTaken, kFailed };
// WaitServing, giving up early when pw-cluster has exited (it stops the node when a process keeps
// exiting at start). kPortTaken: it exited and `logs` (its run directory's, read then) say a
// listener found its port in use: a port picked free was taken by another process before the
// node bound it (ctest -j), and the node may be started again on new ports.
template <typename Logs>
inline NodeStart WaitNodeStart(ChildProcess& node, int http_port, int timeout_s, const std::string& model,
                               Logs&& logs) {
  for (int waited = 0; waited < timeout_s; ++waited) {
    if (WaitServing(http_port, 1, model)) return NodeStart::kServing;
    (void)node.Wait(0);  // reaps an exited pw-cluster: running() turns false
    if (!node.running()) break;
  }
  if (node.running()) return NodeStart::kFailed;
  return logs().find("Address already in use") != std::string::npos ? NodeStart::kPortTaken : NodeStart::kFailed;
}

// The last 3000 bytes of each of a run directory's logs, for a failure message.
inline std::string RunLogs(const std::string& run_dir,
                           std::initializer_list<const char*> names = {"pw-cluster.out", "router.log",
                                                                       "broker.log", "prefill-0.log",
                                                                       "decode-0.log"}) {
  std::string out;
  for (const char* n : names) {
    std::string t = ReadFile(run_dir + "/" + n);
    if (t.size() > 3000) t = t.substr(t.size() - 3000);
    out += std::string("--- ") + n + "\n" + t;
  }
  return out;
}

// SIGKILLs every process still connected to one of a node's control ports (children a killed
// pw-cluster left behind).
inline void KillNodeProcesses(std::initializer_list<int> control_ports) {
  for (int port : control_ports) {
    for (pid_t p : PidsWithCmdline("tcp://127.0.0.1:" + std::to_string(port))) kill(p, SIGKILL);
  }
}

// SIGKILLs every process started from the node file `config` (pw-cluster's children get
// `--config <its absolute path>`; pw-cluster itself, given the same path, too).
inline void KillConfigProcesses(const std::string& config) {
  for (pid_t p : PidsWithCmdline("--config " + config + " ")) kill(p, SIGKILL);
}

}  // namespace pw::testing
