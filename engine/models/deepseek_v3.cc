// deepseek_v3 (transformers DeepseekV3ForCausalLM; DeepSeek-V3, DeepSeek-R1, and Kimi-K2, whose
// config.json says model_type kimi_k2 over this architecture): multi-head latent attention in
// every layer (MlaNames; the KV cache keeps the latent and the RoPE key, memory/kv_spec.h
// kLatent, and attention runs in the absorbed form, engine/runner/cpu_runner.h); sigmoid
// routing with e_score_correction_bias for selection only and grouped top-k
// (GateKind::kSigmoidGroupedTopK, as glm4_moe); SwiGLU experts; n_shared_experts shared experts
// as one ungated MLP; dense layers below first_k_dense_replace. The MTP layers stored after the
// last (num_nextn_predict_layers) are not loaded. FP8 block-scaled checkpoints are dequantized
// at load (common/formats/bf16_tensor.h).
#include "engine/models/family.h"

namespace pw::engine {

namespace {
constexpr MlaNames kDeepseekMla = {
    .prefix = "self_attn.",
    .q = "q_proj",
    .q_a = "q_a_proj",
    .q_a_norm = "q_a_layernorm",
    .q_b = "q_b_proj",
    .kv_a = "kv_a_proj_with_mqa",
    .kv_a_norm = "kv_a_layernorm",
    .kv_b = "kv_b_proj",
    .o = "o_proj",
};
}  // namespace

extern constinit const ModelFamily kDeepseekV3Family = {
    .type = ModelType::kDeepseekV3,
    .model_type = "deepseek_v3",
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
    .latent_attention = &kDeepseekMla,
};

}  // namespace pw::engine
