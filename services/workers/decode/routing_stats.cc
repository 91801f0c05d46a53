#include "services/workers/decode/routing_stats.h"

#include <algorithm>
#include <cmath>

namespace pw::workers {

RoutingStats::RoutingStats(int num_layers, int num_experts, double alpha)
    : num_layers_(std::max(0, num_layers)),
      num_experts_(std::max(0, num_experts)),
      alpha_(std::clamp(alpha, 1e-6, 1.0)),
      mass_(static_cast<size_t>(num_layers_) * static_cast<size_t>(num_experts_), 0.f),
      batches_(static_cast<size_t>(num_layers_), 0),
      share_(static_cast<size_t>(num_experts_), 0.0) {}

void RoutingStats::Record(const engine::RoutingContext& ctx,
                          const std::vector<engine::ExpertAssignment>& selected) {
  if (!ctx.pure_decode || ctx.layer < 0 || ctx.layer >= num_layers_ || ctx.num_experts != num_experts_) return;
  std::fill(share_.begin(), share_.end(), 0.0);
  double total = 0.0;
  for (const auto& a : selected) {
    if (a.expert < 0 || a.expert >= num_experts_ || !std::isfinite(a.weight) || a.weight <= 0.f) continue;
    share_[static_cast<size_t>(a.expert)] += a.weight;
    total += a.weight;
  }
  if (total <= 0.0) return;
  const size_t base = static_cast<size_t>(ctx.layer) * static_cast<size_t>(num_experts_);
  uint64_t& n = batches_[static_cast<size_t>(ctx.layer)];
  const double a = n == 0 ? 1.0 : alpha_;
  for (int e = 0; e < num_experts_; ++e) {
    float& m = mass_[base + static_cast<size_t>(e)];
    m = static_cast<float>((1.0 - a) * m + a * (share_[static_cast<size_t>(e)] / total));
  }
  ++n;
}

}  // namespace pw::workers
