// RunMoeLayer: the MoE step of one layer (the order and seams are documented in moe.h), and the
// dense SwiGLU MLP of the layers that have no experts.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/dense.h"
#include "kernels/cpu/thread_pool.h"
#include "engine/experts/expert_workspace.h"
#include "engine/models/model.h"
#include "engine/experts/moe.h"

namespace pw::engine {

// Reusable buffers of RunMoeLayer (grown on demand, never shrunk).
struct MoeScratch {
  std::vector<float> logits, probs;           // [T, E]: router logits, the gate's scores
  std::vector<float> selection;               // [T, E]: what the gate ranked by (sigmoid gate)
  std::vector<ExpertAssignment> assignments;  // router's top-k, then the hook's rewrite
  std::vector<ExpertAssignment> selected;     // router's top-k kept for the recorder
  std::vector<int32_t> order, offsets;        // assignments grouped per expert
  std::vector<ExpertGroup> groups;            // the ExpertLayerCall of the layer
  std::vector<ExpertRow> rows;
  ExpertWorkspace experts;                    // lent to the provider
  std::vector<float> gate_up, ye;             // shared expert
  std::vector<float> shared_gate;             // [T]
  std::vector<int32_t> topk_idx;              // the gate's scratch
  std::vector<uint8_t> seen;                  // [T, E]: the hook's (token, expert) pairs
};

// out[t, :] = MoE(x[t, :]) for t < T (overwrites out). x is the post-attention-normed hidden
// state [T, H]; the router reads `router_x` [T, H] instead when given (gemma4's router has its
// own input), and each routed weight is multiplied by w.expert_weight_scale[expert] when the
// layer has one (after the hooks: what they rewrite is weighed as HF weighs it). `ctx` carries
// layer, T, seq ids, positions, pure_decode and residency; the remaining fields are filled here.
// Returns the provider's or hook's error, or kInternal when a hook returns invalid assignments.
Status RunMoeLayer(const ModelConfig& config, const LayerWeights& w, RoutingContext ctx,
                   const float* x, float* out, const MoeHooks& hooks,
                   ExpertWeightProvider* provider, MoeScratch* s, cpu::ThreadPool* pool,
                   const kernels::DenseKernels& k, const float* router_x = nullptr);

// out[t, :] = down(act(gate x, up x)) for a dense gated MLP (overwrites out): act the layer's
// activation (SwiGLU, or gemma4's gelu-tanh; ExpertActivationOp). `tmp` is scratch.
Status RunDenseMlp(const MlpWeights& w, ExpertActivation act, const float* x, size_t T,
                   size_t hidden, float* out, std::vector<float>* tmp, cpu::ThreadPool* pool,
                   const kernels::DenseKernels& k);

}  // namespace pw::engine
