// Plan: the quality-aware planner as a pure function, PlannerInputs -> PlannerDecision
// (DESIGN.md 5.1). No clock, no I/O: the broker feeds it Telemetry and the store's damage
// table and sends the changes as a plan.
//
// Lowering (available < low watermark): target = shortfall + headroom pages; repeatedly take
// the lowering step with the least damage per page freed (StepDamage / (pages[b] - pages[b'])),
// b' the next lower width that frees a page, never below the block's floor (the block's own,
// min_bits, and hot_floor_bits for hot experts), until the pages freed reach the target. A
// step that would exceed the rate limit, or put the mean width below min_mean_bits, is skipped.
// If every step is taken and the target is not met, the decision says so (target_met = false).
// A mean width above max_mean_bits is lowered the same way, to that mean, at any pressure.
// Raising (available > high watermark): with at most (available - high_pages) pages, take the
// raise with the most damage avoided per page added, up to max_bits and never above a mean of
// max_mean_bits, hottest expert first on ties.
// Between the watermarks, in static mode, or within min_interval_ms of the last change: none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "policies/planner/planner_inputs.h"
#include "policies/planner/planner_params.h"

namespace pw::planner {

struct WidthChange {
  size_t block = 0;  // position in PlannerInputs::blocks
  int layer = 0, expert = 0;
  ExpertProj proj = ExpertProj::kGateUp;
  int from = 0, to = 0;
};

enum class PlanAction { kNone, kLower, kRaise };
const char* PlanActionName(PlanAction a);

struct PlannerDecision {
  PlanAction action = PlanAction::kNone;
  std::vector<WidthChange> changes;  // at most one per block
  int64_t available_pages = 0;       // free - kv_demand
  int64_t low_pages = 0, high_pages = 0;
  int64_t target_pages = 0;  // lowering: pages to free; raising: pages it may take
  int64_t pages_moved = 0;   // lowering: pages freed; raising: pages added
  double damage = 0;         // lowering: weighted damage added; raising: damage avoided
  bool target_met = true;    // lowering only: pages_moved >= target_pages
  std::string reason;        // why this action (or none), for logs and pw-ctl show
};

// InvalidArgument (naming the block or field) on bad inputs or params; nothing else fails.
Result<PlannerDecision> Plan(const PlannerInputs& in, const PlannerParams& params);

}  // namespace pw::planner
