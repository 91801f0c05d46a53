#include "policies/planner/step_damage.h"

#include <algorithm>
#include <cmath>

namespace pw::planner {

std::vector<double> NormalizedMass(const std::vector<double>& mass, int num_layers, int num_experts,
                                   bool use_routing) {
  const size_t n = static_cast<size_t>(num_layers) * static_cast<size_t>(num_experts);
  std::vector<double> r(n, 1.0);
  if (!use_routing || mass.size() != n || num_experts <= 0) return r;
  for (int l = 0; l < num_layers; ++l) {
    const size_t base = static_cast<size_t>(l) * num_experts;
    double sum = 0;
    for (int e = 0; e < num_experts; ++e) sum += mass[base + e];
    if (sum <= 0) continue;
    const double mean = sum / num_experts;
    for (int e = 0; e < num_experts; ++e) r[base + e] = mass[base + e] / mean;
  }
  return r;
}

BlockShares RoutingShares(const PlannerInputs& in, bool use_routing, double live_weight) {
  const std::vector<double> mass = NormalizedMass(in.routing_mass, in.num_layers, in.num_experts, use_routing);
  // A layer with live mass: NormalizedMass is 1 everywhere only where it had none (or was off).
  std::vector<bool> layer_live(static_cast<size_t>(std::max(in.num_layers, 0)), false);
  if (use_routing && in.routing_mass.size() == mass.size()) {
    for (int l = 0; l < in.num_layers; ++l) {
      for (int e = 0; e < in.num_experts; ++e) {
        if (in.routing_mass[static_cast<size_t>(l) * in.num_experts + e] > 0) layer_live[l] = true;
      }
    }
  }
  BlockShares s;
  s.r.resize(in.blocks.size());
  s.live.resize(in.blocks.size());
  for (size_t i = 0; i < in.blocks.size(); ++i) {
    const BlockInput& b = in.blocks[i];
    s.live[i] = layer_live[static_cast<size_t>(b.layer)];
    s.r[i] = s.live[i] ? live_weight * mass[static_cast<size_t>(b.layer) * in.num_experts + b.expert] +
                             (1.0 - live_weight) * b.calib_share
                       : b.calib_share;
  }
  return s;
}

double HotWeight(double share, const PlannerParams& params) {
  return std::clamp(share, params.hot_weight_min, params.hot_weight_max);
}

double PromptResidual(const BlockInput& block) {
  if (block.log_residual == 0 || !std::isfinite(block.log_residual)) return 1.0;
  return std::exp(std::clamp(block.log_residual, -kMaxLogResidual, kMaxLogResidual));
}

double StepDamage(const BlockInput& block, int from, int to, double hot) {
  const double d = block.damage[to] - block.damage[from];
  return std::max(0.0, d) * hot * PromptResidual(block);
}

}  // namespace pw::planner
