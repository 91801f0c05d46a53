// The identity of an expert's linear block, and the one index function for tables of blocks.
//
// Every routed expert of an MoE layer has two blocks: gate_up ([2 * I, H]: rows [0, I) are
// gate_proj, rows [I, 2I) up_proj) and down ([H, I]). The engine, the .apw store, the weight
// tables of the workers and the width maps all number blocks the same way:
//   index = (layer * num_experts + expert) * 2 + proj.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pw {

enum class ExpertProj : uint8_t { kGateUp = 0, kDown = 1 };

inline constexpr int kProjsPerExpert = 2;

// "gate_up" or "down": how logs, errors, plan files and the store name a projection.
constexpr const char* ExpertProjName(ExpertProj proj) {
  return proj == ExpertProj::kGateUp ? "gate_up" : proj == ExpertProj::kDown ? "down" : "unknown";
}

// Index of block (layer, expert, proj) in a table of num_experts experts per layer.
constexpr size_t ExpertBlockIndex(int64_t layer, int64_t expert, ExpertProj proj, int64_t num_experts) {
  return static_cast<size_t>((layer * num_experts + expert) * kProjsPerExpert + static_cast<int64_t>(proj));
}

// The block an ExpertBlockIndex names (its inverse).
struct ExpertBlock {
  int64_t layer = 0, expert = 0;
  ExpertProj proj = ExpertProj::kGateUp;
};
constexpr ExpertBlock ExpertBlockAt(size_t index, int64_t num_experts) {
  const int64_t i = static_cast<int64_t>(index);
  return {i / kProjsPerExpert / num_experts, i / kProjsPerExpert % num_experts,
          static_cast<ExpertProj>(i % kProjsPerExpert)};
}
static_assert(ExpertBlockAt(ExpertBlockIndex(3, 5, ExpertProj::kDown, 7), 7).expert == 5);

}  // namespace pw
