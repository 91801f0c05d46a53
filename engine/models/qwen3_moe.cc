// qwen3_moe (transformers Qwen3MoeForCausalLM): attention_bias on q/k/v/o, RMSNorm of each
// query and key head (model_config.cc); softmax top-k routing, renormalised when
// norm_topk_prob; SwiGLU experts; no shared expert; dense layers per decoder_sparse_step /
// mlp_only_layers.
#include "engine/models/family.h"

namespace pw::engine {

extern constinit const ModelFamily kQwen3MoeFamily = {
    .type = ModelType::kQwen3Moe,
    .model_type = "qwen3_moe",
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
    .shared_expert = nullptr,
    .shared_expert_gate = nullptr,
    .gate = GateKind::kSoftmaxTopK,
    .activation = ExpertActivation::kSwiGlu,
};

}  // namespace pw::engine
