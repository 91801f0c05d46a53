// A whole paged node for cluster tests, started as an operator would (pw-cluster up with a
// YAML file): the broker serving the embedded model's .apw store, the router, one prefill and
// one decode worker. Tests drive it through the OpenAI API over HTTP, pw-ctl and /metrics.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/run_command.h"
#include "tests/support/http_util.h"
#include "tests/support/process_util.h"

namespace pw::testing {

inline std::string TinyModelDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }
inline std::string TinyStorePath() { return std::string(PW_BINARY_DIR) + "/tiny-moe.apw"; }
inline std::string BinPath(const std::string& name) {
  return std::string(PW_BINARY_DIR) + "/bin/" + name;
}

// Why a paged node cannot run here (no embedded weights, or no store: the Release build makes
// it), or "" when it can.
inline std::string PagedNodeMissing() {
  if (!std::filesystem::exists(TinyModelDir() + "/model.safetensors")) {
    return "no weights in " + TinyModelDir();
  }
  if (!std::filesystem::exists(TinyStorePath())) {
    return "no store " + TinyStorePath() + " (built by the Release build)";
  }
  return "";
}

// Runs a command; returns {exit code, stdout + stderr}.
inline std::pair<int, std::string> Shell(const std::string& cmd) {
  pw::testing::CommandResult r = pw::testing::RunCommand(cmd);
  return {r.status, std::move(r.output)};
}

// What differs between the tests' nodes; the rest of the YAML is the same for all.
struct PagedNodeConfig {
  std::string name;            // the run directory: build/test-tmp/<name>
  int initial_bits = 4;        // broker.initial_bits
  std::string router_extra;    // more router fields, e.g. ", max_waiting: 1024"
  std::string broker_extra;    // more broker fields, e.g. ", planner: {enabled: true}"
  int prefill_kv_blocks = 256;
  std::string prefill_extra;   // more prefill fields, e.g. ", expert_bits: 4" (with store_for_prefill)
  bool store_for_prefill = false;  // the prefill entry names the broker's store
  std::string decode_fields = "kv_blocks: 512";  // the decode worker's fields besides id and ports
};

class PagedNode {
 public:
  PagedNode() = default;
  PagedNode(const PagedNode&) = delete;
  PagedNode& operator=(const PagedNode&) = delete;
  ~PagedNode() { Stop(); }

  // Writes the node's YAML, starts pw-cluster and waits until it serves a completion. Call
  // through ASSERT_NO_FATAL_FAILURE. A port picked free can be taken by another test's process
  // before the node binds it (ctest -j): a node that stops at start on "Address already in use"
  // is started again on new ports, at most three times.
  void Start(const PagedNodeConfig& c) {
    for (int attempt = 1;; ++attempt) {
      ASSERT_NO_FATAL_FAILURE(StartOnce(c));
      const NodeStart start = WaitNodeStart(cluster_, http_port_, 120, "tiny-moe", [&] { return Logs(); });
      if (start == NodeStart::kServing) return;
      ASSERT_TRUE(start == NodeStart::kPortTaken && attempt < 3) << Logs();
      Stop();
    }
  }
  void StartOnce(const PagedNodeConfig& c) {
    http_port_ = FreePort();
    ctl_port_ = FreePort();
    broker_port_ = FreePort();
    decode_metrics_ = FreePort();
    broker_metrics_ = FreePort();
    run_dir_ = std::string(PW_BINARY_DIR) + "/test-tmp/" + c.name;
    std::filesystem::remove_all(run_dir_);
    std::filesystem::create_directories(run_dir_);
    const std::string yaml = run_dir_ + "/cluster.yaml";
    std::ofstream(yaml) << "model_dir: " << TinyModelDir() << "\nmodel_name: tiny-moe\nrun_dir: "
                        << run_dir_ << "\nbin_dir: " << PW_BINARY_DIR
                        << "/bin\nheartbeat_ms: 300\ndrain_timeout_ms: 20000\n"
                        << "router: {port: " << http_port_ << ", control_port: " << ctl_port_
                        << ", lease_ms: 20000" << c.router_extra << "}\n"
                        << "broker: {control_port: " << broker_port_
                        << ", metrics_port: " << broker_metrics_ << ", store: " << TinyStorePath()
                        << ", initial_bits: " << c.initial_bits << c.broker_extra << "}\n"
                        << "prefill: [{id: prefill-0, kv_blocks: " << c.prefill_kv_blocks
                        << (c.store_for_prefill ? ", store: " + TinyStorePath() : std::string()) << c.prefill_extra
                        << "}]\n"
                        << "decode: [{id: decode-0, " << c.decode_fields
                        << ", metrics_port: " << decode_metrics_ << "}]\n"
                        << "restart: {initial_backoff_ms: 200, max_backoff_ms: 2000}\n";
    ASSERT_TRUE(cluster_.Start({BinPath("pw-cluster"), "up", "--config", yaml},
                               run_dir_ + "/pw-cluster.out"));
  }
  // SIGTERM to pw-cluster (every process drains and stops); its exit code (ChildProcess::Wait).
  int Terminate(int timeout_ms) {
    cluster_.Kill(SIGTERM);
    return cluster_.Wait(timeout_ms);
  }
  // SIGKILLs pw-cluster and whatever of its children it left behind.
  void Stop() {
    if (ctl_port_ == 0) return;
    cluster_.Kill(SIGKILL);
    KillNodeProcesses({ctl_port_, broker_port_});
    KillConfigProcesses(config_path());
    ctl_port_ = 0;
  }

  std::string Logs() const { return RunLogs(run_dir_); }
  // The node file; pw-cluster starts each process with `--config <it> --section <name>`.
  std::string config_path() const { return run_dir_ + "/cluster.yaml"; }
  // pw-ctl against this node's broker with its control keys.
  std::pair<int, std::string> Ctl(const std::string& args) const {
    return Shell(BinPath("pw-ctl") + " --broker tcp://127.0.0.1:" + std::to_string(broker_port_) +
                 " --control-keys " + run_dir_ + "/control.keys " + args);
  }
  // The decode worker's (or `port`'s) /metrics text; "" when it does not answer.
  std::string MetricsText(int port = 0) const {
    auto [status, body] = Http(port != 0 ? port : decode_metrics_, "GET", "/metrics", "", 10);
    return status == 200 ? body : "";
  }
  // The first sample of the decode worker (or `port`) whose line starts with `prefix`
  // ("name{labels"), or -1.
  double Metric(const std::string& prefix, int port = 0) const {
    const std::string body = MetricsText(port);
    const size_t at = body.find("\n" + prefix);
    if (at == std::string::npos) return -1;
    const size_t sp = body.find(' ', at + 1 + prefix.size());
    return std::atof(body.c_str() + sp + 1);
  }
  // The decode worker's (or `port`'s) samples of `name` whose labels contain `label`, summed;
  // -1 when there is none.
  double MetricSum(const std::string& name, const std::string& label = "", int port = 0) const {
    const std::string body = MetricsText(port);
    double sum = 0;
    bool found = false;
    size_t at = 0;
    while ((at = body.find("\n" + name, at)) != std::string::npos) {
      const size_t end = body.find('\n', at + 1);
      const std::string line = body.substr(at + 1, end - at - 1);
      at = end;
      const char next = line.size() > name.size() ? line[name.size()] : ' ';
      if ((next != '{' && next != ' ') || line.find(label) == std::string::npos) continue;
      sum += std::atof(line.c_str() + line.rfind(' ') + 1);
      found = true;
    }
    return found ? sum : -1;
  }
  // One greedy completion's text, or what went wrong ("HTTP 503: ...", "bad reply: ...").
  std::string Complete(const std::vector<int32_t>& prompt, int max_tokens) const {
    const nlohmann::json req = {
        {"model", "tiny-moe"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
    auto [status, body] = Http(http_port_, "POST", "/v1/completions", req.dump());
    if (status != 200) return "HTTP " + std::to_string(status) + ": " + body;
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.contains("choices")) return "bad reply: " + body;
    return j["choices"][0]["text"].get<std::string>();
  }

  const std::string& run_dir() const { return run_dir_; }
  int http_port() const { return http_port_; }
  int broker_port() const { return broker_port_; }
  int broker_metrics_port() const { return broker_metrics_; }

 private:
  ChildProcess cluster_;
  int http_port_ = 0, ctl_port_ = 0, broker_port_ = 0, decode_metrics_ = 0, broker_metrics_ = 0;
  std::string run_dir_;
};

}  // namespace pw::testing
