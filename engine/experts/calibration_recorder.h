// Computes the experts from the checkpoint's bf16 blocks and accumulates, per block,
// sum_t x_tj^2 over the tokens routed to it: the diagonal Hessian the quantizer weighs errors by.
#pragma once

#include <cstdint>
#include <vector>

#include "common/expert_block.h"
#include "common/status.h"
#include "engine/experts/bf16_expert_provider.h"
#include "engine/experts/moe.h"

namespace pw::anyprec {

// Accumulates per block input statistics while computing the experts from the checkpoint's
// bf16 blocks (`inner`), block by block (the down block's input is act(gate, up)).
class CalibrationRecorder final : public engine::ExpertWeightProvider {
 public:
  CalibrationRecorder(const engine::Bf16ExpertProvider* inner, int num_layers, int num_experts,
                      int hidden, int ffn);
  Status RunExperts(const engine::ExpertLayerCall& call) override;
  int Bits(int layer, int expert, engine::ExpertProj proj) const override {
    return inner_->Bits(layer, expert, proj);
  }
  // sum over recorded tokens of x_j^2: [cols of the block].
  const std::vector<double>& SumSquares(int layer, int expert, engine::ExpertProj proj) const {
    return sums_[Index(layer, expert, proj)];
  }
  // Tokens recorded for the block.
  uint64_t Tokens(int layer, int expert, engine::ExpertProj proj) const {
    return tokens_[Index(layer, expert, proj)];
  }

 private:
  size_t Index(int layer, int expert, engine::ExpertProj proj) const {
    return ExpertBlockIndex(layer, expert, proj, num_experts_);
  }
  const engine::Bf16ExpertProvider* inner_;
  int num_layers_, num_experts_;
  std::vector<std::vector<double>> sums_;
  std::vector<uint64_t> tokens_;
};

}  // namespace pw::anyprec
