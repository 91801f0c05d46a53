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

double HotWeight(double normalized_mass, const PlannerParams& params) {
  if (!params.use_routing) return 1.0;
  return std::clamp(normalized_mass, params.hot_weight_min, params.hot_weight_max);
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
