#include "policies/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

#include "policies/planner/step_damage.h"

namespace pw::planner {

const char* PlanActionName(PlanAction a) {
  switch (a) {
    case PlanAction::kNone:
      return "none";
    case PlanAction::kLower:
      return "lower";
    case PlanAction::kRaise:
      return "raise";
  }
  return "?";
}

namespace {

int64_t CeilPages(double fraction, int64_t total) {
  return static_cast<int64_t>(std::ceil(fraction * static_cast<double>(total)));
}

std::string BlockName(const BlockInput& b) {
  return "block (layer " + std::to_string(b.layer) + ", expert " + std::to_string(b.expert) +
         (b.proj == ExpertProj::kGateUp ? ", gate_up)" : ", down)");
}

Status CheckInputs(const PlannerInputs& in) {
  if (in.num_layers <= 0 || in.num_experts <= 0) {
    return InvalidArgument("planner inputs need num_layers and num_experts > 0");
  }
  const size_t experts = static_cast<size_t>(in.num_layers) * in.num_experts;
  if (!in.routing_mass.empty() && in.routing_mass.size() != experts) {
    return InvalidArgument("planner routing_mass has " + std::to_string(in.routing_mass.size()) +
                           " entries; expected " + std::to_string(experts) +
                           " (layers x experts) or none");
  }
  for (size_t k = 0; k < in.routing_mass.size(); ++k) {
    if (!std::isfinite(in.routing_mass[k]) || in.routing_mass[k] < 0) {
      return InvalidArgument("planner routing_mass[" + std::to_string(k) +
                             "] must be finite and >= 0");
    }
  }
  if (in.pool.free < 0 || in.pool.kv < 0 || in.pool.weights < 0 || in.kv_demand_pages < 0) {
    return InvalidArgument("planner pool pages and kv_demand_pages must be >= 0");
  }
  std::vector<bool> seen(experts * kProjsPerExpert, false);
  for (const BlockInput& b : in.blocks) {
    if (b.layer < 0 || b.layer >= in.num_layers || b.expert < 0 || b.expert >= in.num_experts ||
        (b.proj != ExpertProj::kGateUp && b.proj != ExpertProj::kDown)) {
      return InvalidArgument("planner " + BlockName(b) + " is outside the model");
    }
    const size_t idx = ExpertBlockIndex(b.layer, b.expert, b.proj, in.num_experts);
    if (seen[idx]) return InvalidArgument("planner " + BlockName(b) + " is listed twice");
    seen[idx] = true;
    if (!std::isfinite(b.calib_share) || b.calib_share <= 0) {
      return InvalidArgument("planner " + BlockName(b) + ": calib_share must be finite and > 0");
    }
    if (b.committed < 0 || b.committed > anyprec::kMaxBits || b.floor < 0 ||
        b.floor > anyprec::kMaxBits) {
      return InvalidArgument("planner " + BlockName(b) + ": committed and floor must be 0.." +
                             std::to_string(anyprec::kMaxBits));
    }
    for (int w = 0; w <= anyprec::kMaxBits; ++w) {
      if (!std::isfinite(b.damage[w]) || b.damage[w] < 0) {
        return InvalidArgument("planner " + BlockName(b) + ": damage[" + std::to_string(w) +
                               "] must be finite and >= 0");
      }
      if (w > 0 && b.pages[w] < b.pages[w - 1]) {
        return InvalidArgument("planner " + BlockName(b) + ": pages[" + std::to_string(w) +
                               "] is below pages[" + std::to_string(w - 1) + "]");
      }
    }
  }
  return Status::Ok();
}

struct Step {
  double per_page;  // lowering: damage per page freed (smaller first); raising: avoided per page
  double mass;      // normalized routing mass (tie-break)
  size_t block;
  int to;
};

}  // namespace

Result<PlannerDecision> Plan(const PlannerInputs& in, const PlannerParams& params) {
  PW_RETURN_IF_ERROR(params.Validate());
  PW_RETURN_IF_ERROR(CheckInputs(in));
  if (params.max_bytes_per_decision > 0 && in.pool.page_bytes == 0) {
    return InvalidArgument("planner max_bytes_per_decision needs the pool's page_bytes");
  }

  PlannerDecision out;
  const int64_t total = in.pool.total();
  out.available_pages = in.pool.free - in.kv_demand_pages;
  out.low_pages = CeilPages(params.low_watermark, total);
  out.high_pages = CeilPages(params.high_watermark, total);
  const int64_t headroom = CeilPages(params.headroom, total);
  const int64_t max_pages =
      params.max_bytes_per_decision > 0
          ? static_cast<int64_t>(params.max_bytes_per_decision / in.pool.page_bytes)
          : std::numeric_limits<int64_t>::max();

  // The mean committed width over every block, weighted by its pages at max_bits: its floor
  // (min_mean_bits) and ceiling (max_mean_bits) are sums of size * width against the mean times
  // the sum of sizes.
  double size_sum = 0, size_bits = 0;
  for (const BlockInput& b : in.blocks) {
    size_sum += b.pages[params.max_bits];
    size_bits += static_cast<double>(b.pages[params.max_bits]) * b.committed;
  }
  const double mean_floor = params.min_mean_bits * size_sum;
  const double mean_ceiling = params.max_mean_bits > 0 ? params.max_mean_bits * size_sum
                                                       : std::numeric_limits<double>::infinity();
  const bool pressure = out.available_pages < out.low_pages;
  const bool over_ceiling = size_bits > mean_ceiling;

  PlanAction want = PlanAction::kNone;
  if (pressure || over_ceiling) {
    want = PlanAction::kLower;
  } else if (out.available_pages > out.high_pages) {
    want = PlanAction::kRaise;
  }
  if (want == PlanAction::kNone) {
    out.reason = "available " + std::to_string(out.available_pages) +
                 " pages within the watermarks [" + std::to_string(out.low_pages) + ", " +
                 std::to_string(out.high_pages) + "]";
    return out;
  }
  if (params.static_mode) {
    out.reason = "static mode";
    return out;
  }
  if (in.last_change_ms >= 0 && in.now_ms - in.last_change_ms < params.min_interval_ms) {
    out.reason = "rate limited: last change " + std::to_string(in.now_ms - in.last_change_ms) +
                 " ms ago (min_interval_ms " + std::to_string(params.min_interval_ms) + ")";
    return out;
  }

  const BlockShares shares = RoutingShares(in, params.use_routing, params.live_mass_weight);
  const std::vector<double>& rmass = shares.r;
  const size_t n = in.blocks.size();
  std::vector<int> width(n), floor(n);
  std::vector<double> hot(n);
  std::vector<bool> movable(n);
  for (size_t i = 0; i < n; ++i) {
    const BlockInput& b = in.blocks[i];
    width[i] = b.committed;
    hot[i] = HotWeight(rmass[i], params);
    int f = std::max(params.min_bits, b.floor);
    // The hot floor applies only where live traffic is measured (the calibration's share alone
    // weighs, no more); there r_i is the blend of live_mass_weight.
    if (shares.live[i] && rmass[i] >= params.hot_threshold) f = std::max(f, params.hot_floor_bits);
    floor[i] = std::min(f, params.max_bits);
    movable[i] = b.committed >= params.min_bits && b.committed <= params.max_bits;
  }

  if (want == PlanAction::kLower) {
    out.action = PlanAction::kLower;
    out.target_pages = pressure ? (out.low_pages - out.available_pages) + headroom : 0;
    // The next lowering of block i from its current width: the highest width at or above its
    // floor that frees at least one page.
    auto next = [&](size_t i, Step* s) {
      const BlockInput& b = in.blocks[i];
      for (int to = width[i] - 1; to >= floor[i]; --to) {
        if (b.pages[to] < b.pages[width[i]]) {
          const double freed = b.pages[width[i]] - b.pages[to];
          *s = Step{StepDamage(b, width[i], to, hot[i]) / freed, rmass[i], i, to};
          return true;
        }
      }
      return false;
    };
    auto later = [](const Step& a, const Step& b) {  // min-heap on damage per page
      if (a.per_page != b.per_page) return a.per_page > b.per_page;
      if (a.mass != b.mass) return a.mass > b.mass;  // colder first
      return a.block > b.block;
    };
    std::priority_queue<Step, std::vector<Step>, decltype(later)> heap(later);
    for (size_t i = 0; i < n; ++i) {
      Step s;
      if (movable[i] && next(i, &s)) heap.push(s);
    }
    // Until the pages are freed and the mean is at or below its ceiling.
    while ((out.pages_moved < out.target_pages || size_bits > mean_ceiling) && !heap.empty()) {
      const Step s = heap.top();
      heap.pop();
      const BlockInput& b = in.blocks[s.block];
      const int64_t freed = static_cast<int64_t>(b.pages[width[s.block]]) - b.pages[s.to];
      if (out.pages_moved + freed > max_pages) continue;  // over the rate limit: leave the block
      const double drop = static_cast<double>(b.pages[params.max_bits]) * (width[s.block] - s.to);
      if (params.min_mean_bits > 0 && size_bits - drop < mean_floor)
        continue;  // below the mean floor
      size_bits -= drop;
      out.damage += s.per_page * static_cast<double>(freed);
      out.pages_moved += freed;
      width[s.block] = s.to;
      Step again;
      if (next(s.block, &again)) heap.push(again);
    }
    out.target_met = out.pages_moved >= out.target_pages;
    const std::string freed = ": freeing " + std::to_string(out.pages_moved) + " of " +
                              std::to_string(out.target_pages) + " pages";
    if (pressure) {
      out.reason = "available " + std::to_string(out.available_pages) +
                   " pages below the low watermark " + std::to_string(out.low_pages) + freed;
    } else {
      out.reason = "mean width " + std::to_string(size_bits / size_sum) +
                   " after lowering (above max_mean_bits " + std::to_string(params.max_mean_bits) +
                   " before)" + freed;
    }
  } else {
    out.action = PlanAction::kRaise;
    out.target_pages = out.available_pages - out.high_pages;
    auto next = [&](size_t i, Step* s) {
      const BlockInput& b = in.blocks[i];
      if (width[i] >= params.max_bits) return false;
      const int to = width[i] + 1;
      const double avoided = StepDamage(b, to, width[i], hot[i]);
      if (avoided <= 0) return false;
      const double added = static_cast<double>(b.pages[to]) - b.pages[width[i]];
      *s = Step{added > 0 ? avoided / added : std::numeric_limits<double>::infinity(), rmass[i], i,
                to};
      return true;
    };
    auto later = [](const Step& a, const Step& b) {  // max-heap on damage avoided per page
      if (a.per_page != b.per_page) return a.per_page < b.per_page;
      if (a.mass != b.mass) return a.mass < b.mass;  // hotter first
      return a.block > b.block;
    };
    std::priority_queue<Step, std::vector<Step>, decltype(later)> heap(later);
    for (size_t i = 0; i < n; ++i) {
      Step s;
      if (movable[i] && next(i, &s)) heap.push(s);
    }
    const int64_t budget = std::min(out.target_pages, max_pages);
    while (!heap.empty()) {
      const Step s = heap.top();
      heap.pop();
      const BlockInput& b = in.blocks[s.block];
      const int64_t added = static_cast<int64_t>(b.pages[s.to]) - b.pages[width[s.block]];
      if (out.pages_moved + added > budget) continue;  // does not fit: leave the block
      const double rise = static_cast<double>(b.pages[params.max_bits]) * (s.to - width[s.block]);
      if (size_bits + rise > mean_ceiling) continue;  // above the mean ceiling: leave the block
      size_bits += rise;
      out.damage += StepDamage(b, s.to, width[s.block], hot[s.block]);
      out.pages_moved += added;
      width[s.block] = s.to;
      Step again;
      if (next(s.block, &again)) heap.push(again);
    }
    out.reason = "available " + std::to_string(out.available_pages) +
                 " pages above the high watermark " + std::to_string(out.high_pages) +
                 ": raising with " + std::to_string(out.pages_moved) + " of " +
                 std::to_string(out.target_pages) + " pages";
  }

  for (size_t i = 0; i < n; ++i) {
    if (width[i] == in.blocks[i].committed) continue;
    const BlockInput& b = in.blocks[i];
    out.changes.push_back(WidthChange{i, b.layer, b.expert, b.proj, b.committed, width[i]});
  }
  return out;
}

}  // namespace pw::planner
