// gemma4_text (transformers Gemma4TextModel with enable_moe_block: the language model of
// Gemma-4 26B-A4B, served text-only from the multimodal gemma4 checkpoint too): sandwich norms
// (every block's output normed before its residual add), a dense gelu-tanh MLP beside 128-way
// stacked experts (gate_up [E, 2I, H], common/formats/stacked_experts.h) in every layer, the
// router on its own RMS-normed and scaled input with a per-expert weight factor, q/k norms and
// an unscaled v norm, attention scale 1, sliding and full layers with their own RoPE, scaled
// embeddings and logit soft-capping (model_config.cc).
#include "engine/models/family.h"

namespace pw::engine {

namespace {

constexpr SandwichNames kGemma4Sandwich = {
    .attn_out_norm = "post_attention_layernorm",
    .ffn_out_norm = "post_feedforward_layernorm",
    .dense_out_norm = "post_feedforward_layernorm_1",
    .experts_in_norm = "pre_feedforward_layernorm_2",
    .experts_out_norm = "post_feedforward_layernorm_2",
    .router_scale = "router.scale",
    .expert_scale = "router.per_expert_scale",
    .layer_scalar = "layer_scalar",
};

}  // namespace

extern constinit const ModelFamily kGemma4Family = {
    .type = ModelType::kGemma4,
    .model_type = "gemma4_text",
    .embed = kHfEmbed,
    .final_norm = kHfFinalNorm,
    .lm_head = kHfLmHead,
    .input_norm = "input_layernorm",
    .post_attn_norm = "pre_feedforward_layernorm",
    .attention = kHfAttention,
    .dense_mlp = "mlp.",
    .mlp = kHfMlp,
    .router = "router.proj",
    .router_bias = nullptr,
    .shared_expert = nullptr,
    .shared_expert_gate = nullptr,
    .gate = GateKind::kSoftmaxTopK,
    .activation = ExpertActivation::kGeluTanh,
    .text_of_wrapper = "gemma4",
    .stacked_experts = true,
    .sandwich = &kGemma4Sandwich,
};

}  // namespace pw::engine
