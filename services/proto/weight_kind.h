// An expert block's projection on the wire (wire::WeightKind) and in memory (ExpertProj,
// common/expert_block.h): the one conversion both ways.
#pragma once

#include "common/expert_block.h"
#include "services/proto/cluster.capnp.h"

namespace pw::proto {

inline wire::WeightKind ToWire(ExpertProj proj) {
  return proj == ExpertProj::kGateUp ? wire::WeightKind::GATE_UP : wire::WeightKind::DOWN;
}

inline ExpertProj FromWire(wire::WeightKind kind) {
  return kind == wire::WeightKind::GATE_UP ? ExpertProj::kGateUp : ExpertProj::kDown;
}

}  // namespace pw::proto
