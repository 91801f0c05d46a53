#include "engine/layers/moe_gate.h"

#include <algorithm>
#include <cmath>
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

// sigmoid scores; selection = scores + bias; the topk_group groups of largest (best + second
// best selection score) kept, the rest at -inf; the top-k of the selection; weights from the
// unbiased scores (HF Glm4MoeTopkRouter).
void SigmoidGroupedTopK(const MoeGate& gate, const float* logits, size_t T, size_t E,
                        float* scores, float* selection, std::vector<int32_t>* order,
                        std::vector<ExpertAssignment>* out) {
  const size_t K = static_cast<size_t>(gate.top_k);
  const size_t G = static_cast<size_t>(gate.n_group), per = E / G;
  const size_t TG = static_cast<size_t>(gate.topk_group);
  order->resize(E + 2 * G);
  int32_t* idx = order->data();
  int32_t* groups = idx + E;
  float* group_score = reinterpret_cast<float*>(groups + G);
  static_assert(sizeof(float) == sizeof(int32_t));
  for (size_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    float* s = scores + t * E;
    float* sel = selection + t * E;
    for (size_t e = 0; e < E; ++e) {
      s[e] = 1.f / (1.f + std::exp(-l[e]));
      sel[e] = s[e] + gate.bias[e];
    }
    if (TG < G) {
      for (size_t g = 0; g < G; ++g) {
        float best = -INFINITY, second = -INFINITY;
        for (size_t e = g * per; e < (g + 1) * per; ++e) {
          if (sel[e] > best) {
            second = best;
            best = sel[e];
          } else if (sel[e] > second) {
            second = sel[e];
          }
        }
        group_score[g] = best + second;
        groups[g] = static_cast<int32_t>(g);
      }
      std::partial_sort(groups, groups + TG, groups + G, [group_score](int32_t a, int32_t b) {
        return group_score[a] > group_score[b] || (group_score[a] == group_score[b] && a < b);
      });
      // Experts of the dropped groups cannot be selected.
      for (size_t j = TG; j < G; ++j) {
        const size_t g = static_cast<size_t>(groups[j]);
        for (size_t e = g * per; e < (g + 1) * per; ++e) sel[e] = -INFINITY;
      }
    }
    for (size_t e = 0; e < E; ++e) idx[e] = static_cast<int32_t>(e);
    std::partial_sort(idx, idx + K, idx + E, [sel](int32_t a, int32_t b) {
      return sel[a] > sel[b] || (sel[a] == sel[b] && a < b);
    });
    float sum = 0.f;
    for (size_t j = 0; j < K; ++j) sum += s[idx[j]];
    for (size_t j = 0; j < K; ++j) {
      const int32_t e = idx[j];
      const float weight = (gate.renormalize ? s[e] / sum : s[e]) * gate.weight_scale;
      out->push_back({static_cast<int32_t>(t), e, weight, static_cast<int16_t>(j)});
    }
  }
}

}  // namespace

Status RunMoeGate(const MoeGate& gate, const float* logits, size_t T, size_t E,
                  const kernels::DenseKernels& k, float* scores, float* selection,
                  std::vector<int32_t>* order, std::vector<ExpertAssignment>* out) {
  if (gate.top_k < 1 || static_cast<size_t>(gate.top_k) > E) {
    return InvalidArgument("MoE gate: top-k " + std::to_string(gate.top_k) + " is outside [1, " +
                           std::to_string(E) + "] experts");
  }
  switch (gate.kind) {
    case GateKind::kSoftmaxTopK:
      SoftmaxTopK(gate, logits, T, E, k, scores, order, out);
      return Status::Ok();
    case GateKind::kSigmoidGroupedTopK: {
      const size_t G = static_cast<size_t>(std::max(gate.n_group, 0));
      if (G < 1 || E % G != 0 || gate.topk_group < 1 || gate.topk_group > gate.n_group ||
          (G > 1 && E / G < 2) ||
          static_cast<size_t>(gate.top_k) > static_cast<size_t>(gate.topk_group) * (E / G)) {
        return InvalidArgument("MoE gate: " + std::to_string(E) + " experts in n_group " +
                               std::to_string(gate.n_group) + " keeping topk_group " +
                               std::to_string(gate.topk_group) + " cannot give top-k " +
                               std::to_string(gate.top_k));
      }
      if (gate.bias == nullptr || selection == nullptr) {
        return InvalidArgument("MoE gate: sigmoid-grouped-top-k needs the selection bias "
                               "(e_score_correction_bias) and a selection buffer");
      }
      SigmoidGroupedTopK(gate, logits, T, E, scores, selection, order, out);
      return Status::Ok();
    }
  }
  return Unsupported("MoE gate kind " + std::to_string(static_cast<int>(gate.kind)) +
                     " is not implemented");
}

}  // namespace pw::engine
