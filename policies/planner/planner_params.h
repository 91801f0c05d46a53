// PlannerParams: the knobs of the quality-aware planner (DESIGN.md 5.1).
//
// Watermarks and headroom are fractions of the decode worker's pool (total = free + kv +
// weights pages), turned into pages by rounding up: low_pages = ceil(low_watermark * total).
// "Available" pages are free pages minus the KV demand not yet placed (queued prompts and the
// running requests' growth to max_tokens), so a demand that does not fit makes them negative.
//   available <  low_pages:  lower widths to free  (low_pages - available) + headroom_pages;
//   available >  high_pages: raise widths with at most (available - high_pages) pages, so the
//                            pool stays above the high watermark and no lowering follows;
//   otherwise (hysteresis band): no change.
#pragma once

#include <cstdint>
#include <string>

#include "common/plane_layout.h"
#include "common/status.h"

namespace pw::planner {

struct PlannerParams {
  bool enabled = false;      // the broker runs the planner at all
  bool static_mode = false;  // ablation: widths never change (Plan returns no change)
  // ablation: false = no live routing statistics: every block weighs its calibration share
  // (BlockInput::calib_share) and no expert gets the hot floor
  bool use_routing = true;
  // Where live mass is measured, a block's routing share is live_mass_weight * its live share
  // + (1 - live_mass_weight) * its calibration share. The live mass is an average over the
  // decode worker's last seconds of generated tokens: a small sample of one traffic, which may
  // route unlike the text the model otherwise sees; the calibration share is a prior.
  double live_mass_weight = 1.0;
  // ablation: false = no prompt residuals (every block's PromptResidual is 1; the broker's
  // driver leaves BlockInput::log_residual at 0)
  bool use_prompt_residuals = true;
  double low_watermark = 0.05;       // fraction of the pool
  double high_watermark = 0.20;      // fraction of the pool; >= low_watermark
  double headroom = 0.05;            // fraction of the pool freed beyond the shortfall
  int min_bits = anyprec::kMinBits;  // widths the planner moves blocks between
  int max_bits = anyprec::kMaxBits;
  // Backlog floor on the mean width (0 = none): a lowering step is not taken when it would put
  // the mean committed width below this, the mean over every block weighted by its pages at
  // max_bits (about its number of weights). Unlike min_bits it leaves the greedy free to take
  // the cheap steps to low widths and stops it at a mean instead.
  double min_mean_bits = 0;
  // Ceiling on the same mean width (0 = none): a raise is not taken when it would put the mean
  // above this, and a mean above it (the initial widths, or a ceiling set lower) is lowered to
  // it, least damage per page first, whatever the pool's pressure. Where the damage curve is
  // flat above some width (on the embedded model 6 -> 8 bits doubles an expert's pages for
  // 0.035 % of perplexity), pages spent there between bursts buy little; the ceiling keeps
  // them for KV and holds a damage-ranked map at the ceiling instead of uniform max_bits.
  double max_mean_bits = 0;
  // Hot experts: normalized routing mass r = m_e / mean_e(m) over the layer's experts (1 = an
  // average expert). hot(r) = clamp(r, hot_weight_min, hot_weight_max) weighs step damage;
  // an expert with r >= hot_threshold is never lowered below hot_floor_bits.
  double hot_weight_min = 0.05;
  double hot_weight_max = 8.0;
  double hot_threshold = 2.0;
  int hot_floor_bits = 6;
  // Rate limits: pages moved by one decision (freed when lowering, taken when raising) at most
  // max_bytes_per_decision (0 = no limit), and no decision within min_interval_ms of the last
  // one that changed something.
  uint64_t max_bytes_per_decision = 0;
  int64_t min_interval_ms = 500;
  int64_t interval_ms = 200;  // how often the broker runs the planner

  // InvalidArgument naming the field when a value is out of range.
  Status Validate() const;
};

}  // namespace pw::planner
