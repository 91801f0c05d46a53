// The kinds a model family picks for its MoE layers (engine/models/family.h): which gate turns
// the router's logits into each token's experts, and which gated activation sits between an
// expert's gate_up and down blocks. The shared code computes each kind in one place:
//   GateKind          engine/layers/moe_gate.h (RunMoeGate)
//   ExpertActivation  engine/experts/expert_activation.h (ExpertActivationOp), carried to the
//                     providers in every ExpertLayerCall
// A family that needs another (sigmoid + bias + grouped top-k, clamped SwiGLU, ...) adds a value
// here and its case there; code that meets a kind it does not implement returns kUnsupported,
// never a silent fallback. (The kinds live in models/, the bottom of the engine's folders, so
// the family files, the layers and the expert call can all name them.)
#pragma once

#include <cstdint>

namespace pw::engine {

enum class GateKind : uint8_t {
  // p = softmax(logits) over all experts (fp32); the k experts of highest p (lower expert id on
  // ties), in descending p; weight p_e, or p_e / sum of the k when the model renormalises
  // (norm_topk_prob). qwen2_moe, qwen3_moe, olmoe, mixtral.
  kSoftmaxTopK = 0,
  // s = sigmoid(logits) (fp32); the selection scores s + b (b: the layer's
  // e_score_correction_bias) rank, never weigh: experts are split into n_group equal groups, a
  // group scores the sum of its two best selection scores, the topk_group best groups are kept
  // (lower group id on ties) and the k experts of highest selection score inside them are taken
  // (lower expert id on ties), in descending selection score; weight s_e, or s_e / sum of the k
  // with norm_topk_prob, times routed_scaling_factor. glm4_moe.
  kSigmoidGroupedTopK = 1,
};

enum class ExpertActivation : uint8_t {
  // h = silu(gate) * up, silu(g) = g / (1 + exp(-g)). Every supported family.
  kSwiGlu = 0,
  // gpt-oss's clamped SwiGLU: g = min(gate, 7), u = clamp(up, -7, 7),
  // h = (u + 1) * g * sigmoid(1.702 g). gpt_oss (its experts also add biases, ExpertLayerCall).
  kClampedSwiGlu = 1,
  // h = gelu_tanh(gate) * up, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
  // (HF's gelu_pytorch_tanh). gemma4 (its dense MLPs too).
  kGeluTanh = 2,
};

constexpr const char* GateKindName(GateKind kind) {
  return kind == GateKind::kSoftmaxTopK          ? "softmax-top-k"
         : kind == GateKind::kSigmoidGroupedTopK ? "sigmoid-grouped-top-k"
                                                 : "unknown";
}

constexpr const char* ExpertActivationName(ExpertActivation kind) {
  return kind == ExpertActivation::kSwiGlu          ? "swiglu"
         : kind == ExpertActivation::kClampedSwiGlu ? "clamped-swiglu"
         : kind == ExpertActivation::kGeluTanh      ? "gelu-tanh"
                                                    : "unknown";
}

}  // namespace pw::engine
