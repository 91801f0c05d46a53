// StepDamage: the expected damage of moving one expert block between two widths.
//
//   damage(i: b -> b') = (D_i[b'] - D_i[b]) * hot(r_i) * PromptResidual(i)
// with PromptResidual(i) = exp(log_residual_i), the running batch's prompt residual
// for a lowering b' < b (for a raise b -> b', the damage avoided is the same expression with
// the widths swapped). hot(r) = clamp(r, hot_weight_min, hot_weight_max) where r_i is how
// often the block's expert is routed against the average expert of its layer: its live
// routing mass over the layer's mean (planner_params.h) when the worker measured mass for the
// layer (blended with the calibration share by live_mass_weight), else (no statistics yet, or
// use_routing off) the store's calibration share (BlockInput::calib_share). D_i is a damage
// per routed token, so r_i is what turns it into the damage the traffic sees.
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

// r_i of every block (index as in.blocks) and whether it is the live mass (true) or the
// calibration share (false), as above. Where live, r_i = live_weight * live r_i +
// (1 - live_weight) * calibration share (PlannerParams::live_mass_weight).
struct BlockShares {
  std::vector<double> r;
  std::vector<bool> live;
};
BlockShares RoutingShares(const PlannerInputs& in, bool use_routing, double live_weight = 1.0);

double HotWeight(double share, const PlannerParams& params);

// The factor exp(residual_i(prompt features)) of the running batch's prompts:
// exp(block.log_residual), clamped to [exp(-kMaxLogResidual), exp(kMaxLogResidual)]; 1.0 when
// the residual is 0 (no heads, no features, or the ablation) or not finite.
inline constexpr double kMaxLogResidual = 8.0;
double PromptResidual(const BlockInput& block);

// Damage added by lowering `block` from `from` to `to` bits (to < from), weighted.
double StepDamage(const BlockInput& block, int from, int to, double hot);

}  // namespace pw::planner
