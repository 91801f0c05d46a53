// pw-cluster status: the processes of a node started by the real `pw-cluster up` (stand-in
// binaries, status_sleeper, under the names pw-router, pw-prefill and pw-decode, so no model is
// loaded; `up` starts them with the command lines it builds, --control-keys included), found
// from the launcher's state file: every pid reported is pw-cluster's child, a restarted process
// is reported under its new pid, and a stopped node is reported stopped. The states come from
// /metrics (loopback sockets answering 200); a pid alive with another start time (recycled) or
// a zombie is not the recorded process; a missing, corrupt or foreign state file is an error
// that names it. And the Prometheus file_sd targets of a cluster file.
#include "services/cluster/cluster_status.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "services/cluster/cluster_config.h"
#include "services/cluster/launcher_state.h"
#include "tests/support/http_util.h"
#include "tests/support/process_util.h"

namespace pw::cluster {
namespace {

using testing::ChildProcess;
using testing::FreePort;
using testing::PidsWithCmdline;
using testing::ReadFile;

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

// A fresh directory under the build tree with bin/pw-router, bin/pw-prefill, bin/pw-decode
// linked to the stand-in.
std::filesystem::path StandInDir(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(PW_BINARY_DIR) / "test-tmp" / (name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "bin");
  for (const char* b : {"pw-router", "pw-prefill", "pw-decode"}) {
    fs::create_symlink(fs::path(PW_BINARY_DIR) / "bin" / "status_sleeper", dir / "bin" / b);
  }
  return dir;
}

// A node of router, prefill-0 and decode-0 (no broker) with its binaries in dir/bin and its run
// directory dir/run. prefill_metrics 0: no metrics endpoint.
std::string WriteClusterYaml(const std::filesystem::path& dir, int router_port,
                             int prefill_metrics) {
  const std::string yaml = dir / "cluster.yaml";
  std::ofstream(yaml) << "model_dir: models/tiny-moe\nbin_dir: " << (dir / "bin").string()
                      << "\nrun_dir: " << (dir / "run").string()
                      << "\nrouter: {port: " << router_port << ", control_port: " << FreePort()
                      << "}\nbroker: {enabled: false}\n"
                      << "prefill: [{id: prefill-0"
                      << (prefill_metrics ? ", metrics_port: " + std::to_string(prefill_metrics)
                                          : "")
                      << "}]\ndecode: [{id: decode-0}]\n"
                      << "restart: {initial_backoff_ms: 50, max_backoff_ms: 200}\n";
  return yaml;
}

struct CommandResult {
  int code = -1;
  std::string out;  // stdout, and stderr with `with_stderr`
};

CommandResult PwClusterStatus(const std::string& args, bool with_stderr = false) {
  const std::string cmd = std::string(PW_BINARY_DIR) + "/bin/pw-cluster status " + args +
                          (with_stderr ? " 2>&1" : " 2>/dev/null");
  CommandResult r;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[512];
  while (fgets(buf, sizeof(buf), f)) r.out += buf;
  const int rc = pclose(f);
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return r;
}

struct Row {
  std::string pid, state, metrics;
};

// NAME -> its row of `pw-cluster status`'s table.
std::map<std::string, Row> ParseTable(const std::string& table) {
  std::map<std::string, Row> rows;
  std::istringstream in(table);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string name;
    Row r;
    if (f >> name >> r.pid >> r.state >> r.metrics) rows[name] = r;
  }
  return rows;
}

// Field `n` (1-based, as in proc(5)) of /proc/<pid>/stat, "" when unreadable.
std::string ProcStatField(pid_t pid, int n) {
  const std::string text = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream rest(text.substr(close + 1));
  std::string w;
  for (int i = 3; i <= n && rest >> w; ++i) {
    if (i == n) return w;
  }
  return "";
}

// argv[0] of `pid`, "" when unreadable.
std::string Argv0(pid_t pid) {
  const std::string cmd = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
  return cmd.substr(0, cmd.find('\0'));
}

// `pw-cluster status` until `done(result)`, polling for up to 30 s; the last result.
template <typename Done>
CommandResult StatusUntil(const std::string& args, Done done) {
  CommandResult r;
  for (int i = 0; i < 300; ++i) {
    r = PwClusterStatus(args);
    if (done(r)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return r;
}

TEST(ClusterStatus, NodeStartedByUpReportsEveryProcessWithItsPid) {
  const auto dir = StandInDir("status-up");
  OkServer router_http, prefill_metrics;
  const std::string yaml = WriteClusterYaml(dir, router_http.port(), prefill_metrics.port());
  ChildProcess cluster;
  ASSERT_TRUE(
      cluster.Start({std::string(PW_BINARY_DIR) + "/bin/pw-cluster", "up", "--config", yaml},
                    (dir / "pw-cluster.out").string()));
  // Whatever happens below, no stand-in outlives the test: they are the only processes whose
  // argv[0] lies in dir/bin.
  struct Reap {
    ChildProcess& cluster;
    std::string bin;
    ~Reap() {
      cluster.Kill(SIGTERM);
      if (cluster.Wait(20000) == -1) cluster.Kill(SIGKILL);
      for (pid_t p : PidsWithCmdline(bin)) kill(p, SIGKILL);
    }
  } reap{cluster, (dir / "bin").string()};

  const std::string targets = (dir / "targets.json").string();
  const std::string args = "--config " + yaml + " --prometheus-targets " + targets;
  CommandResult st = StatusUntil(args, [](const CommandResult& r) { return r.code == 0; });
  ASSERT_EQ(st.code, 0) << st.out << ReadFile(dir / "pw-cluster.out");
  auto rows = ParseTable(st.out);
  ASSERT_EQ(rows.size(), 3u) << st.out;
  const std::map<std::string, std::string> binary = {
      {"router", "pw-router"}, {"prefill-0", "pw-prefill"}, {"decode-0", "pw-decode"}};
  for (const auto& [name, bin] : binary) {
    SCOPED_TRACE(name + "\n" + st.out);
    const Row& r = rows[name];
    EXPECT_EQ(r.state, name == "decode-0" ? "running" : "up");
    const pid_t pid = std::atoi(r.pid.c_str());
    ASSERT_GT(pid, 0);
    // The very process pw-cluster started, with the command line `up` gave it.
    EXPECT_EQ(ProcStatField(pid, 4), std::to_string(cluster.pid()));
    EXPECT_EQ(Argv0(pid), (dir / "bin" / bin).string());
    EXPECT_NE(ReadFile("/proc/" + std::to_string(pid) + "/cmdline").find("--control-keys"),
              std::string::npos);
  }
  EXPECT_EQ(rows["router"].metrics,
            "http://127.0.0.1:" + std::to_string(router_http.port()) + "/metrics");
  EXPECT_EQ(rows["decode-0"].metrics, "-");
  // --prometheus-targets: the router and prefill-0 (decode-0 has no metrics port), each of
  // which answers.
  const auto j = nlohmann::json::parse(ReadFile(targets), nullptr, false);
  ASSERT_TRUE(j.is_array()) << ReadFile(targets);
  ASSERT_EQ(j.size(), 2u) << j.dump();
  EXPECT_EQ(j[0]["labels"]["pw_process"], "router");
  EXPECT_EQ(j[1]["labels"]["pw_process"], "prefill-0");
  EXPECT_EQ(j[1]["labels"]["pw_role"], "prefill");
  EXPECT_EQ(j[1]["targets"][0], "127.0.0.1:" + std::to_string(prefill_metrics.port()));

  // pw-cluster restarts a killed process; status follows it to its new pid.
  const std::string old_pid = rows["prefill-0"].pid;
  kill(std::atoi(old_pid.c_str()), SIGKILL);
  st = StatusUntil(args, [&](const CommandResult& r) {
    const auto now = ParseTable(r.out);
    return r.code == 0 && now.count("prefill-0") && now.at("prefill-0").pid != old_pid;
  });
  ASSERT_EQ(st.code, 0) << st.out << ReadFile(dir / "pw-cluster.out");
  rows = ParseTable(st.out);
  const pid_t new_pid = std::atoi(rows["prefill-0"].pid.c_str());
  EXPECT_NE(rows["prefill-0"].pid, old_pid);
  EXPECT_EQ(ProcStatField(new_pid, 4), std::to_string(cluster.pid())) << st.out;
  EXPECT_EQ(Argv0(new_pid), (dir / "bin" / "pw-prefill").string());

  // A drained node: every process stopped, exit 1.
  cluster.Kill(SIGTERM);
  ASSERT_EQ(cluster.Wait(20000), 0) << ReadFile(dir / "pw-cluster.out");
  st = PwClusterStatus(args);
  EXPECT_EQ(st.code, 1) << st.out;
  rows = ParseTable(st.out);
  ASSERT_EQ(rows.size(), 3u) << st.out;
  for (const auto& [name, r] : rows) {
    EXPECT_EQ(r.state, "stopped") << st.out;
    EXPECT_EQ(r.pid, "-") << st.out;
  }
}

// A process of the state file that is alive is running only with the recorded start time: the
// same pid with another start time is a recycled pid, and a zombie has exited.
TEST(ClusterStatus, RecycledPidOrZombieIsNotTheRecordedProcess) {
  const auto dir = StandInDir("status-recycled");
  const int nobody = FreePort();  // no metrics endpoint answers there
  const std::string yaml = WriteClusterYaml(dir, nobody, 0);
  auto cfg = LoadClusterConfig(yaml, "/unused");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  std::filesystem::create_directories(cfg->run_dir);

  ChildProcess live, exited;
  ASSERT_TRUE(live.Start({(dir / "bin" / "pw-decode").string()}, (dir / "live.log").string()));
  ASSERT_TRUE(exited.Start({"/bin/true"}, (dir / "exited.log").string()));
  // /bin/true exits at once; unreaped, it stays a zombie until ChildProcess reaps it.
  for (int i = 0; i < 500 && ProcStatField(exited.pid(), 3) != "Z"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(ProcStatField(exited.pid(), 3), "Z");
  auto live_ticks = ProcessStartTicks(live.pid());
  auto zombie_ticks = ProcessStartTicks(exited.pid());
  ASSERT_TRUE(live_ticks.ok()) << live_ticks.status().ToString();
  ASSERT_TRUE(zombie_ticks.ok()) << zombie_ticks.status().ToString();
  EXPECT_EQ(std::to_string(*live_ticks), ProcStatField(live.pid(), 22));

  LauncherState state;
  state.launcher_pid = getpid();
  state.launcher_start_ticks = *ProcessStartTicks(getpid());
  state.processes = {{"router", live.pid(), *live_ticks + 1, 0},
                     {"prefill-0", exited.pid(), *zombie_ticks, 0},
                     {"decode-0", live.pid(), *live_ticks, 0}};
  ASSERT_TRUE(WriteLauncherState(LauncherStatePath(cfg->run_dir), state).ok());
  auto st = QueryStatus(*cfg);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  SCOPED_TRACE(FormatStatus(*st));
  ASSERT_EQ(st->size(), 3u);
  EXPECT_EQ((*st)[0].name, "router");
  EXPECT_EQ((*st)[0].state, "stopped");
  EXPECT_EQ((*st)[0].pid, -1);
  EXPECT_EQ((*st)[1].state, "stopped");
  EXPECT_EQ((*st)[2].state, "running");
  EXPECT_EQ((*st)[2].pid, live.pid());

  // A live process whose metrics endpoint does not answer is unresponsive.
  state.processes[0].start_ticks = *live_ticks;
  ASSERT_TRUE(WriteLauncherState(LauncherStatePath(cfg->run_dir), state).ok());
  st = QueryStatus(*cfg);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ((*st)[0].state, "unresponsive") << FormatStatus(*st);
  EXPECT_EQ((*st)[0].pid, live.pid());
}

// No state file, a damaged one, or one of another node: an error naming the file (exit 2), not
// a table of stopped processes.
TEST(ClusterStatus, MissingCorruptOrForeignStateFileIsAClearError) {
  const auto dir = StandInDir("status-bad");
  const std::string yaml = WriteClusterYaml(dir, FreePort(), 0);
  auto cfg = LoadClusterConfig(yaml, "/unused");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const std::string path = LauncherStatePath(cfg->run_dir);
  EXPECT_EQ(path, (dir / "run" / "pw-cluster.state").string());

  auto st = QueryStatus(*cfg);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kNotFound);
  EXPECT_NE(st.status().message().find(path), std::string::npos) << st.status().message();
  CommandResult cmd = PwClusterStatus("--config " + yaml, /*with_stderr=*/true);
  EXPECT_EQ(cmd.code, 2) << cmd.out;
  EXPECT_NE(cmd.out.find(path), std::string::npos) << cmd.out;
  EXPECT_EQ(cmd.out.find("stopped"), std::string::npos) << cmd.out;
  // --run-dir points status at another run directory, as it does `up`.
  cmd = PwClusterStatus("--config " + yaml + " --run-dir " + (dir / "elsewhere").string(), true);
  EXPECT_EQ(cmd.code, 2) << cmd.out;
  EXPECT_NE(cmd.out.find((dir / "elsewhere" / "pw-cluster.state").string()), std::string::npos)
      << cmd.out;

  std::filesystem::create_directories(cfg->run_dir);
  const std::string ok_proc = R"({"name": "router", "pid": -1, "start_ticks": 0})";
  const std::string launcher = R"("launcher": {"pid": 1, "start_ticks": 5})";
  struct Case {
    std::string text;
    const char* expect;
  } cases[] = {
      {"", "not valid JSON"},
      {R"({"version": 1, "launcher": {"pid": 1, "start)", "not valid JSON"},  // torn
      {"[]", "not a JSON object"},
      {R"({"launcher": {}, "processes": []})", "version"},
      {R"({"version": 2, )" + launcher + R"(, "processes": []})", "version 2"},
      {R"({"version": 1, "processes": []})", "launcher"},
      {R"({"version": 1, )" + launcher + "}", "processes"},
      {R"({"version": 1, )" + launcher + R"(, "processes": [{"pid": 3, "start_ticks": 1}]})",
       "without a name"},
      {R"({"version": 1, )" + launcher +
           R"(, "processes": [{"name": "router", "pid": "3", "start_ticks": 1}]})",
       "router"},
      {R"({"version": 1, )" + launcher +
           R"(, "processes": [{"name": "router", "pid": 0, "start_ticks": 1}]})",
       "router"},
      {R"({"version": 1, )" + launcher +
           R"(, "processes": [{"name": "router", "pid": 3, "start_ticks": -1}]})",
       "router"},
      {R"({"version": 1, )" + launcher + R"(, "processes": [)" + ok_proc + ", " + ok_proc + "]}",
       "listed twice"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    std::ofstream(path, std::ios::trunc) << c.text;
    st = QueryStatus(*cfg);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), StatusCode::kCorrupt) << st.status().message();
    EXPECT_NE(st.status().message().find(path), std::string::npos) << st.status().message();
    EXPECT_NE(st.status().message().find(c.expect), std::string::npos) << st.status().message();
  }
  cmd = PwClusterStatus("--config " + yaml, true);
  EXPECT_EQ(cmd.code, 2) << cmd.out;
  EXPECT_NE(cmd.out.find("listed twice"), std::string::npos) << cmd.out;

  // A launcher of other processes (another cluster file with the same run directory).
  LauncherState other;
  other.launcher_pid = 1;
  other.processes = {{"router", -1, 0, 0}, {"prefill-0", -1, 0, 0}, {"decode-7", -1, 0, 0}};
  ASSERT_TRUE(WriteLauncherState(path, other).ok());
  st = QueryStatus(*cfg);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("not started by it: decode-0"), std::string::npos)
      << st.status().message();
  EXPECT_NE(st.status().message().find("not in the file: decode-7"), std::string::npos)
      << st.status().message();
}

TEST(ClusterStatus, TableAndPrometheusTargets) {
  const auto dir = StandInDir("status-targets");
  const int router = FreePort(), prefill = FreePort();
  auto cfg = LoadClusterConfig(WriteClusterYaml(dir, router, prefill), "/unused");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const std::string table = FormatStatus(
      {{"router", 42, "up", "http://127.0.0.1:1/metrics"}, {"decode-0", -1, "stopped", ""}});
  EXPECT_EQ(table,
            "NAME          PID STATE        METRICS\n"
            "router         42 up           http://127.0.0.1:1/metrics\n"
            "decode-0        - stopped      -\n");
  const auto j = nlohmann::json::parse(PrometheusTargets(*cfg));
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["labels"]["pw_process"], "router");
  EXPECT_EQ(j[0]["labels"]["job"], "pagedweight");
  EXPECT_EQ(j[0]["targets"][0], "127.0.0.1:" + std::to_string(router));
  EXPECT_EQ(j[1]["labels"]["pw_role"], "prefill");
  EXPECT_EQ(j[1]["targets"][0], "127.0.0.1:" + std::to_string(prefill));
}

}  // namespace
}  // namespace pw::cluster
