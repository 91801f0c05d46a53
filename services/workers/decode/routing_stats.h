// RoutingStats: the decode worker's per-(layer, expert) routing mass, an exponential moving
// average of the gate weight the router gives each expert, for the broker's planner
// (DESIGN.md 5.1, "hot(mass_e)").
//
// It is the engine's RouterLogitsRecorder (engine/experts/moe.h, seam (d)): every MoE layer of
// every pure-decode batch reports the router's own top-k (before any routing hook), and the
// layer's row is updated with the batch's share of gate weight per expert:
//   share_e = sum_t w_te / sum_t sum_e' w_te'     (sums to 1 over the layer's experts)
//   mass_e  = share_e                              first batch seen at this layer
//   mass_e  = (1 - alpha) * mass_e + alpha * share_e   afterwards
// Batches with prompt work (a preempted sequence's recompute) are skipped: the planner weighs
// what decode steps read. A layer never seen stays all zero (the planner then treats it as
// uniform). Called from the engine's driving thread; read from the same thread.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/experts/moe.h"

namespace pw::workers {

class RoutingStats final : public engine::RouterLogitsRecorder {
 public:
  // alpha in (0, 1]: weight of the newest batch.
  RoutingStats(int num_layers, int num_experts, double alpha = 0.05);

  void Record(const engine::RoutingContext& ctx, const std::vector<engine::ExpertAssignment>& selected) override;

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  // [num_layers * num_experts], index layer * num_experts + expert.
  const std::vector<float>& mass() const { return mass_; }
  // Batches folded in at `layer`.
  uint64_t batches(int layer) const { return batches_[static_cast<size_t>(layer)]; }

 private:
  int num_layers_, num_experts_;
  double alpha_;
  std::vector<float> mass_;
  std::vector<uint64_t> batches_;
  std::vector<double> share_;  // scratch, one layer
};

}  // namespace pw::workers
