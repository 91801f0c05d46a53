// glm4_moe (transformers Glm4MoeForCausalLM; GLM-4.5, GLM-4.5-Air): q/k/v biases when
// attention_bias, per-head qk norm when use_qk_norm, RoPE over the first half of each head
// (model_config.cc); sigmoid routing with e_score_correction_bias for selection only and grouped
// top-k (GateKind::kSigmoidGroupedTopK); SwiGLU experts; n_shared_experts shared experts as one
// MLP added to every token with no gate; dense layers below first_k_dense_replace. The MTP
// layers stored after the last (num_nextn_predict_layers) are not loaded.
#include "engine/models/family.h"

namespace pw::engine {

extern constinit const ModelFamily kGlm4MoeFamily = {
    .type = ModelType::kGlm4Moe,
    .model_type = "glm4_moe",
    .embed = kHfEmbed,
    .final_norm = kHfFinalNorm,
    .lm_head = kHfLmHead,
    .input_norm = "input_layernorm",
    .post_attn_norm = "post_attention_layernorm",
    .attention = kHfAttention,
    .dense_mlp = "mlp.",
    .mlp = kHfMlp,
    .router = "gate",
    .router_bias = "gate.e_score_correction_bias",
    .shared_expert = "shared_experts.",
    .shared_expert_gate = nullptr,
    .gate = GateKind::kSigmoidGroupedTopK,
    .activation = ExpertActivation::kSwiGlu,
};

}  // namespace pw::engine
