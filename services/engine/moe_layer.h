// RunMoeLayer: the MoE step of one layer (the order and seams are documented in moe.h), and
// the default bf16 expert provider.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/dense.h"
#include "kernels/cpu/thread_pool.h"
#include "services/engine/expert_workspace.h"
#include "services/engine/model.h"
#include "services/engine/moe.h"

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

// Every expert resident.
class AllResident final : public ExpertResidency {
 public:
  bool IsResident(int, int) const override { return true; }
};

// Reusable buffers of RunMoeLayer (grown on demand, never shrunk).
struct MoeScratch {
  std::vector<float> logits, probs;           // [T, E]
  std::vector<ExpertAssignment> assignments;  // router's top-k, then the hook's rewrite
  std::vector<ExpertAssignment> selected;     // router's top-k kept for the recorder
  std::vector<int32_t> order, offsets;        // assignments grouped per expert
  std::vector<ExpertGroup> groups;            // the ExpertLayerCall of the layer
  std::vector<ExpertRow> rows;
  ExpertWorkspace experts;                    // lent to the provider
  std::vector<float> gate_up, ye;             // shared expert
  std::vector<float> shared_gate;             // [T]
  std::vector<int32_t> topk_idx;
  std::vector<uint8_t> seen;                  // [T, E]: the hook's (token, expert) pairs
};

// out[t, :] = MoE(x[t, :]) for t < T (overwrites out). x is the post-attention-normed hidden
// state [T, H]. `ctx` carries layer, T, seq ids, positions, pure_decode and residency; the
// remaining fields are filled here. Returns the provider's or hook's error, or kInternal when a
// hook returns invalid assignments.
Status RunMoeLayer(const ModelConfig& config, const LayerWeights& w, RoutingContext ctx,
                   const float* x, float* out, const MoeHooks& hooks,
                   ExpertWeightProvider* provider, MoeScratch* s, cpu::ThreadPool* pool,
                   const cpu::DenseKernels& k);

// out[t, :] = down(silu(gate x) * up x) for a dense SwiGLU MLP (overwrites out). `tmp` is
// scratch.
void RunDenseMlp(const MlpWeights& w, const float* x, size_t T, size_t hidden, float* out,
                 std::vector<float>* tmp, cpu::ThreadPool* pool, const cpu::DenseKernels& k);

}  // namespace pw::engine
