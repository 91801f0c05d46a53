#include "engine/experts/bf16_expert_provider.h"

#include <string>

#include "engine/experts/bf16_experts.h"
#include "engine/experts/expert_workspace.h"
#include "engine/ops/linear.h"

namespace pw::engine {

Status Bf16ExpertProvider::CheckExpert(int layer, int expert) const {
  const auto& layers = model_.layers();
  if (layer < 0 || static_cast<size_t>(layer) >= layers.size() || !layers[layer].is_moe ||
      expert < 0 || static_cast<size_t>(expert) >= layers[layer].experts.size()) {
    return InvalidArgument("bf16 experts: no expert " + std::to_string(expert) + " in layer " +
                           std::to_string(layer));
  }
  return Status::Ok();
}

Status Bf16ExpertProvider::ApplyBlock(int layer, int expert, ExpertProj proj, const float* x,
                                      size_t ldx, size_t num_tokens, float* y, size_t ldy,
                                      cpu::ThreadPool* pool) const {
  PW_RETURN_IF_ERROR(CheckExpert(layer, expert));
  const MlpWeights& w = model_.layers()[layer].experts[expert];
  const kernels::DenseKernels& k = cpu::Kernels();
  if (proj == ExpertProj::kGateUp) {
    Linear(pool, k, x, ldx, num_tokens, w.gate, y, ldy);
    Linear(pool, k, x, ldx, num_tokens, w.up, y + w.gate.rows, ldy);
  } else {
    Linear(pool, k, x, ldx, num_tokens, w.down, y, ldy);
  }
  return Status::Ok();
}

Status Bf16ExpertProvider::RunExperts(const ExpertLayerCall& call) {
  auto* experts = call.workspace->Array<Bf16Expert>(ExpertWorkspace::kRunnerSlots, call.groups.size());
  for (size_t g = 0; g < call.groups.size(); ++g) {
    PW_RETURN_IF_ERROR(CheckExpert(call.layer, call.groups[g].expert));
    const MlpWeights& w = model_.layers()[call.layer].experts[call.groups[g].expert];
    experts[g] = {w.gate.data, w.up.data, w.down.data, w.gate.packed, w.up.packed, w.down.packed};
  }
  return RunBf16Experts(call, experts, cpu::Kernels());
}

}  // namespace pw::engine
