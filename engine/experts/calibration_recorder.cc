#include "engine/experts/calibration_recorder.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/dense.h"
#include "engine/experts/run_experts_by_block.h"

namespace pw::anyprec {

CalibrationRecorder::CalibrationRecorder(const engine::Bf16ExpertProvider* inner, int num_layers,
                                         int num_experts, int hidden, int ffn)
    : inner_(inner), num_layers_(num_layers), num_experts_(num_experts) {
  sums_.resize(static_cast<size_t>(num_layers) * num_experts * 2);
  tokens_.assign(sums_.size(), 0);
  for (size_t i = 0; i < sums_.size(); ++i) sums_[i].assign(i % 2 == 0 ? hidden : ffn, 0.0);
}

Status CalibrationRecorder::RunExperts(const engine::ExpertLayerCall& call) {
  const int layer = call.layer;
  for (const engine::ExpertGroup& g : call.groups) {
    if (layer < 0 || layer >= num_layers_ || g.expert < 0 || g.expert >= num_experts_) {
      return InvalidArgument("calibration: no expert " + std::to_string(g.expert) + " in layer " +
                             std::to_string(layer));
    }
  }
  // Block by block: the down block's input (act(gate, up)) is recorded too.
  return engine::RunExpertsByBlock(
      call, cpu::Kernels(),
      [&](int expert, engine::ExpertProj proj, const float* x, size_t ldx, size_t num_tokens, float* y,
          size_t ldy) {
        const size_t i = Index(layer, expert, proj);
        std::vector<double>& s = sums_[i];
        for (size_t t = 0; t < num_tokens; ++t) {
          const float* row = x + t * ldx;
          for (size_t j = 0; j < s.size(); ++j) s[j] += static_cast<double>(row[j]) * row[j];
        }
        tokens_[i] += num_tokens;
        return inner_->ApplyBlock(layer, expert, proj, x, ldx, num_tokens, y, ldy, call.pool);
      });
}

}  // namespace pw::anyprec
