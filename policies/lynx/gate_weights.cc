#include "policies/lynx/gate_weights.h"

#include <string>

namespace pw::lynx {

const char* GateWeightsName(GateWeights g) {
  return g == GateWeights::kOriginalMass ? "mass" : "renorm";
}

Result<GateWeights> ParseGateWeights(std::string_view name) {
  if (name == "renorm") return GateWeights::kRenormalize;
  if (name == "mass") return GateWeights::kOriginalMass;
  return InvalidArgument("gate weights must be renorm or mass, got '" + std::string(name) + "'");
}

void SetGateWeights(GateWeights mode, bool norm_topk_prob, const float* probs,
                    const int32_t* original, const int32_t* experts, int k, float* weights,
                    float scale) {
  float sum = 0.f;
  for (int j = 0; j < k; ++j) sum += probs[experts[j]];
  if (mode == GateWeights::kRenormalize || norm_topk_prob) {
    for (int j = 0; j < k; ++j) {
      weights[j] = norm_topk_prob ? probs[experts[j]] / sum : probs[experts[j]];
    }
  } else {
    float m0 = 0.f;
    for (int j = 0; j < k; ++j) m0 += probs[original[j]];
    const float mass = sum > 0.f ? m0 / sum : 1.f;
    for (int j = 0; j < k; ++j) weights[j] = probs[experts[j]] * mass;
  }
  if (scale != 1.f) {
    for (int j = 0; j < k; ++j) weights[j] *= scale;
  }
}

}  // namespace pw::lynx
