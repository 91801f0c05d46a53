// Every process of a node runs from the node file alone (`--config FILE [--section NAME]`,
// services/common/node_config.h): the real pw-router, pw-broker, pw-prefill and pw-decode on
// loopback, the file deploy/local.yaml that pw-cluster uses, its errors, and
// `pw-cluster config --dump`.
#include <gtest/gtest.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "tests/common/run_command.h"
#include "tests/support/http_util.h"
#include "tests/support/process_util.h"

namespace pw {
namespace {

using testing::RunCommand;

std::string Bin(const std::string& name) { return std::string(PW_BINARY_DIR) + "/bin/" + name; }
std::string ModelDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }
std::string LocalYaml() { return std::string(PW_SOURCE_DIR) + "/deploy/local.yaml"; }

std::string TempDir() {
  std::string dir = std::string(PW_BINARY_DIR) + "/test-tmp/node-config-" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::create_directories(dir);
  return dir;
}

std::string Write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// The sum of the `name` samples labelled worker="<worker>" in a Prometheus text page.
double SumOf(const std::string& page, const std::string& name, const std::string& worker) {
  std::istringstream in(page);
  std::string line;
  double sum = 0;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) != 0 || line.find("worker=\"" + worker + "\"") == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

TEST(NodeConfig, EveryProcessComesUpFromTheFileAlone) {
  if (!std::filesystem::exists(ModelDir() + "/model.safetensors")) GTEST_SKIP() << "no weights in " << ModelDir();
  std::set<int> used;
  auto port = [&used] {
    int p;
    do p = testing::FreePort(); while (!used.insert(p).second);
    return p;
  };
  const int http = port(), ctl = port(), broker = port(), broker_metrics = port(), prefill_metrics = port(),
            decode_metrics = port();
  const std::string dir = TempDir();
  const std::string yaml = Write(dir + "/node.yaml",
                                 "model_dir: " + ModelDir() + "\nmodel_name: tiny-moe\nheartbeat_ms: 300\n"
                                 "router: {port: " + std::to_string(http) + ", control_port: " + std::to_string(ctl) +
                                 ", max_waiting: 17}\n"
                                 "broker: {control_port: " + std::to_string(broker) + ", metrics_port: " +
                                 std::to_string(broker_metrics) + "}\n"
                                 "prefill: [{id: pf-a, kv_blocks: 64, metrics_port: " + std::to_string(prefill_metrics) +
                                 "}]\n"
                                 "decode: [{id: dc-a, kv_blocks: 77, max_batch: 5, metrics_port: " +
                                 std::to_string(decode_metrics) + "}]\n");
  // Nothing but the file (and an unauthenticated control plane: no keys in a test).
  testing::ChildProcess router, brk, prefill, decode;
  ASSERT_TRUE(brk.Start({Bin("pw-broker"), "--config", yaml, "--insecure"}, dir + "/broker.log"));
  ASSERT_TRUE(router.Start({Bin("pw-router"), "--config", yaml, "--insecure"}, dir + "/router.log"));
  ASSERT_TRUE(prefill.Start({Bin("pw-prefill"), "--config", yaml, "--insecure"}, dir + "/prefill.log"));
  ASSERT_TRUE(decode.Start({Bin("pw-decode"), "--config", yaml, "--insecure"}, dir + "/decode.log"));
  auto logs = [&] {
    return testing::RunLogs(dir, {"broker.log", "router.log", "prefill.log", "decode.log"});
  };
  // The router on the file's port, the workers registered on the file's control port.
  ASSERT_TRUE(testing::WaitServing(http, 120)) << logs();
  // Each worker's /metrics on the file's port, with its id (and the decode worker's pool size)
  // from the file.
  const std::string decode_page = testing::Http(decode_metrics, "GET", "/metrics", "").second;
  EXPECT_EQ(SumOf(decode_page, "pagedweight_kv_blocks", "dc-a"), 77) << decode_page;
  const std::string prefill_page = testing::Http(prefill_metrics, "GET", "/metrics", "").second;
  EXPECT_NE(prefill_page.find("worker=\"pf-a\""), std::string::npos) << prefill_page;
  EXPECT_EQ(testing::Http(broker_metrics, "GET", "/metrics", "").first, 200) << logs();
  EXPECT_NE(testing::ReadFile(dir + "/broker.log").find("worker 'dc-a' registered"), std::string::npos) << logs();
  for (auto* c : {&decode, &prefill, &router, &brk}) c->Kill(SIGKILL);
  testing::KillConfigProcesses(yaml);
}

// The root's `kernels:` map reaches the kernels of every worker; a knob's environment variable,
// when set, wins over it.
TEST(NodeConfig, TheKernelsSectionReachesTheKernelsAndTheEnvironmentWins) {
  const std::string dir = TempDir();
  const std::string yaml =
      Write(dir + "/node.yaml", "model_dir: " + ModelDir() + "\nkernels: {cpu_isa: scalar, anyprec_backend: scalar, prefetch_level: l1}\n"
                                "router: {control_port: " + std::to_string(testing::FreePort()) + "}\n"
                                "prefill: [{id: p}]\ndecode: [{id: d}]\n");
  // The line every worker logs at its start, before it reaches the router.
  auto kernels_line = [&](const char* binary, const char* env_isa) {
    const std::string log = dir + "/" + binary + (env_isa ? "-env" : "") + ".log";
    std::filesystem::remove(log);
    if (env_isa) setenv("PW_CPU_ISA", env_isa, 1);
    testing::ChildProcess p;
    const bool started = p.Start({Bin(binary), "--config", yaml, "--insecure"}, log);
    if (env_isa) unsetenv("PW_CPU_ISA");
    EXPECT_TRUE(started);
    std::string line;
    for (int i = 0; i < 600 && line.empty(); ++i) {
      const std::string text = testing::ReadFile(log);
      const size_t at = text.find("kernels: dense ");
      if (at != std::string::npos && text.find('\n', at) != std::string::npos) {
        line = text.substr(at, text.find('\n', at) - at);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    p.Kill(SIGKILL);
    return line;
  };
  for (const char* binary : {"pw-prefill", "pw-decode"}) {
    const std::string line = kernels_line(binary, nullptr);
    EXPECT_EQ(line.rfind("kernels: dense scalar, any-precision fast path scalar", 0), 0u) << binary << ": " << line;
    EXPECT_NE(line.find(", any-precision prefetch into L1"), std::string::npos) << binary << ": " << line;
  }
  if (!std::string(RunCommand("grep -qw avx2 /proc/cpuinfo && echo yes").output).empty()) {
    const std::string line = kernels_line("pw-decode", "avx2");
    EXPECT_EQ(line.rfind("kernels: dense avx2, any-precision fast path scalar", 0), 0u) << line;
  }
  // --print-config shows the knobs in effect.
  setenv("PW_POOL_SPIN_US", "7", 1);
  auto r = RunCommand(Bin("pw-decode") + " --config " + yaml + " --print-config");
  unsetenv("PW_POOL_SPIN_US");
  EXPECT_NE(r.output.find("kernels:\n  cpu_isa: scalar\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  pool_spin_us: 7\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  prefetch_level: l1\n"), std::string::npos) << r.output;
  // A bad knob in the file, with its position.
  const std::string bad = Write(dir + "/bad.yaml", "model_dir: m\nkernels: {cpu_isa: sse}\nprefill: [{id: p}]\ndecode: [{id: d}]\n");
  auto b = RunCommand(Bin("pw-prefill") + " --config " + bad + " --print-config");
  EXPECT_EQ(b.status, 2) << b.output;
  EXPECT_NE(b.output.find(bad + ":2:20: kernels.cpu_isa: 'sse' is not one of: scalar, avx2, avx512, amx"),
            std::string::npos)
      << b.output;
  const std::string bad_level =
      Write(dir + "/bad-level.yaml", "model_dir: m\nkernels: {prefetch_level: l3}\nprefill: [{id: p}]\ndecode: [{id: d}]\n");
  auto bl = RunCommand(Bin("pw-decode") + " --config " + bad_level + " --print-config");
  EXPECT_EQ(bl.status, 2) << bl.output;
  EXPECT_NE(bl.output.find(bad_level + ":2:27: kernels.prefetch_level: 'l3' is not one of: l1, l2"),
            std::string::npos)
      << bl.output;
}

// On one machine every worker sizes its pool to every core it may run on unless the file says
// otherwise (docs/architecture.md, "One machine"): the line each worker logs at its start.
TEST(NodeConfig, WorkersComputeOnEveryCoreUnlessTheFileSaysOtherwise) {
  const std::string dir = TempDir();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int cores = CPU_COUNT(&set);
  auto threads_line = [&](const char* binary, const std::string& threads_key) {
    const std::string yaml =
        Write(dir + "/" + binary + ".yaml",
              "model_dir: " + ModelDir() + "\nrouter: {control_port: " +
                  std::to_string(testing::FreePort()) + "}\nprefill: [{id: p" + threads_key +
                  "}]\ndecode: [{id: d" + threads_key + "}]\n");
    const std::string log = dir + "/" + binary + ".log";
    std::filesystem::remove(log);
    testing::ChildProcess p;
    EXPECT_TRUE(p.Start({Bin(binary), "--config", yaml, "--insecure"}, log));
    std::string line;
    for (int i = 0; i < 600 && line.empty(); ++i) {
      const std::string text = testing::ReadFile(log);
      const size_t at = text.find(" compute threads");
      if (at != std::string::npos) {
        line = text.substr(text.rfind(' ', at - 1) + 1, at - text.rfind(' ', at - 1) - 1);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    p.Kill(SIGKILL);
    return line;
  };
  for (const char* binary : {"pw-prefill", "pw-decode"}) {
    EXPECT_EQ(threads_line(binary, ""), std::to_string(cores)) << binary;
    EXPECT_EQ(threads_line(binary, ", threads: 1"), "1") << binary;
  }
}

// Runs `binary --config deploy/local.yaml <extra> --print-config`; its output.
std::string PrintConfig(const std::string& binary, const std::string& extra = "") {
  auto r = RunCommand(Bin(binary) + " --config " + LocalYaml() + " " + extra + " --print-config");
  EXPECT_EQ(r.status, 0) << r.output;
  return r.output;
}

TEST(NodeConfig, EveryProcessReadsTheLauncherFileAndFlagsWin) {
  struct Case {
    const char* binary;
    const char* extra;
    std::vector<const char*> lines;
  } cases[] = {
      {"pw-router", "", {"model_dir: models/tiny-moe\n", "port: 8000\n", "workers: tcp://127.0.0.1:5555\n",
                         "lease_ms: 30000\n", "max_waiting: 256\n", "max_queued_kv: 1.0\n", "drain_timeout_ms: 30000\n"}},
      {"pw-broker", "", {"bind: tcp://127.0.0.1:5556\n", "metrics: 127.0.0.1:9100\n", "store: build/tiny-moe.apw\n",
                         "initial_bits: 8\n", "planner:\n  enabled: false\n"}},
      {"pw-prefill", "", {"router: [tcp://127.0.0.1:5555]\n", "broker: tcp://127.0.0.1:5556\n", "id: prefill-0\n",
                          "kv_blocks: 512\n", "metrics: 127.0.0.1:9101\n"}},
      {"pw-decode", "--section decode-0", {"id: decode-0\n", "kv_blocks: 2048\n", "max_batch: 64\n",
                                           "metrics: 127.0.0.1:9102\n", "lynx:\n  enabled: false\n"}},
      // A flag over the file's value.
      {"pw-router", "--port 9999 --max-waiting 3", {"port: 9999\n", "max_waiting: 3\n", "lease_ms: 30000\n"}},
      {"pw-decode", "--kv-blocks 5 --lynx", {"kv_blocks: 5\n", "lynx:\n  enabled: true\n", "max_batch: 64\n"}},
      {"pw-broker", "--planner-low 0.01", {"low_watermark: 0.01\n", "initial_bits: 8\n"}},
      // bf16 activations by default; the exact fp32 ones by the flag.
      {"pw-prefill", "", {"  bf16_activations: true\n"}},
      {"pw-decode", "--kernels-exact-activations", {"  bf16_activations: false\n"}},
  };
  for (const auto& c : cases) {
    const std::string out = PrintConfig(c.binary, c.extra);
    for (const char* line : c.lines) EXPECT_NE(out.find(line), std::string::npos) << c.binary << " " << c.extra << ": " << line << "\n" << out;
  }
  // An id the file does not have.
  auto r = RunCommand(Bin("pw-decode") + " --config " + LocalYaml() + " --section decode-9 --print-config");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("no decode worker with id 'decode-9' (ids: decode-0)"), std::string::npos) << r.output;
}

// A process checks the shared root keys, its own section and those it reads (pw-decode: the
// broker's); pw-cluster has every process check its own before it starts any.
TEST(NodeConfig, ABadKeyOrTypeNamesFileLineColumn) {
  const std::string dir = TempDir();
  struct Case {
    const char* file;
    const char* yaml;
    const char* error;
    std::set<std::string> refuse;  // the binaries that refuse the file (pw-cluster always)
  } cases[] = {
      {"bad_router.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\nrouter:\n  port: 8000\n  prot: 1\n",
       ":6:3: router.prot: unknown key (known keys: control_port, tokenizer, context_length, port,", {"pw-router"}},
      {"bad_broker.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode: [{id: d}]\nbroker:\n  planner: {low_watermark: high}\n",
       ":5:28: broker.planner.low_watermark: expected a number, got 'high'", {"pw-broker", "pw-decode"}},
      {"bad_prefill.yaml", "model_dir: m\nprefill:\n  - id: p\n    kv_block: 3\ndecode: [{id: d}]\n",
       ":4:5: prefill[0].kv_block: unknown key", {"pw-prefill"}},
      {"bad_decode.yaml", "model_dir: m\nprefill: [{id: p}]\ndecode:\n  - id: d\n    threads: many\n",
       ":5:14: decode[0].threads: expected an integer, got 'many'", {"pw-decode"}},
      {"bad_root.yaml", "model_dir: m\nheartbeat_ms: soon\nprefill: [{id: p}]\ndecode: [{id: d}]\n",
       ":2:15: heartbeat_ms: expected an integer, got 'soon'", {"pw-router", "pw-broker", "pw-prefill", "pw-decode"}},
  };
  for (const auto& c : cases) {
    const std::string path = Write(dir + "/" + c.file, c.yaml);
    for (const char* binary : {"pw-router", "pw-broker", "pw-prefill", "pw-decode"}) {
      auto r = RunCommand(Bin(binary) + " --config " + path + " --print-config");
      if (c.refuse.count(binary)) {
        EXPECT_EQ(r.status, 2) << binary << " " << c.file << ": " << r.output;
        EXPECT_NE(r.output.find(path + c.error), std::string::npos) << binary << " " << c.file << ": " << r.output;
      } else {
        EXPECT_EQ(r.status, 0) << binary << " " << c.file << " (not its section): " << r.output;
      }
    }
    auto r = RunCommand(Bin("pw-cluster") + " config --dump --config " + path);
    EXPECT_EQ(r.status, 2) << c.file << ": " << r.output;
    EXPECT_NE(r.output.find(path + c.error), std::string::npos) << c.file << ": " << r.output;
    EXPECT_NE(r.output.find("refuses its options"), std::string::npos) << c.file << ": " << r.output;
  }
}

TEST(NodeConfig, PwClusterConfigDumpIsWhatEachProcessLoads) {
  auto r = RunCommand(Bin("pw-cluster") + " config --dump --config " + LocalYaml());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.rfind("# The effective options of every process of ", 0), 0u) << r.output;
  for (const char* line : {"broker:  # broker\n", "router:  # router\n", "prefill-0:  # prefill\n",
                           "decode-0:  # decode\n", "  kv_blocks: 2048\n", "  store: build/tiny-moe.apw\n",
                           "  max_batch_prompts: 32\n", "    gate_weights: renorm\n"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
  // Each process's block is, line for line, what that process prints for itself.
  const std::pair<const char*, const char*> procs[] = {
      {"broker", "pw-broker"}, {"router", "pw-router"}, {"prefill-0", "pw-prefill"}, {"decode-0", "pw-decode"}};
  for (const auto& [name, binary] : procs) {
    std::string own;
    std::istringstream in(PrintConfig(binary, std::string("--section ") + name));
    for (std::string line; std::getline(in, line);) own += "  " + line + "\n";
    const std::string header = std::string(name) + ":  # ";
    const size_t at = r.output.find(header);
    ASSERT_NE(at, std::string::npos) << name;
    const size_t body = r.output.find('\n', at) + 1;
    EXPECT_EQ(r.output.compare(body, own.size(), own), 0) << name << ":\n" << own << "\nvs\n" << r.output.substr(body);
  }
}

}  // namespace
}  // namespace pw
