// qwen2_moe (transformers Qwen2MoeForCausalLM): q/k/v biases, no qk norm (model_config.cc);
// softmax top-k routing, renormalised when norm_topk_prob; SwiGLU experts; a shared expert
// added with a sigmoid gate; dense layers per decoder_sparse_step / mlp_only_layers.
#include "engine/models/family.h"

namespace pw::engine {

extern constinit const ModelFamily kQwen2MoeFamily = {
    .type = ModelType::kQwen2Moe,
    .model_type = "qwen2_moe",
    .embed = kHfEmbed,
    .final_norm = kHfFinalNorm,
    .lm_head = kHfLmHead,
    .input_norm = "input_layernorm",
    .post_attn_norm = "post_attention_layernorm",
    .attention = kHfAttention,
    .dense_mlp = "mlp.",
    .mlp = kHfMlp,
    .router = "gate",
    .router_bias = nullptr,
    .shared_expert = "shared_expert.",
    .shared_expert_gate = "shared_expert_gate",
    .gate = GateKind::kSoftmaxTopK,
    .activation = ExpertActivation::kSwiGlu,
};

}  // namespace pw::engine
