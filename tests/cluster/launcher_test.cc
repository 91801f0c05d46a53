// pw-cluster's pieces: the YAML file's validation and the process list it yields, and the
// supervisor's restart-with-backoff and drain.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "services/cluster/cluster_config.h"
#include "services/cluster/launcher_state.h"
#include "services/cluster/supervisor.h"

namespace pw::cluster {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string dir = std::string(PW_BINARY_DIR) + "/test-tmp";
  std::filesystem::create_directories(dir);
  std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The command line of process `name` (empty when there is none).
std::vector<std::string> ArgvOf(const ClusterConfig& cfg, const std::string& name) {
  for (const auto& p : cfg.processes) {
    if (p.name == name) return p.argv;
  }
  return {};
}

// The word after `flag` in `argv`: "(absent)" without the flag, "" when it ends the line.
std::string ValueAfter(const std::vector<std::string>& argv, const std::string& flag) {
  auto it = std::find(argv.begin(), argv.end(), flag);
  if (it == argv.end()) return "(absent)";
  return it + 1 == argv.end() ? "" : *(it + 1);
}

bool HasFlag(const std::vector<std::string>& argv, const std::string& flag) {
  return std::find(argv.begin(), argv.end(), flag) != argv.end();
}

TEST(ClusterConfig, DeployLocalYamlLoads) {
  auto cfg = LoadClusterConfig(std::string(PW_SOURCE_DIR) + "/deploy/local.yaml", "/opt/pw/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->host, "127.0.0.1");
  EXPECT_EQ(cfg->http_port, 8000);
  ASSERT_EQ(cfg->processes.size(), 4u);  // broker, router, prefill-0, decode-0
  EXPECT_EQ(cfg->processes[0].name, "broker");
  EXPECT_EQ(cfg->processes[0].argv[0], "/opt/pw/bin/pw-broker");
  bool decode_uses_broker = false;
  for (const auto& p : cfg->processes) {
    if (p.name != "decode-0") continue;
    for (size_t i = 0; i + 1 < p.argv.size(); ++i) {
      if (p.argv[i] == "--broker") decode_uses_broker = p.argv[i + 1] == "tcp://127.0.0.1:5556";
    }
  }
  EXPECT_TRUE(decode_uses_broker);
  // Drain order: the router first, the broker last.
  EXPECT_EQ(cfg->processes[0].stop_order, 2);
  EXPECT_EQ(cfg->processes[1].name, "router");
  EXPECT_EQ(cfg->processes[1].stop_order, 0);
}

TEST(ClusterConfig, DecodeLynxBlockBecomesFlags) {
  auto path = WriteTemp("lynx.yaml",
                        "model_dir: m\nprefill: [{id: p}]\n"
                        "decode: [{id: d, lynx: {enabled: true, alpha: 3, beta: 3, "
                        "gate_weights: mass, exempt_layers: [0, 3]}}, {id: e}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const auto d = ArgvOf(*cfg, "d");
  EXPECT_TRUE(HasFlag(d, "--lynx"));
  EXPECT_EQ(std::stod(ValueAfter(d, "--lynx-alpha")), 3.0);
  EXPECT_EQ(ValueAfter(d, "--lynx-beta"), "3");
  EXPECT_EQ(ValueAfter(d, "--lynx-gate-weights"), "mass");
  EXPECT_EQ(ValueAfter(d, "--lynx-exempt"), "0,3");
  const auto e = ArgvOf(*cfg, "e");  // no lynx block: off
  EXPECT_FALSE(HasFlag(e, "--lynx"));

  auto bad = WriteTemp("lynx_bad.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                        "decode: [{id: d, lynx: {enabled: true, alpha: 3}}]\n");
  auto r = LoadClusterConfig(bad, "/bin");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("alpha and beta"), std::string::npos) << r.status().ToString();
}

TEST(ClusterConfig, DecodeTraceBlockBecomesFlags) {
  auto path = WriteTemp("trace.yaml",
                        "model_dir: m\nprefill: [{id: p}]\n"
                        "decode: [{id: d, trace: {path: /tmp/d.trace, max_mb: 2.5, sample: 4}}, "
                        "{id: e, trace: {path: /tmp/e.trace}}, {id: f}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(ValueAfter(ArgvOf(*cfg, "d"), "--record-trace"), "/tmp/d.trace");
  EXPECT_EQ(std::stod(ValueAfter(ArgvOf(*cfg, "d"), "--trace-max-mb")), 2.5);
  EXPECT_EQ(ValueAfter(ArgvOf(*cfg, "d"), "--trace-sample"), "4");
  EXPECT_EQ(std::stod(ValueAfter(ArgvOf(*cfg, "e"), "--trace-max-mb")), 64.0);  // bounded by default
  EXPECT_EQ(ValueAfter(ArgvOf(*cfg, "e"), "--trace-sample"), "1");
  EXPECT_EQ(ValueAfter(ArgvOf(*cfg, "f"), "--record-trace"), "(absent)");
  for (const char* bad : {"decode: [{id: d, trace: {max_mb: 1}}]\n", "decode: [{id: d, trace: {path: x, max_mb: 0}}]\n",
                          "decode: [{id: d, trace: {path: x, sample: 0}}]\n", "decode: [{id: d, trace: {path: x, rate: 2}}]\n"}) {
    auto p = WriteTemp("trace_bad.yaml", std::string("model_dir: m\nprefill: [{id: p}]\n") + bad);
    auto r = LoadClusterConfig(p, "/bin");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("trace"), std::string::npos) << r.status().ToString();
    }
  }
}

// A bound that holds no record of any model (a trace takes its 64-byte header, a record of at
// least 52 bytes and the 48-byte end record: 164 bytes) is refused when the file is loaded,
// naming the key; the smallest one that holds a record is taken. (A bound big enough for some
// model but not the one served is refused by the decode worker at start.)
TEST(ClusterConfig, TraceBoundBelowOneRecordIsRefused) {
  for (const char* mb : {"0.0001", "0.000163", "0", "-1"}) {
    auto p = WriteTemp("trace_small.yaml",
                       std::string("model_dir: m\nprefill: [{id: p}]\n"
                                   "decode: [{id: d}, {id: e, trace: {path: x, max_mb: ") +
                           mb + "}}]\n");
    auto r = LoadClusterConfig(p, "/bin");
    ASSERT_FALSE(r.ok()) << mb;
    const std::string m = r.status().message();
    EXPECT_NE(m.find("decode[1].trace.max_mb"), std::string::npos) << m;
    EXPECT_NE(m.find("holds no record"), std::string::npos) << m;
    EXPECT_NE(m.find("164 bytes"), std::string::npos) << m;
  }
  auto p = WriteTemp("trace_min.yaml",
                     "model_dir: m\nprefill: [{id: p}]\n"
                     "decode: [{id: d, trace: {path: x, max_mb: 0.000164}}]\n");
  auto cfg = LoadClusterConfig(p, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(std::stod(ValueAfter(ArgvOf(*cfg, "d"), "--trace-max-mb")), 0.000164);
}

TEST(ClusterConfig, DecodeWeightPacingBecomesAFlag) {
  auto path = WriteTemp("pacing.yaml",
                        "model_dir: m\nprefill: [{id: p}]\n"
                        "decode: [{id: d, weight_pacing: steps}, {id: e, weight_pacing: free}, "
                        "{id: f, weight_pacing: fetches}, {id: g}, {id: h, weight_pacing: auto}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(ValueAfter(ArgvOf(*cfg, "d"), "--weight-pacing"), "steps");
  EXPECT_EQ(ValueAfter(ArgvOf(*cfg, "e"), "--weight-pacing"), "free");
  EXPECT_EQ(ValueAfter(ArgvOf(*cfg, "f"), "--weight-pacing"), "fetches");
  EXPECT_EQ(ValueAfter(ArgvOf(*cfg, "g"), "--weight-pacing"), "(absent)");  // pw-decode's default, auto
  EXPECT_EQ(ValueAfter(ArgvOf(*cfg, "h"), "--weight-pacing"), "(absent)");
  auto bad = WriteTemp("pacing_bad.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d, weight_pacing: later}]\n");
  auto r = LoadClusterConfig(bad, "/bin");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("weight_pacing"), std::string::npos) << r.status().ToString();
}

TEST(ClusterConfig, NoMmapBecomesAFlagOfThatWorkerOnly) {
  auto path = WriteTemp("no_mmap.yaml",
                        "model_dir: m\nprefill: [{id: p, no_mmap: true}, {id: q}]\n"
                        "decode: [{id: d, no_mmap: true}, {id: e, no_mmap: false}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_TRUE(HasFlag(ArgvOf(*cfg, "p"), "--no-mmap"));
  EXPECT_FALSE(HasFlag(ArgvOf(*cfg, "q"), "--no-mmap"));
  EXPECT_TRUE(HasFlag(ArgvOf(*cfg, "d"), "--no-mmap"));
  EXPECT_FALSE(HasFlag(ArgvOf(*cfg, "e"), "--no-mmap"));
  auto bad = WriteTemp("no_mmap_bad.yaml", "model_dir: m\nprefill: [{id: p, no_mmap: sometimes}]\ndecode: [{id: d}]\n");
  auto r = LoadClusterConfig(bad, "/bin");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no_mmap"), std::string::npos) << r.status().ToString();
}

TEST(ClusterConfig, DecodeMissesBlockBecomesFlags) {
  auto path = WriteTemp("misses.yaml",
                        "model_dir: m\nprefill: [{id: p}]\n"
                        "decode: [{id: d, misses: {policy: quality-first, eviction: lru, residency: 0.25, "
                        "admission_beta: 1, admission_delay: 2}}, {id: e}]\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const auto d = ArgvOf(*cfg, "d");
  EXPECT_EQ(ValueAfter(d, "--miss-policy"), "quality-first");
  EXPECT_EQ(ValueAfter(d, "--miss-eviction"), "lru");
  EXPECT_EQ(std::stod(ValueAfter(d, "--residency")), 0.25);
  EXPECT_EQ(std::stod(ValueAfter(d, "--miss-admission-beta")), 1.0);
  EXPECT_EQ(ValueAfter(d, "--miss-admission-delay"), "2");
  EXPECT_EQ(ValueAfter(d, "--miss-threshold"), "(absent)");
  const auto e = ArgvOf(*cfg, "e");  // no misses block: every expert resident
  EXPECT_EQ(ValueAfter(e, "--residency"), "(absent)");
  EXPECT_EQ(ValueAfter(e, "--miss-policy"), "(absent)");
  for (const char* bad : {"decode: [{id: d, misses: {policy: rule-0.15}}]\n",
                          "decode: [{id: d, misses: {residency: 0.5, residency_bytes: 100}}]\n",
                          "decode: [{id: d, misses: {residency: 1.5}}]\n",
                          "decode: [{id: d, misses: {eviction: fifo, residency: 0.5}}]\n",
                          "decode: [{id: d, misses: {budget: 0.5}}]\n"}) {
    auto p = WriteTemp("misses_bad.yaml", std::string("model_dir: m\nprefill: [{id: p}]\n") + bad);
    auto r = LoadClusterConfig(p, "/bin");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("misses"), std::string::npos) << r.status().ToString();
    }
  }
}

TEST(ClusterConfig, BrokerPlannerBlockBecomesFlags) {
  auto path = WriteTemp("planner.yaml",
                        "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\n"
                        "broker: {store: s.apw, planner: {enabled: true, low_watermark: 0.1, "
                        "high_watermark: 0.3, use_routing: false, max_bytes_per_decision: 4096}}\n");
  auto cfg = LoadClusterConfig(path, "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const auto& b = cfg->processes[0].argv;
  ASSERT_EQ(cfg->processes[0].name, "broker");
  EXPECT_TRUE(HasFlag(b, "--planner"));
  EXPECT_EQ(std::stod(ValueAfter(b, "--planner-low")), 0.1);
  EXPECT_EQ(std::stod(ValueAfter(b, "--planner-high")), 0.3);
  EXPECT_EQ(ValueAfter(b, "--planner-max-bytes"), "4096");
  EXPECT_TRUE(HasFlag(b, "--planner-no-routing"));
  EXPECT_FALSE(HasFlag(b, "--planner-static"));

  // Off by default: no planner flag at all.
  auto off = LoadClusterConfig(WriteTemp("planner_off.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                                              "decode: [{id: d}]\nbroker: {store: s.apw}\n"),
                               "/bin");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  for (const auto& a : off->processes[0].argv) EXPECT_EQ(a.rfind("--planner", 0), std::string::npos) << a;

  for (const char* text : {"broker: {planner: {enabled: true}}\n",
                           "broker: {store: s.apw, planner: {low_watermark: 0.5, high_watermark: 0.1}}\n"}) {
    auto r = LoadClusterConfig(WriteTemp("planner_bad.yaml", std::string("model_dir: m\nprefill: [{id: p}]\n"
                                                                         "decode: [{id: d}]\n") + text),
                               "/bin");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find("planner"), std::string::npos) << r.status().ToString();
  }
}

TEST(ClusterConfig, DeployTightPlannerYamlLoadsWithThePlannerOn) {
  auto cfg = LoadClusterConfig(std::string(PW_SOURCE_DIR) + "/deploy/tight-planner.yaml", "/opt/pw/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  bool planner = false, reserve_wait = false;
  for (const auto& p : cfg->processes) {
    for (const auto& a : p.argv) {
      planner |= p.name == "broker" && a == "--planner";
      reserve_wait |= p.name == "decode-0" && a == "--reserve-wait-ms";
    }
  }
  EXPECT_TRUE(planner);
  EXPECT_TRUE(reserve_wait);
}

TEST(ClusterConfig, DecodeReserveWaitBecomesAFlag) {
  auto cfg = LoadClusterConfig(WriteTemp("reserve_wait.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                                               "decode: [{id: d, reserve_wait_ms: 3000}, {id: e}]\n"),
                               "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  int with = 0;
  for (const auto& p : cfg->processes) {
    auto it = std::find(p.argv.begin(), p.argv.end(), "--reserve-wait-ms");
    if (it == p.argv.end()) continue;
    ++with;
    EXPECT_EQ(p.name, "d");
    ASSERT_NE(it + 1, p.argv.end());
    EXPECT_EQ(*(it + 1), "3000");
  }
  EXPECT_EQ(with, 1) << "only the worker that set it (0, the default, is no flag)";
  // Past the router's 30 s reservation timeout: refused, naming the key.
  auto bad = LoadClusterConfig(WriteTemp("reserve_wait_bad.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                                                   "decode: [{id: d, reserve_wait_ms: 60000}]\n"),
                               "/bin");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("reserve_wait_ms"), std::string::npos) << bad.status().ToString();
}

TEST(ClusterConfig, PlannerWidthsHorizonAndBoundaryAblationBecomeFlags) {
  auto cfg = LoadClusterConfig(
      WriteTemp("planner_floor.yaml",
                "model_dir: m\nprefill: [{id: p}]\n"
                "broker: {store: s.apw, planner: {enabled: true, min_bits: 4, max_bits: 7, min_mean_bits: 4.5, "
                "max_mean_bits: 6, async_movement: false}}\n"
                "decode: [{id: d, demand_horizon_tokens: 64}, {id: e}]\n"),
      "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  int boundary = 0;
  for (const auto& p : cfg->processes) {
    if (p.name == "broker") {
      EXPECT_EQ(ValueAfter(p.argv, "--planner-min-bits"), "4");
      EXPECT_EQ(ValueAfter(p.argv, "--planner-max-bits"), "7");
      EXPECT_EQ(ValueAfter(p.argv, "--planner-min-mean-bits").substr(0, 3), "4.5");
      EXPECT_EQ(ValueAfter(p.argv, "--planner-max-mean-bits").substr(0, 3), "6.0");
    }
    if (p.name == "d") {
      EXPECT_EQ(ValueAfter(p.argv, "--demand-horizon-tokens"), "64");
    }
    if (p.name == "d" || p.name == "e") {  // held reservations count what the floors let a lowering free
      EXPECT_EQ(ValueAfter(p.argv, "--planner-min-bits"), "4") << p.name;
      EXPECT_EQ(ValueAfter(p.argv, "--planner-max-bits"), "7") << p.name;
      EXPECT_EQ(ValueAfter(p.argv, "--planner-min-mean-bits").substr(0, 3), "4.5") << p.name;
    }
    if (p.name == "e") {
      EXPECT_EQ(ValueAfter(p.argv, "--demand-horizon-tokens"), "(absent)") << "0, the default, is no flag";
    }
    boundary += std::count(p.argv.begin(), p.argv.end(), "--plans-at-request-boundaries");
  }
  EXPECT_EQ(boundary, 2) << "every decode worker";
  // The defaults: widths 3..8 and no ablation flag.
  auto def = LoadClusterConfig(WriteTemp("planner_default.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                                                  "broker: {store: s.apw, planner: {enabled: true}}\n"
                                                                  "decode: [{id: d}]\n"),
                               "/bin");
  ASSERT_TRUE(def.ok()) << def.status().ToString();
  for (const auto& p : def->processes) {
    if (p.name == "broker") {
      EXPECT_EQ(ValueAfter(p.argv, "--planner-min-bits"), "3");
      EXPECT_EQ(ValueAfter(p.argv, "--planner-max-bits"), "8");
    }
    EXPECT_EQ(ValueAfter(p.argv, "--plans-at-request-boundaries"), "(absent)");
    if (p.name == "d") EXPECT_EQ(ValueAfter(p.argv, "--planner-min-bits"), "3");
  }
  // No planner: the decode workers get no floors (the defaults, 3..8 and no mean floor).
  auto off = LoadClusterConfig(WriteTemp("planner_off.yaml", "model_dir: m\nprefill: [{id: p}]\n"
                                                              "broker: {store: s.apw}\ndecode: [{id: d}]\n"),
                               "/bin");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  for (const auto& p : off->processes) EXPECT_EQ(ValueAfter(p.argv, "--planner-min-bits"), "(absent)") << p.name;
  for (const char* text : {"{min_bits: 6, max_bits: 5}", "{min_bits: 2}", "{max_bits: 9}", "{min_mean_bits: 8.5}",
                           "{min_mean_bits: 5, max_mean_bits: 4.5}", "{max_bits: 6, max_mean_bits: 7}"}) {
    auto bad = LoadClusterConfig(WriteTemp("planner_bits_bad.yaml", std::string("model_dir: m\nprefill: [{id: p}]\n"
                                                                                "decode: [{id: d}]\n"
                                                                                "broker: {store: s.apw, planner: ") +
                                                                        text + "}\n"),
                                 "/bin");
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.status().message().find("bits"), std::string::npos) << bad.status().ToString();
  }
}

TEST(ClusterConfig, BadFilesNameTheProblem) {
  struct Case {
    const char* yaml;
    const char* expect;
  } cases[] = {
      {"prefill: [{id: p}]\ndecode: [{id: d}]\n", "model_dir"},
      {"model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\nrouter: {port: 70000}\n", "router.port"},
      {"model_dir: m\nprefill: [{id: p}]\ndecode: [{id: p}]\n", "used twice"},
      {"model_dir: m\nprefill: [{id: p, metrics_port: 8000}]\ndecode: [{id: d}]\n", "used twice"},
      {"model_dir: m\nprefill: []\ndecode: [{id: d}]\n", "prefill"},
      {"model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\nroutr: {}\n", "routr"},
      {"model_dir: [unclosed\n", "local"},
  };
  int i = 0;
  for (const auto& c : cases) {
    std::string path = WriteTemp("bad" + std::to_string(i++) + ".yaml", c.yaml);
    auto cfg = LoadClusterConfig(path, "/bin");
    ASSERT_FALSE(cfg.ok()) << c.yaml;
    EXPECT_NE(cfg.status().message().find(path), std::string::npos) << cfg.status().message();
    if (std::string(c.expect) != "local") {
      EXPECT_NE(cfg.status().message().find(c.expect), std::string::npos)
          << "yaml:\n" << c.yaml << "error: " << cfg.status().message();
    }
  }
}

TEST(Supervisor, RestartsWithBackoffAndDrainsOnStop) {
  const std::string run_dir = std::string(PW_BINARY_DIR) + "/test-tmp/supervisor-run";
  std::filesystem::remove_all(run_dir);
  RestartPolicy policy;
  policy.initial_backoff_ms = 50;
  policy.max_backoff_ms = 200;
  policy.stable_after_ms = 100000;
  policy.fail_fast_exits = 0;  // restarted forever: this test is about the backoff
  std::vector<ProcessSpec> specs = {
      {"crasher", {"/bin/sh", "-c", "echo started; exit 3"}, 1},
      {"steady", {"/bin/sh", "-c", "trap 'echo drained; exit 0' TERM; while true; do sleep 0.05; done"}, 0},
  };
  Supervisor sup(specs, policy, run_dir, 5000);
  ASSERT_TRUE(sup.Start().ok());
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1500)) {
    sup.Tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto& states = sup.states();
  ASSERT_EQ(states[0].spec.name, "steady");  // sorted by start order
  EXPECT_EQ(states[0].restarts, 0);
  // Backoff 50, 100, 200, 200, ... ms: within 1.5 s a handful of restarts, not hundreds.
  EXPECT_GE(states[1].restarts, 3);
  EXPECT_LE(states[1].restarts, 12);
  EXPECT_EQ(states[1].backoff_ms, 200);
  sup.Stop();
  for (const auto& s : sup.states()) EXPECT_EQ(s.pid, -1);
  std::ifstream log(run_dir + "/steady.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("drained"), std::string::npos);  // it got SIGTERM, not SIGKILL
}

// The state file records every child with its pid and start time from Start() on, follows a
// restart to the new pid, and records the node stopped after Stop().
TEST(Supervisor, RecordsItsChildrenInTheStateFile) {
  const std::string run_dir = std::string(PW_BINARY_DIR) + "/test-tmp/state-run";
  std::filesystem::remove_all(run_dir);
  RestartPolicy policy;
  policy.initial_backoff_ms = 10;
  std::vector<ProcessSpec> specs = {
      {"second", {"/bin/sh", "-c", "while true; do sleep 0.05; done"}, 1},
      {"first", {"/bin/sh", "-c", "while true; do sleep 0.05; done"}, 0},
  };
  Supervisor sup(specs, policy, run_dir, 5000);
  ASSERT_TRUE(sup.Start().ok());
  EXPECT_EQ(sup.state_path(), run_dir + "/pw-cluster.state");
  auto check = [&](const char* when) {
    SCOPED_TRACE(when);
    auto st = ReadLauncherState(sup.state_path());
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->launcher_pid, getpid());
    ASSERT_EQ(st->processes.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const auto& rec = st->processes[i];
      const auto& s = sup.states()[i];
      EXPECT_EQ(rec.name, s.spec.name);
      EXPECT_EQ(rec.pid, s.pid);
      EXPECT_EQ(rec.restarts, s.restarts);
      if (s.pid > 0) {
        auto ticks = ProcessStartTicks(s.pid);
        ASSERT_TRUE(ticks.ok()) << ticks.status().ToString();
        EXPECT_EQ(rec.start_ticks, *ticks);
        EXPECT_TRUE(IsRecordedProcessRunning(rec.pid, rec.start_ticks));
      }
    }
  };
  check("started");
  EXPECT_EQ(sup.states()[0].spec.name, "first");
  const pid_t old_pid = sup.states()[1].pid;
  ASSERT_GT(old_pid, 0);
  kill(old_pid, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  while ((sup.states()[1].restarts < 1 || sup.states()[1].pid <= 0) &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    sup.Tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(sup.states()[1].restarts, 1);
  EXPECT_NE(sup.states()[1].pid, old_pid);
  check("restarted");
  sup.Stop();
  auto st = ReadLauncherState(sup.state_path());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  for (const auto& p : st->processes) {
    EXPECT_EQ(p.pid, -1) << p.name;
    EXPECT_EQ(p.start_ticks, 0u) << p.name;
  }
  EXPECT_EQ(st->processes[1].restarts, 1);
}

// An unwritable run directory stops Start() before any process runs: status could not see it.
TEST(Supervisor, UnwritableStateFileIsAStartError) {
  const std::string run_dir = std::string(PW_BINARY_DIR) + "/test-tmp/state-unwritable";
  std::filesystem::remove_all(run_dir);
  std::filesystem::create_directories(run_dir + "/pw-cluster.state");  // a directory: no rename
  Supervisor sup({{"p", {"/bin/sh", "-c", "exit 0"}, 0}}, RestartPolicy{}, run_dir, 100);
  Status st = sup.Start();
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find(run_dir + "/pw-cluster.state"), std::string::npos) << st.message();
  EXPECT_EQ(sup.states()[0].pid, -1);
}

// A process that exits right after its start 3 times in a row stops the node: Run() returns
// (bounded: backoff 20, 40 ms) with its name, command line and last log lines, and the other
// processes are drained.
TEST(Supervisor, ProcessThatKeepsExitingAtStartStopsTheNode) {
  const std::string run_dir = std::string(PW_BINARY_DIR) + "/test-tmp/failfast-run";
  std::filesystem::remove_all(run_dir);
  RestartPolicy policy;
  policy.initial_backoff_ms = 20;
  policy.fail_fast_ms = 5000;
  policy.fail_fast_exits = 3;
  std::vector<ProcessSpec> specs = {
      {"steady", {"/bin/sh", "-c", "trap 'echo drained; exit 0' TERM; while true; do sleep 0.05; done"}, 0},
      {"prefill-0", {"/bin/sh", "-c", "echo loading; echo 'model.safetensors: truncated' >&2; exit 4"}, 1},
  };
  Supervisor sup(specs, policy, run_dir, 5000);
  ASSERT_TRUE(sup.Start().ok());
  std::atomic<bool> stop{false};
  const auto t0 = std::chrono::steady_clock::now();
  Status st = sup.Run(stop);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_EQ(st.code(), StatusCode::kUnavailable);
  const std::string& m = st.message();
  EXPECT_NE(m.find("prefill-0 exited 3 times within 5000 ms of starting (last: code 4"),
            std::string::npos) << m;
  EXPECT_NE(m.find("command: /bin/sh -c echo loading;"), std::string::npos) << m;
  EXPECT_NE(m.find("  | model.safetensors: truncated"), std::string::npos) << m;
  EXPECT_EQ(sup.states()[1].restarts, 2);
  for (const auto& s : sup.states()) EXPECT_EQ(s.pid, -1);
  std::ifstream log(run_dir + "/steady.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("drained"), std::string::npos);
}

// A process that dies after running longer than fail_fast_ms is restarted, every time.
TEST(Supervisor, ProcessThatDiesLaterIsStillRestarted) {
  const std::string run_dir = std::string(PW_BINARY_DIR) + "/test-tmp/later-run";
  std::filesystem::remove_all(run_dir);
  RestartPolicy policy;
  policy.initial_backoff_ms = 10;
  policy.max_backoff_ms = 10;
  policy.fail_fast_ms = 100;
  policy.fail_fast_exits = 2;
  Supervisor sup({{"worker", {"/bin/sh", "-c", "sleep 0.15; exit 1"}, 0}}, policy, run_dir, 1000);
  ASSERT_TRUE(sup.Start().ok());
  const auto t0 = std::chrono::steady_clock::now();
  while (sup.states()[0].restarts < 4 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    sup.Tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(sup.failure().ok()) << sup.failure().message();
  EXPECT_GE(sup.states()[0].restarts, 4);
  sup.Stop();
}

TEST(LogTail, LastLines) {
  const std::string path = WriteTemp("tail.log", "a\nb\nc\nd\n");
  EXPECT_EQ(LogTail(path, 2), "c\nd");
  EXPECT_EQ(LogTail(path, 10), "a\nb\nc\nd");
  EXPECT_EQ(LogTail(WriteTemp("one.log", "only"), 3), "only");
  EXPECT_EQ(LogTail(WriteTemp("empty.log", ""), 3), "");
  EXPECT_EQ(LogTail("/nonexistent/x.log", 3), "");
}

TEST(Supervisor, MissingBinaryIsAClearError) {
  Supervisor sup({{"ghost", {"/nonexistent/pw-ghost"}, 0}}, RestartPolicy{},
                 std::string(PW_BINARY_DIR) + "/test-tmp/ghost-run", 100);
  Status st = sup.Start();
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("/nonexistent/pw-ghost"), std::string::npos);
}

TEST(ClusterConfig, PlannerResidualsBecomeBrokerFlags) {
  auto cfg = LoadClusterConfig(
      WriteTemp("residuals.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\n"
                                  "broker: {store: s.apw, planner: {enabled: true, residuals: h.pwrh}}\n"),
      "/bin");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto off = LoadClusterConfig(
      WriteTemp("residuals_off.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\n"
                                      "broker: {store: s.apw, planner: {enabled: true, residuals: h.pwrh, "
                                      "use_residuals: false}}\n"),
      "/bin");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  auto broker_argv = [](const ClusterConfig& c) {
    for (const auto& p : c.processes)
      if (p.name == "broker") return p.argv;
    return std::vector<std::string>{};
  };
  const auto on_argv = broker_argv(*cfg), off_argv = broker_argv(*off);
  auto it = std::find(on_argv.begin(), on_argv.end(), "--planner-residuals");
  ASSERT_NE(it, on_argv.end());
  ASSERT_NE(it + 1, on_argv.end());
  EXPECT_EQ(*(it + 1), "h.pwrh");
  EXPECT_EQ(std::count(on_argv.begin(), on_argv.end(), "--planner-no-residuals"), 0);
  EXPECT_EQ(std::count(off_argv.begin(), off_argv.end(), "--planner-no-residuals"), 1);
}

}  // namespace
}  // namespace pw::cluster
