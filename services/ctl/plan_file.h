// Plan files for `pw-ctl apply`: hand-written expert widths, checked against a schema
// (common/formats/yaml_config.h), every error naming file:line:col.
//
//   # every listed block to its width (0 = drop it, 3..8)
//   blocks:
//     - {layer: 0, expert: 3, proj: down, bits: 5}
//     - {layer: 1, expert: 7, bits: 8}           # proj absent: both gate_up and down
//   layers:                                       # whole layers
//     - {layer: 2, bits: 4}
//
// The broker checks layer and expert ranges against its model when it applies the plan.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace pw::ctl {

struct PlanEntry {
  int layer = 0;
  int expert = -1;  // -1: every expert of the layer
  int proj = -1;    // -1: both; 0 gate_up; 1 down
  int bits = 0;
};

// At least one entry; bits 0 or 3..8.
Result<std::vector<PlanEntry>> LoadPlanFile(const std::string& path);

}  // namespace pw::ctl
