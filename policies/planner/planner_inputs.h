// PlannerInputs: what the planner decides from (DESIGN.md 5.1), all of it plain data so the
// planner is a pure function of it.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "common/expert_block.h"
#include "common/plane_layout.h"

namespace pw::planner {

// One expert block i.
struct BlockInput {
  int layer = 0, expert = 0;
  ExpertProj proj = ExpertProj::kGateUp;
  int committed = 0;  // q_i, bits (min_bits..max_bits; the planner leaves other widths alone)
  int floor = 0;      // lowest width allowed for this block (0 = only the params' min_bits)
  // pages[b]: pages the block holds resident at width b (planes 0..b-1 and LUT_b), b = 0..8;
  // must not decrease with b.
  std::array<uint32_t, anyprec::kMaxBits + 1> pages{};
  // damage[b]: the store's D_i[b] (sensitivity-weighted squared error at width b, per routed
  // calibration token or total: one scale for every block); must not increase with b.
  std::array<double, anyprec::kMaxBits + 1> damage{};
  // residual_i(prompt features): the prompt residual head's output for this block's layer and
  // projection (common/formats/residual_heads.h), a log factor on its step damage; 0 = none (no heads,
  // no prompt features, or the "no prompt residuals" ablation). Must be finite.
  double log_residual = 0;
  // The block's routing share in the store's calibration (apw::CalibrationShares: 1 = an
  // average expert of its layer). damage[] is per routed token, so a step's damage is weighed
  // by how often the expert is routed: by the live routing mass when the worker measured one
  // for the layer (and routing statistics are on), else by this share. Must be finite, > 0.
  double calib_share = 1;
};

// Pool pages of the decode worker planned for (Telemetry).
struct PoolState {
  uint64_t page_bytes = 0;
  int64_t free = 0, kv = 0, weights = 0;
  int64_t total() const { return free + kv + weights; }
};

struct PlannerInputs {
  int num_layers = 0, num_experts = 0;
  std::vector<BlockInput> blocks;
  PoolState pool;
  // KV pages still needed and not yet held: waiting requests' prompts plus running requests'
  // growth to their max_tokens.
  int64_t kv_demand_pages = 0;
  // Per (layer, expert), index layer * num_experts + expert: EMA of the gate weight routed to
  // the expert. Empty = unknown (every expert average).
  std::vector<double> routing_mass;
  int64_t now_ms = 0;
  int64_t last_change_ms = -1;  // when the last decision that changed something was made; -1 none
};

}  // namespace pw::planner
