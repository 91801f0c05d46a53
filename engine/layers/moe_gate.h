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
};

// For each token t < T: scores[t, :] = the gate's per-expert scores of logits[t, :] (what hooks
// and recorders see as RoutingContext::router_probs; the softmax for kSoftmaxTopK), and
// gate.top_k ExpertAssignments {t, expert, weight, rank} appended to *out, token-major, in rank
// order (GateKind's comment says which experts and weights each kind gives). logits and scores
// are [T, E] (scores may not alias logits); `order` is scratch. kInvalidArgument when top_k is
// outside [1, E]; kUnsupported for a kind this function does not implement (out unchanged).
Status RunMoeGate(const MoeGate& gate, const float* logits, size_t T, size_t E,
                  const kernels::DenseKernels& k, float* scores, std::vector<int32_t>* order,
                  std::vector<ExpertAssignment>* out);

}  // namespace pw::engine
