// pw-sim: replays a router-logit trace (docs/formats.md) against expert-miss policies and
// residency budgets (policies/misses/trace_replay.h) and reports hits, misses, fetches,
// fetched bytes, substitutions, substituted mass and modelled time per token.
//   pw-sim --trace FILE [--miss-policy P (--miss-* overrides)] (--residency F | --residency-bytes N)
//          [--miss-config FILE]   the same settings as YAML (policies/misses/miss_options.h)
//          [--base-us U --expert-us U --fetch-latency-us U --fetch-gbps G --expert-bytes B]
//   pw-sim --trace FILE --sweep [--policies P1,P2..] [--evictions E1,E2..] [--residencies F1,F2..]
//          [--csv FILE] [--json FILE] [--svg FILE]
//   pw-sim --trace FILE --gate-ranks [--miss-threshold X]   each rank's mean gate weight and
//          the share of its choices at or above the threshold rule's X (default 0.15)
//   pw-sim --synthesize FILE [--layers 16 --experts 64 --top-k 8 --hidden 2048 --ffn 1024
//          --steps N --tokens-per-step T --seed S]   writes a synthetic trace (synthetic_trace.h)
// One run prints "key value" lines; a sweep prints its CSV (and writes the files asked for).
// A trace cut short (its writer killed, or stopped by a full disk: no end record, perhaps a torn
// last record) is replayed over its whole records: stderr says so ("warning: ... cut short"),
// and a single run's lines end with trace_complete 0, trace_layer_records N and
// trace_torn_bytes B (1, N, 0 for a whole trace).
// Exit status: 0 after a replay, whole trace or cut short; 1 on an error (a trace that cannot
// be read or is corrupt anywhere but its cut end, a bad policy or budget, a file not written);
// CLI11's own codes for a malformed command line.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/formats/options.h"
#include "policies/misses/gate_ranks.h"
#include "policies/misses/miss_options.h"
#include "policies/misses/synthetic_trace.h"
#include "policies/misses/trace_replay.h"

namespace {

int Fail(const pw::Status& s) {
  std::fprintf(stderr, "pw-sim: %s\n", s.ToString().c_str());
  return 1;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

pw::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) return pw::IoError("cannot write " + path);
  return pw::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pw-sim: replay a router-logit trace against expert-miss policies"};
  std::string trace_path;
  app.add_option("--trace", trace_path, "router-logit trace (pw-eval/pw-generate --record-trace)");
  std::string synth;
  pw::misses::TraceHeader sh;
  sh.num_layers = 16;
  sh.num_experts = 64;
  sh.top_k = 8;
  sh.hidden_size = 2048;
  sh.moe_intermediate_size = 1024;
  int steps = 10000, tokens_per_step = 1;
  uint32_t seed = 1;
  app.add_option("--synthesize", synth, "write a synthetic trace to FILE and exit");
  app.add_option("--layers", sh.num_layers, "synthetic: layers")->check(CLI::Range(1, 1024));
  app.add_option("--experts", sh.num_experts, "synthetic: experts")->check(CLI::Range(1, 65535));
  app.add_option("--top-k", sh.top_k, "synthetic: top-k")->check(CLI::Range(1, 65535));
  app.add_option("--hidden", sh.hidden_size, "synthetic: hidden size");
  app.add_option("--ffn", sh.moe_intermediate_size, "synthetic: expert FFN size");
  app.add_option("--steps", steps, "synthetic: forward passes")->check(CLI::Range(0, 1 << 24));
  app.add_option("--tokens-per-step", tokens_per_step, "synthetic: tokens per pass")->check(CLI::Range(1, 1 << 16));
  app.add_option("--seed", seed, "synthetic: seed");
  pw::misses::MissToolOptions miss;
  pw::options::OptionSet miss_options;
  pw::misses::DeclareMissToolOptions(&miss_options, &miss);
  miss_options.AddToCli(&app);
  pw::misses::CostModel cost;
  app.add_option("--base-us", cost.base_us, "modelled us per token outside routed experts");
  app.add_option("--expert-us", cost.expert_us, "modelled us per computed expert per token");
  app.add_option("--fetch-latency-us", cost.fetch_latency_us, "modelled latency of one fetch, us");
  app.add_option("--fetch-gbps", cost.fetch_gbps, "modelled fetch bandwidth, GB/s")->check(CLI::PositiveNumber);
  app.add_option("--expert-bytes", cost.expert_bytes, "bytes of one expert (0: bf16 from the trace)");
  bool sweep = false;
  bool gate_ranks = false;
  std::string policies = "fetch-every-miss,rule-0.15,first-choice,weight-blind,quality-first,speed-first";
  std::string evictions, residencies = "0.25,0.5", csv, json, svg;
  app.add_flag("--sweep", sweep, "one replay per (residency, policy, eviction)");
  app.add_flag("--gate-ranks", gate_ranks,
               "print each rank's mean gate weight and the share reaching the miss threshold, "
               "then exit");
  app.add_option("--policies", policies, "sweep: presets");
  app.add_option("--evictions", evictions, "sweep: eviction rules crossed with the presets (default: each preset's)");
  app.add_option("--residencies", residencies, "sweep: residency fractions");
  app.add_option("--csv", csv, "sweep: write CSV here");
  app.add_option("--json", json, "sweep: write JSON here");
  app.add_option("--svg", svg, "sweep: write an SVG plot (time per token vs substituted mass) here");
  CLI11_PARSE(app, argc, argv);
  if (auto s = pw::misses::LoadMissToolOptions(&miss_options, &miss); !s.ok()) return Fail(s);
  if (!synth.empty()) {
    if (auto s = pw::misses::WriteSyntheticTrace(synth, sh, steps, tokens_per_step, seed); !s.ok()) return Fail(s);
    return 0;
  }
  if (trace_path.empty()) return Fail(pw::InvalidArgument("--trace FILE is required"));

  const auto t0 = std::chrono::steady_clock::now();
  auto trace = pw::misses::RouterTrace::Read(trace_path);
  if (!trace.ok()) return Fail(trace.status());
  if (!trace->tail.complete) {
    std::fprintf(stderr, "pw-sim: warning: %s; replaying the whole records\n",
                 trace->tail.message.c_str());
  }
  if (gate_ranks) {
    auto cfg = pw::misses::ToMissConfig(miss.settings);
    if (!cfg.ok()) return Fail(cfg.status());
    const pw::misses::GateRanks g = pw::misses::GateWeightsByRank(*trace, cfg->threshold);
    std::printf("selections %llu\nthreshold %.4f\n", static_cast<unsigned long long>(g.selections),
                cfg->threshold);
    for (size_t r = 0; r < g.mean.size(); ++r) {
      std::printf("rank %zu mean_weight %.4f share_at_least_threshold %.4f\n", r + 1, g.mean[r],
                  g.share_at_least[r]);
    }
    return 0;
  }
  const pw::misses::ReplayInput in = pw::misses::ReplayInput::From(*trace);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& h = in.header;
  std::fprintf(stderr, "pw-sim: %s: %zu layer records, %llu tokens x %d MoE layers, %u experts top-%u (%.2f s to load)\n",
               trace_path.c_str(), in.records.size(), static_cast<unsigned long long>(in.tokens()),
               in.num_moe_layers, h.num_experts, h.top_k, load_s);
  const double bytes = cost.expert_bytes > 0 ? cost.expert_bytes : in.expert_bytes;

  if (!sweep) {
    auto cfg = pw::misses::ToMissConfig(miss.settings);
    if (!cfg.ok()) return Fail(cfg.status());
    auto cap = pw::misses::CapacityFor(pw::misses::ToBudget(miss.settings), in.num_moe_layers,
                                       static_cast<int>(h.num_experts), static_cast<int>(h.top_k), bytes);
    if (!cap.ok()) return Fail(cap.status());
    auto r = pw::misses::Replay(in, *cfg, *cap, cost);
    if (!r.ok()) return Fail(r.status());
    const std::string csv_text = pw::misses::SimResultsCsv({*r});
    // "key value" lines from the CSV's header and row.
    const size_t nl = csv_text.find('\n');
    const std::vector<std::string> keys = Split(csv_text.substr(0, nl));
    const std::string row = csv_text.substr(nl + 1, csv_text.size() - nl - 2);
    std::vector<std::string> vals;
    std::stringstream ss(row);
    std::string item;
    while (std::getline(ss, item, ',')) vals.push_back(item);
    for (size_t i = 0; i < keys.size() && i < vals.size(); ++i) std::printf("%s %s\n", keys[i].c_str(), vals[i].c_str());
    std::printf("replay_tokens_per_second %.0f\n", r->replay_seconds > 0 ? r->tokens / r->replay_seconds : 0.0);
    std::printf("trace_complete %d\ntrace_layer_records %zu\ntrace_torn_bytes %llu\n",
                trace->tail.complete ? 1 : 0, trace->layers.size(),
                static_cast<unsigned long long>(trace->tail.torn_bytes));
    return 0;
  }

  std::vector<pw::misses::MissConfig> configs;
  const std::vector<std::string> evs = Split(evictions);
  for (const std::string& p : Split(policies)) {
    pw::misses::MissSettings f = miss.settings;
    f.policy = p;
    if (evs.empty()) {
      auto c = pw::misses::ToMissConfig(f);
      if (!c.ok()) return Fail(c.status());
      configs.push_back(*c);
    }
    for (const std::string& e : evs) {
      f.eviction = e;
      auto c = pw::misses::ToMissConfig(f);
      if (!c.ok()) return Fail(c.status());
      configs.push_back(*c);
    }
  }
  std::vector<int> caps;
  for (const std::string& r : Split(residencies)) {
    pw::misses::Budget b;
    b.fraction = std::atof(r.c_str());
    auto cap = pw::misses::CapacityFor(b, in.num_moe_layers, static_cast<int>(h.num_experts),
                                       static_cast<int>(h.top_k), bytes);
    if (!cap.ok()) return Fail(cap.status().WithContext("--residencies " + r));
    caps.push_back(*cap);
  }
  auto rows = pw::misses::Sweep(in, configs, caps, cost);
  if (!rows.ok()) return Fail(rows.status());
  const std::string csv_text = pw::misses::SimResultsCsv(*rows);
  std::fputs(csv_text.c_str(), stdout);
  if (!csv.empty()) {
    if (auto s = WriteFile(csv, csv_text); !s.ok()) return Fail(s);
  }
  if (!json.empty()) {
    if (auto s = WriteFile(json, pw::misses::SimResultsJson(*rows)); !s.ok()) return Fail(s);
  }
  if (!svg.empty()) {
    if (auto s = WriteFile(svg, pw::misses::SimResultsSvg(*rows, "pw-sim: " + trace_path)); !s.ok()) return Fail(s);
  }
  return 0;
}
