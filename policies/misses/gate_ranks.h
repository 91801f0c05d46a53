// Gate weights by rank: how heavy a token's first, second, ... choice is in a router-logit
// trace (router_trace.h), and how often each rank's weight reaches a threshold. A threshold
// rule (fetch a miss whose weight >= X) protects the ranks whose weights reach X; this says
// which those are for a given model (pw-sim --gate-ranks).
#pragma once

#include <cstdint>
#include <vector>

#include "policies/misses/router_trace.h"

namespace pw::misses {

struct GateRanks {
  std::vector<double> mean;           // [k] mean gate weight of the rank-r choice
  std::vector<double> share_at_least; // [k] share of rank-r choices with weight >= threshold
  uint64_t selections = 0;            // (token, layer) pairs counted
};

// Over every token of every layer record of `trace` (weights as the router gave them).
GateRanks GateWeightsByRank(const RouterTrace& trace, float threshold);

}  // namespace pw::misses
