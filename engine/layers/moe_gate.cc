#include "engine/layers/moe_gate.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace pw::engine {
namespace {

// softmax over every expert, then the top-k of the probabilities, optionally renormalised.
void SoftmaxTopK(const MoeGate& gate, const float* logits, size_t T, size_t E,
                 const kernels::DenseKernels& k, float* probs, std::vector<int32_t>* order,
                 std::vector<ExpertAssignment>* out) {
  const size_t K = static_cast<size_t>(gate.top_k);
  std::memcpy(probs, logits, T * E * sizeof(float));
  for (size_t t = 0; t < T; ++t) k.softmax(probs + t * E, E);
  order->resize(E);
  int32_t* idx = order->data();
  for (size_t t = 0; t < T; ++t) {
    const float* p = probs + t * E;
    for (size_t e = 0; e < E; ++e) idx[e] = static_cast<int32_t>(e);
    std::partial_sort(idx, idx + K, idx + E,
                      [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float sum = 0.f;
    for (size_t j = 0; j < K; ++j) sum += p[idx[j]];
    for (size_t j = 0; j < K; ++j) {
      const int32_t e = idx[j];
      const float weight = gate.renormalize ? p[e] / sum : p[e];
      out->push_back({static_cast<int32_t>(t), e, weight, static_cast<int16_t>(j)});
    }
  }
}

}  // namespace

Status RunMoeGate(const MoeGate& gate, const float* logits, size_t T, size_t E,
                  const kernels::DenseKernels& k, float* scores, std::vector<int32_t>* order,
                  std::vector<ExpertAssignment>* out) {
  if (gate.top_k < 1 || static_cast<size_t>(gate.top_k) > E) {
    return InvalidArgument("MoE gate: top-k " + std::to_string(gate.top_k) + " is outside [1, " +
                           std::to_string(E) + "] experts");
  }
  switch (gate.kind) {
    case GateKind::kSoftmaxTopK:
      SoftmaxTopK(gate, logits, T, E, k, scores, order, out);
      return Status::Ok();
  }
  return Unsupported("MoE gate kind " + std::to_string(static_cast<int>(gate.kind)) +
                     " is not implemented");
}

}  // namespace pw::engine
