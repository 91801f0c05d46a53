#include "policies/planner/planner_params.h"

#include <cmath>

namespace pw::planner {

namespace {
bool Fraction(double v) { return std::isfinite(v) && v >= 0 && v <= 1; }
}  // namespace

Status PlannerParams::Validate() const {
  if (!Fraction(low_watermark)) return InvalidArgument("planner low_watermark must be in [0, 1]");
  if (!Fraction(high_watermark)) return InvalidArgument("planner high_watermark must be in [0, 1]");
  if (high_watermark < low_watermark) {
    return InvalidArgument("planner high_watermark (" + std::to_string(high_watermark) +
                           ") is below low_watermark (" + std::to_string(low_watermark) + ")");
  }
  if (!Fraction(live_mass_weight)) return InvalidArgument("planner live_mass_weight must be in [0, 1]");
  if (!Fraction(headroom)) return InvalidArgument("planner headroom must be in [0, 1]");
  if (min_bits < anyprec::kMinBits || max_bits > anyprec::kMaxBits || min_bits > max_bits) {
    return InvalidArgument("planner widths must satisfy " + std::to_string(anyprec::kMinBits) +
                           " <= min_bits <= max_bits <= " + std::to_string(anyprec::kMaxBits) +
                           " (got " + std::to_string(min_bits) + ".." + std::to_string(max_bits) +
                           ")");
  }
  if (!std::isfinite(min_mean_bits) || min_mean_bits < 0 || min_mean_bits > max_bits) {
    return InvalidArgument("planner min_mean_bits must be in [0, max_bits]");
  }
  if (!std::isfinite(max_mean_bits) || max_mean_bits < 0 || max_mean_bits > max_bits) {
    return InvalidArgument("planner max_mean_bits must be in [0, max_bits]");
  }
  if (max_mean_bits > 0 && max_mean_bits < min_mean_bits) {
    return InvalidArgument("planner max_mean_bits (" + std::to_string(max_mean_bits) +
                           ") is below min_mean_bits (" + std::to_string(min_mean_bits) + ")");
  }
  if (!std::isfinite(hot_weight_min) || !std::isfinite(hot_weight_max) || hot_weight_min <= 0 ||
      hot_weight_max < hot_weight_min) {
    return InvalidArgument("planner hot weights must satisfy 0 < hot_weight_min <= hot_weight_max");
  }
  if (!std::isfinite(hot_threshold) || hot_threshold <= 0) {
    return InvalidArgument("planner hot_threshold must be > 0");
  }
  if (hot_floor_bits < 0 || hot_floor_bits > anyprec::kMaxBits) {
    return InvalidArgument("planner hot_floor_bits must be in [0, " +
                           std::to_string(anyprec::kMaxBits) + "]");
  }
  if (min_interval_ms < 0) return InvalidArgument("planner min_interval_ms must be >= 0");
  if (interval_ms <= 0) return InvalidArgument("planner interval_ms must be > 0");
  return Status::Ok();
}

}  // namespace pw::planner
