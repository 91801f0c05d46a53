// GateWeights: how a remapped token's gate weights are set (DESIGN.md 5.3, step 5).
//
// For a token whose selected set is S (k experts) with router probabilities p (softmax of its
// logits over all N experts) and original top-k set S0:
//   kRenormalize  : as the model's router does on S: w_e = p_e / sum_{S} p   when the model
//                   renormalises (norm_topk_prob), else w_e = p_e.
//   kOriginalMass : w_e = p_e * M0 / sum_{S} p, where M0 is the token's original top-k weight
//                   sum as the router produced it (1 with norm_topk_prob, sum_{S0} p without):
//                   the remapped token keeps the total gate mass it had.
// With norm_topk_prob both give the same weights (M0 = 1); they differ for routers that do not
// renormalise (OLMoE, DeepSeek-style raw top-k weights). Every weight is then multiplied by
// `scale` (the router's routed_scaling_factor; 1 for softmax routers).
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace pw::lynx {

enum class GateWeights : uint8_t { kRenormalize = 0, kOriginalMass = 1 };

const char* GateWeightsName(GateWeights g);  // "renorm", "mass"
Result<GateWeights> ParseGateWeights(std::string_view name);

// weights[j] for experts[j], j < k (rule above). probs: the token's [N] probabilities;
// original: its original top-k experts. Sums run in index order (the router's order for the
// original set, so an unchanged token gets the router's weights bit for bit).
void SetGateWeights(GateWeights mode, bool norm_topk_prob, const float* probs,
                    const int32_t* original, const int32_t* experts, int k, float* weights,
                    float scale = 1.f);

}  // namespace pw::lynx
