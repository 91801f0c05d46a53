// The default expert provider: every expert block read from the checkpoint's bf16 matrices.
#pragma once

#include <cstddef>

#include "common/status.h"
#include "kernels/cpu/thread_pool.h"
#include "engine/experts/moe.h"
#include "engine/models/model.h"

namespace pw::engine {

// Reads expert blocks from the checkpoint's bf16 matrices; a layer runs through
// RunBf16Experts (bf16_experts.h).
class Bf16ExpertProvider final : public ExpertWeightProvider {
 public:
  explicit Bf16ExpertProvider(const Model& model) : model_(model) {}
  Status RunExperts(const ExpertLayerCall& call) override;
  int Bits(int, int, ExpertProj) const override { return 16; }
  // One block's product (the block function of RunExpertsByBlock, run_experts_by_block.h),
  // for providers that fall back to bf16 block by block.
  Status ApplyBlock(int layer, int expert, ExpertProj proj, const float* x, size_t ldx,
                    size_t num_tokens, float* y, size_t ldy, cpu::ThreadPool* pool) const;

 private:
  Status CheckExpert(int layer, int expert) const;
  const Model& model_;
};

}  // namespace pw::engine
