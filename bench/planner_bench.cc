// pw-bench-planner: the planner's decision time (policies/planner/planner.h, a pure function)
// at a model's block count: --layers x --experts x 2 projections (Qwen3-Next-80B-A3B: 48 x 512
// = 49152 blocks). Blocks are sized as that model's experts (gate_up [2 x 512, 2048], down
// [2048, 512]: planes of 256 KiB / 128 KiB a bit in 32 KiB pages, plus a LUT page), damage
// halving per bit times a per-block log-normal scale, calibration shares and routing mass
// Zipf-like over each layer's experts. Two decisions are timed: lowering (every block at 6 bits,
// a KV demand 10 % of the pool beyond the free pages) and raising (every block at 4 bits, half
// the pool free). Prints the median and max of --reps runs and the changes each made.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "policies/planner/planner.h"

namespace {

using pw::planner::BlockInput;
using pw::planner::PlannerInputs;

PlannerInputs MakeInputs(int layers, int experts, int bits, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> scale(0.0, 1.0);
  PlannerInputs in;
  in.num_layers = layers;
  in.num_experts = experts;
  in.routing_mass.resize(static_cast<size_t>(layers) * experts);
  for (int l = 0; l < layers; ++l) {
    std::vector<int> order(static_cast<size_t>(experts));
    for (int e = 0; e < experts; ++e) order[static_cast<size_t>(e)] = e;
    std::shuffle(order.begin(), order.end(), rng);
    for (int r = 0; r < experts; ++r) {
      const int e = order[static_cast<size_t>(r)];
      const double zipf = static_cast<double>(experts) / (r + 1) / std::log(experts + 1.0);
      in.routing_mass[static_cast<size_t>(l) * experts + e] = zipf / experts;
      for (pw::ExpertProj proj : {pw::ExpertProj::kGateUp, pw::ExpertProj::kDown}) {
        BlockInput b;
        b.layer = l;
        b.expert = e;
        b.proj = proj;
        b.committed = bits;
        const uint32_t per_bit = proj == pw::ExpertProj::kGateUp ? 8 : 4;
        const double s = scale(rng);
        for (int w = 3; w <= 8; ++w) {
          b.pages[w] = per_bit * w + 1;
          b.damage[w] = s * std::pow(2.0, 8 - w);
        }
        b.damage[0] = s * 1000;
        b.calib_share = std::max(0.05, zipf);
        in.blocks.push_back(b);
      }
    }
  }
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"planner decision time"};
  int layers = 48, experts = 512, reps = 10;
  uint64_t seed = 1;
  app.add_option("--layers", layers, "MoE layers")->check(CLI::Range(1, 256));
  app.add_option("--experts", experts, "experts per layer")->check(CLI::Range(2, 4096));
  app.add_option("--reps", reps, "decisions timed per case")->check(CLI::Range(1, 1000));
  app.add_option("--seed", seed, "seed of the block scales and routing mass");
  CLI11_PARSE(app, argc, argv);

  pw::planner::PlannerParams params;
  params.enabled = true;
  params.min_interval_ms = 0;
  struct Case {
    const char* name;
    int bits;
    double free_share, demand_share;
  };
  for (const Case& c : {Case{"lower", 6, 0.02, 0.12}, Case{"raise", 4, 0.5, 0.0}}) {
    PlannerInputs in = MakeInputs(layers, experts, c.bits, seed);
    int64_t weights = 0;
    for (const BlockInput& b : in.blocks) weights += b.pages[static_cast<size_t>(b.committed)];
    const int64_t total = static_cast<int64_t>(static_cast<double>(weights) / (1 - c.free_share));
    in.pool.page_bytes = 32768;
    in.pool.weights = weights;
    in.pool.free = total - weights;
    in.pool.kv = 0;
    in.kv_demand_pages = static_cast<int64_t>(c.demand_share * static_cast<double>(total));
    std::vector<double> ms;
    size_t changes = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto d = pw::planner::Plan(in, params);
      const auto t1 = std::chrono::steady_clock::now();
      if (!d.ok()) {
        std::fprintf(stderr, "pw-bench-planner: %s\n", d.status().ToString().c_str());
        return 1;
      }
      changes = d->changes.size();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%s: %d layers x %d experts (%zu blocks), %zu changes: median %.1f ms, max %.1f ms\n",
                c.name, layers, experts, in.blocks.size(), changes, ms[ms.size() / 2], ms.back());
  }
  return 0;
}
