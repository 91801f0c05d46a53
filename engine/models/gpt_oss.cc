// gpt_oss (transformers GptOssForCausalLM; gpt-oss-20b, gpt-oss-120b): q/k/v/o biases,
// per-head attention sinks, sliding-window and full layers by layer_types (model_config.cc),
// YaRN RoPE; the router adds its bias to the logits, takes the top-k logits and softmaxes over
// them (GateKind::kSoftmaxTopK with norm_topk_prob: the same weights); experts stacked per
// layer with biases, gate and up interleaved, bf16 or MXFP4 (common/formats/stacked_experts.h),
// applying the clamped SwiGLU (ExpertActivation::kClampedSwiGlu).
#include "engine/models/family.h"

namespace pw::engine {

extern constinit const ModelFamily kGptOssFamily = {
    .type = ModelType::kGptOss,
    .model_type = "gpt_oss",
    .embed = kHfEmbed,
    .final_norm = kHfFinalNorm,
    .lm_head = kHfLmHead,
    .input_norm = "input_layernorm",
    .post_attn_norm = "post_attention_layernorm",
    .attention = {"self_attn.", "q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm",
                  "sinks"},
    .dense_mlp = "mlp.",
    .mlp = kHfMlp,
    .router = "router",
    .router_bias = nullptr,
    .shared_expert = nullptr,
    .shared_expert_gate = nullptr,
    .gate = GateKind::kSoftmaxTopK,
    .activation = ExpertActivation::kClampedSwiGlu,
    .router_logits_bias = "router.bias",
    .stacked_experts = true,
};

}  // namespace pw::engine
