// Trace replay (pw-sim's core): runs a miss policy over a router-logit trace under a residency
// budget and reports what happened and the modelled time per token.
//
// Replay order is file order: layer records as the engine ran them, tokens in order inside a
// record: the policy sees what the engine's routing hook would have seen (per-layer caches
// make the order of layers irrelevant; expert_cache.h). The substitute's score is what the
// engine's miss hook ranks by, from the trace's fp16 logits: their softmax for a softmax gate;
// for a sigmoid gate (version 2) the sigmoid plus the layer's selection bias, over every group
// as in the engine (the engine scores in fp32: a near tie can
// break differently, so a replay matches an engine run closely, not bit for bit); the
// selection and its gate weights are the router's own, stored in fp32.
//
// Cost model (per token; every figure an input, defaults in CostModel measured on this
// machine):
//   compute  = base_us + (computed experts per token) * expert_us
//   fetch    = fetch_latency_us + expert_bytes / (fetch_gbps * 1e3)   [us per expert block set]
//   sync     = (synchronous fetches per token) * fetch
//   async    = (admissions per token) * fetch       (background: overlaps compute)
//   time     = compute + sync + max(0, async - compute)
// expert_bytes = 0 means bf16 from the trace header: 3 * H * I * 2 bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "policies/misses/miss_config.h"
#include "policies/misses/miss_policy.h"
#include "policies/misses/miss_settings.h"
#include "policies/misses/router_trace.h"

namespace pw::misses {

// Defaults: tiny-moe batch-1 decode on this machine, 136.5 us per token of which 42 % inside
// the expert matmuls (pw-bench-engine), so 16 expert computations of 3.6 us and 79 us of the
// rest; a fetch as a UCX get over shared memory, 24.7 us + bytes / 2.9 GB/s (the line through
// pw-bench-ucx's 32 KiB and 256 KiB get rows). docs/benchmarks.md, "Expert misses".
struct CostModel {
  double base_us = 79.0;          // per token: attention, router, norms, lm_head
  double expert_us = 3.6;         // per computed expert per token per layer
  double fetch_latency_us = 24.7;  // per synchronous fetch
  double fetch_gbps = 2.9;        // fetch bandwidth, GB/s = 1e9 bytes/s
  double expert_bytes = 0;        // bytes of one expert's blocks; 0: bf16 from the header
};

// A residency budget: a fraction of each layer's experts, or bytes for all MoE layers.
struct Budget {
  double fraction = 0;  // in (0, 1]; used when bytes == 0
  uint64_t bytes = 0;
};

// The budget `s` names (fraction and bytes 0 when it names none).
Budget ToBudget(const MissSettings& s);

// Resident experts per layer for `budget`: round(fraction * E), or bytes / (layers * expert
// bytes) rounded down; kInvalidArgument when that is outside [k, E].
Result<int> CapacityFor(const Budget& budget, int num_moe_layers, int num_experts, int top_k,
                        double expert_bytes);

// The trace prepared for replays: probabilities in fp32, the MoE layers present.
struct ReplayInput {
  TraceHeader header;
  std::vector<const TraceLayer*> records;
  std::vector<float> probs;            // concatenated [T, E] per record: the ranking scores
  std::vector<size_t> probs_offset;    // per record
  int num_moe_layers = 0;
  uint64_t token_layers = 0;
  double expert_bytes = 0;             // bf16 bytes of one expert (3 * H * I * 2)

  static ReplayInput From(const RouterTrace& trace);
  uint64_t tokens() const { return num_moe_layers ? token_layers / static_cast<uint64_t>(num_moe_layers) : 0; }
};

struct SimResult {
  std::string policy;      // DescribeMissConfig
  int capacity = 0;        // resident experts per layer
  double residency = 0;    // capacity / E
  uint64_t tokens = 0;
  MissStats stats;
  double fetched_bytes = 0, admitted_bytes = 0;
  double fetches_per_token = 0, admissions_per_token = 0;
  double substitution_rate = 0;  // substitutions / slots
  double mass_mean = 0;          // mean over (token, layer) of m
  double us_per_token = 0;       // modelled
  double us_per_token_all_resident = 0;
  double replay_seconds = 0;     // wall time of the replay itself
};

// Replays `in` under `config` with `capacity` resident experts per layer (cold start).
Result<SimResult> Replay(const ReplayInput& in, const MissConfig& config, int capacity,
                         const CostModel& cost);

// Modelled time per token from a run's statistics (formula above).
double ModelledUsPerToken(const MissStats& s, uint64_t tokens, double expert_bytes, const CostModel& cost);

// CSV (header line + one line per result) and JSON (an array of objects) of sweep results.
std::string SimResultsCsv(const std::vector<SimResult>& rows);
std::string SimResultsJson(const std::vector<SimResult>& rows);
// An SVG scatter plot: modelled time per token against substituted mass, one point per row,
// labelled with its policy and residency.
std::string SimResultsSvg(const std::vector<SimResult>& rows, const std::string& title);

}  // namespace pw::misses

namespace pw::misses {

// One replay per (capacity, config), capacities outer: the rows of a sweep.
Result<std::vector<SimResult>> Sweep(const ReplayInput& in, const std::vector<MissConfig>& configs,
                                     const std::vector<int>& capacities, const CostModel& cost);

}  // namespace pw::misses
