// mixtral (transformers MixtralForCausalLM): no biases, no qk norm (model_config.cc); the MoE
// block is "block_sparse_moe." with experts w1/w3/w2 (checkpoint_experts.cc's ExpertNaming);
// softmax top-k routing, always renormalised; SwiGLU experts; no shared expert; every layer
// MoE.
#include "engine/models/family.h"

namespace pw::engine {

extern constinit const ModelFamily kMixtralFamily = {
    .type = ModelType::kMixtral,
    .model_type = "mixtral",
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
