// olmoe (transformers OlmoeForCausalLM): attention_bias on q/k/v/o, RMSNorm over the whole
// query and key projections, optional clip_qkv (model_config.cc); softmax top-k routing,
// renormalised when norm_topk_prob; SwiGLU experts; no shared expert; every layer MoE.
#include "engine/models/family.h"

namespace pw::engine {

extern constinit const ModelFamily kOlmoeFamily = {
    .type = ModelType::kOlmoe,
    .model_type = "olmoe",
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
