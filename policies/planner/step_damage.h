// StepDamage: the expected damage of moving one expert block between two widths.
//
//   damage(i: b -> b') = (D_i[b'] - D_i[b]) * hot(r_e) * PromptResidual(i)
// with PromptResidual(i) = exp(log_residual_i), the running batch's prompt residual
// for a lowering b' < b (for a raise b -> b', the damage avoided is the same expression with
// the widths swapped). hot(r) = clamp(r, hot_weight_min, hot_weight_max) where r is the
// expert's routing mass over the mean of its layer (planner_params.h); with use_routing off,
// or without routing statistics, hot = 1.
#pragma once

#include <vector>

#include "policies/planner/planner_inputs.h"
#include "policies/planner/planner_params.h"

namespace pw::planner {

// r_e for every (layer, expert) (index layer * num_experts + expert): mass over the mean
// mass of its layer; 1 everywhere when `mass` is empty, use_routing is off, or a layer has no
// mass at all.
std::vector<double> NormalizedMass(const std::vector<double>& mass, int num_layers, int num_experts,
                                   bool use_routing);

double HotWeight(double normalized_mass, const PlannerParams& params);

// The factor exp(residual_i(prompt features)) of the running batch's prompts:
// exp(block.log_residual), clamped to [exp(-kMaxLogResidual), exp(kMaxLogResidual)]; 1.0 when
// the residual is 0 (no heads, no features, or the ablation) or not finite.
inline constexpr double kMaxLogResidual = 8.0;
double PromptResidual(const BlockInput& block);

// Damage added by lowering `block` from `from` to `to` bits (to < from), weighted.
double StepDamage(const BlockInput& block, int from, int to, double hot);

}  // namespace pw::planner
