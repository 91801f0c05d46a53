// pw-ctl: inspect and change expert widths by hand through the broker (services/ctl/).
//
//   pw-ctl [--broker tcp://127.0.0.1:5556] (--control-keys RUN_DIR/control.keys | --insecure)
//          show [--block] [--layer L]
//   pw-ctl set-bits B --all | --layer L | --block L:E[:gate_up|down]
//   pw-ctl apply PLAN.yaml            (services/ctl/plan_file.h)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "common/logging.h"
#include "services/ctl/ctl_client.h"
#include "services/transport/control_auth.h"
#include "services/transport/service_setup.h"

namespace {

// "L:E" or "L:E:gate_up|down".
pw::Status ParseBlock(const std::string& s, int* layer, int* expert, int* proj) {
  const auto bad = [&] {
    return pw::InvalidArgument("--block '" + s + "': expected LAYER:EXPERT or LAYER:EXPERT:gate_up|down");
  };
  const size_t a = s.find(':');
  if (a == std::string::npos) return bad();
  const size_t b = s.find(':', a + 1);
  try {
    size_t used = 0;
    *layer = std::stoi(s.substr(0, a), &used);
    if (used != a || *layer < 0) return bad();
    const std::string e = s.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
    *expert = std::stoi(e, &used);
    if (used != e.size() || *expert < 0) return bad();
  } catch (const std::exception&) {
    return bad();
  }
  *proj = -1;
  if (b != std::string::npos) {
    const std::string p = s.substr(b + 1);
    if (p == "gate_up") {
      *proj = 0;
    } else if (p == "down") {
      *proj = 1;
    } else {
      return bad();
    }
  }
  return pw::Status::Ok();
}

int Fail(const pw::Status& st) {
  std::fprintf(stderr, "pw-ctl: %s\n", st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"PagedWeight control: expert widths by hand"};
  std::string broker = "tcp://127.0.0.1:5556";
  int timeout_ms = 5000;
  app.add_option("--broker", broker, "broker control endpoint");
  app.add_option("--timeout-ms", timeout_ms, "how long to wait for the broker")->check(CLI::Range(1, 600000));
  pw::transport::ServiceSecurityFlags security;
  app.add_option("--control-keys", security.control_keys, pw::transport::kControlKeysHelp);
  app.add_flag("--insecure", security.insecure, pw::transport::kInsecureHelp);
  app.require_subcommand(1);

  auto* show = app.add_subcommand("show", "committed widths per layer, pool pages by tenant");
  bool show_blocks = false;
  int show_layer = -1;
  show->add_flag("--block", show_blocks, "every block, not only per-layer histograms");
  show->add_option("--layer", show_layer, "only this layer")->check(CLI::NonNegativeNumber);

  auto* set = app.add_subcommand("set-bits", "set the width of expert blocks");
  int bits = 0;
  bool all = false;
  int set_layer = -1;
  std::string block;
  set->add_option("bits", bits, "3..8")->required();
  auto* o_all = set->add_flag("--all", all, "every block");
  auto* o_layer = set->add_option("--layer", set_layer, "every block of one layer")->check(CLI::NonNegativeNumber);
  auto* o_block = set->add_option("--block", block, "one expert: LAYER:EXPERT[:gate_up|down]");
  o_all->excludes(o_layer)->excludes(o_block);
  o_layer->excludes(o_block);

  auto* apply = app.add_subcommand("apply", "apply a plan file");
  std::string plan_path;
  apply->add_option("plan", plan_path, "PLAN.yaml")->required();

  CLI11_PARSE(app, argc, argv);
  pw::SetLogProcessTag("pw-ctl");
  pw::SetLogLevel(pw::LogLevel::kWarning);
  if (pw::Status st = pw::transport::SetUpServiceTransport(security, "pw-ctl", broker); !st.ok()) {
    return Fail(st);
  }

  std::vector<pw::ctl::PlanEntry> plan;
  int layer = -1, expert = -1, proj = -1;
  if (set->parsed()) {
    if (bits < 3 || bits > 8) return Fail(pw::InvalidArgument("bits " + std::to_string(bits) + " outside 3..8"));
    if (!all && set_layer < 0 && block.empty()) {
      return Fail(pw::InvalidArgument("set-bits needs --all, --layer L or --block L:E"));
    }
    if (set_layer >= 0) layer = set_layer;
    if (!block.empty()) {
      if (pw::Status st = ParseBlock(block, &layer, &expert, &proj); !st.ok()) return Fail(st);
    }
  }
  if (apply->parsed()) {
    auto p = pw::ctl::LoadPlanFile(plan_path);
    if (!p.ok()) return Fail(p.status());
    plan = std::move(p).value();
  }
  auto c = pw::ctl::CtlClient::Connect(broker, timeout_ms);
  if (!c.ok()) return Fail(c.status());
  pw::Result<pw::ctl::CtlResult> r = pw::InvalidArgument("no command");
  if (show->parsed()) r = (*c)->Show(show_blocks, show_layer);
  if (set->parsed()) r = (*c)->SetBits(bits, layer, expert, proj);
  if (apply->parsed()) r = (*c)->Apply(plan);
  if (!r.ok()) return Fail(r.status());
  std::printf("%s", r->text.c_str());
  if (!r->text.empty() && r->text.back() != '\n') std::printf("\n");
  return 0;
}
