// MoeGate: the step of a MoE layer that turns router logits into each token's top-k experts
// and their weights (the "probs = ...; top-k ..." line of moe.h). One function for every kind;
// the kind comes from the model family (LayerWeights::gate, engine/models/family.h) and the
// parameters from the config, so RunMoeLayer names no family.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "engine/experts/moe.h"
#include "engine/models/moe_kinds.h"
#include "kernels/cpu/dense.h"

namespace pw::engine {

struct MoeGate {
  GateKind kind = GateKind::kSoftmaxTopK;
  int top_k = 0;             // experts per token, in [1, num_experts]
  bool renormalize = false;  // the top-k weights are divided by their sum (norm_topk_prob)
  // kSigmoidGroupedTopK: the groups (n_group divides E, topk_group in [1, n_group], top_k at
  // most the kept groups' experts), the factor on every weight and the layer's selection bias.
  int n_group = 1;
  int topk_group = 1;
  float weight_scale = 1.f;     // routed_scaling_factor
  const float* bias = nullptr;  // [E] e_score_correction_bias; required by kSigmoidGroupedTopK
};

// For each token t < T: scores[t, :] = the gate's per-expert scores of logits[t, :] (what hooks
// and recorders see as RoutingContext::router_probs: the softmax for kSoftmaxTopK, the unbiased
// sigmoid for kSigmoidGroupedTopK), and gate.top_k ExpertAssignments {t, expert, weight, rank}
// appended to *out, token-major, in rank order (GateKind's comment says which experts and
// weights each kind gives). For kSigmoidGroupedTopK, selection[t, :] = what the experts were
// ranked by (RoutingContext::selection_scores): sigmoid + bias, -inf outside the token's kept
// groups; kSoftmaxTopK leaves it untouched (it ranks by `scores`). logits, scores and selection
// are [T, E] (none aliasing another); `order` is scratch. kInvalidArgument when top_k or the
// grouping is out of range or the bias is missing; kUnsupported for a kind this function does
// not implement (out unchanged).
Status RunMoeGate(const MoeGate& gate, const float* logits, size_t T, size_t E,
                  const kernels::DenseKernels& k, float* scores, float* selection,
                  std::vector<int32_t>* order, std::vector<ExpertAssignment>* out);

}  // namespace pw::engine
