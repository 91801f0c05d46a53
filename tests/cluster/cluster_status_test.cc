// pw-cluster status: processes found by their command lines in /proc, the state from their
// /metrics (up, unresponsive, running, stopped), the table and the exit code of
// `pw-cluster status`, and the Prometheus file_sd targets of a cluster file. The processes are
// stand-ins (status_sleeper) started with the exact argv the file yields; the router's /metrics
// is a loopback socket answering 200.
#include "services/cluster/cluster_status.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "services/cluster/cluster_config.h"

extern char** environ;

namespace pw::cluster {
namespace {

// Answers every connection with "HTTP/1.1 200 OK" until destroyed.
class OkServer {
 public:
  OkServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd_, 16);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        char buf[1024];
        (void)!recv(c, buf, sizeof(buf), 0);
        const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        (void)!send(c, ok, sizeof(ok) - 1, MSG_NOSIGNAL);
        close(c);
      }
    });
  }
  ~OkServer() {
    stop_.store(true);
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

pid_t Spawn(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ), 0) << argv[0];
  return pid;
}

const ProcessStatus* Find(const std::vector<ProcessStatus>& st, const std::string& name) {
  for (const auto& s : st) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

TEST(ClusterStatus, StatesPidsTableAndTargets) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(PW_BINARY_DIR) / "test-tmp" / ("status-" + std::to_string(getpid()));
  fs::create_directories(dir / "bin");
  for (const char* b : {"pw-router", "pw-prefill", "pw-decode"}) {
    fs::remove(dir / "bin" / b);
    fs::create_symlink(fs::path(PW_BINARY_DIR) / "bin" / "status_sleeper", dir / "bin" / b);
  }
  OkServer router_metrics;
  const int prefill_metrics = FreePort();  // nothing listens there
  const std::string yaml = dir / "cluster.yaml";
  std::ofstream(yaml) << "model_dir: models/tiny-moe\nbin_dir: " << (dir / "bin").string()
                      << "\nrouter: {port: " << router_metrics.port()
                      << ", control_port: " << FreePort() << "}\nbroker: {enabled: false}\n"
                      << "prefill: [{id: prefill-0, metrics_port: " << prefill_metrics << "}]\n"
                      << "decode: [{id: decode-0}]\n";
  auto cfg = LoadClusterConfig(yaml, "/unused");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  ASSERT_EQ(cfg->processes.size(), 3u);
  ASSERT_EQ(cfg->scrape_targets.size(), 2u);

  // Nothing started: all stopped.
  const auto before = QueryStatus(*cfg);
  for (const auto& s : before) {
    EXPECT_EQ(s.state, "stopped") << FormatStatus(before);
    EXPECT_EQ(s.pid, -1);
  }
  std::map<std::string, pid_t> pids;
  for (const auto& p : cfg->processes) {
    if (p.name != "decode-0") pids[p.name] = Spawn(p.argv);
  }
  // A process with another argument is not the decode worker.
  std::vector<std::string> other;
  for (const auto& p : cfg->processes) {
    if (p.name == "decode-0") other = p.argv;
  }
  other.back() += "x";
  const pid_t impostor = Spawn(other);
  auto st = QueryStatus(*cfg);
  // The spawned processes may take a moment to exec (their cmdline is the sleeper's before).
  for (int i = 0; i < 100 && Find(st, "prefill-0")->pid < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    st = QueryStatus(*cfg);
  }
  SCOPED_TRACE(FormatStatus(st));
  EXPECT_EQ(Find(st, "router")->state, "up");
  EXPECT_EQ(Find(st, "router")->pid, pids["router"]);
  EXPECT_EQ(Find(st, "router")->metrics_url,
            "http://127.0.0.1:" + std::to_string(router_metrics.port()) + "/metrics");
  EXPECT_EQ(Find(st, "prefill-0")->state, "unresponsive");
  EXPECT_EQ(Find(st, "prefill-0")->pid, pids["prefill-0"]);
  EXPECT_EQ(Find(st, "decode-0")->state, "stopped");
  EXPECT_EQ(Find(st, "decode-0")->metrics_url, "");
  const std::string table = FormatStatus(st);
  EXPECT_NE(table.find("NAME"), std::string::npos);
  EXPECT_NE(table.find("decode-0"), std::string::npos);

  // The command: one line per process after the header, exit 1 (not all up).
  const std::string cmd = std::string(PW_BINARY_DIR) + "/bin/pw-cluster status --config " + yaml;
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), f)) out += buf;
  const int rc = pclose(f);
  EXPECT_EQ(WEXITSTATUS(rc), 1) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4) << out;
  EXPECT_NE(out.find(std::to_string(pids["router"])), std::string::npos) << out;

  // Targets: router and prefill-0 (decode has no metrics port).
  const auto j = nlohmann::json::parse(PrometheusTargets(*cfg));
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["labels"]["pw_process"], "router");
  EXPECT_EQ(j[1]["labels"]["pw_role"], "prefill");
  EXPECT_EQ(j[1]["targets"][0], "127.0.0.1:" + std::to_string(prefill_metrics));

  for (auto& [name, pid] : pids) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  kill(impostor, SIGKILL);
  waitpid(impostor, nullptr, 0);
  EXPECT_EQ(QueryStatus(*cfg)[1].state, "stopped");
}

}  // namespace
}  // namespace pw::cluster
