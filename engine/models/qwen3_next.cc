// qwen3_next (transformers Qwen3NextForCausalLM; Qwen3-Next-80B-A3B): a hybrid of Gated DeltaNet
// linear attention (linear_attn.*, in the layers ModelConfig::linear_attention marks) and full
// attention with an output gate (q_proj twice as wide), per-head qk norm and partial rotary
// (model_config.cc); RMSNorm weights zero-centred, (1 + w); softmax top-k routing renormalised
// with norm_topk_prob; SwiGLU experts; a shared expert behind a sigmoid gate; dense layers from
// mlp_only_layers / decoder_sparse_step. The mtp.* tensors are not loaded.
#include "engine/models/family.h"

namespace pw::engine {

namespace {

constexpr GatedDeltaNetNames kQwen3NextLinearAttention = {
    .prefix = "linear_attn.",
    .in_proj_qkvz = "in_proj_qkvz",
    .in_proj_ba = "in_proj_ba",
    .in_proj_qkv = nullptr,
    .in_proj_z = nullptr,
    .in_proj_b = nullptr,
    .in_proj_a = nullptr,
    .conv1d = "conv1d",
    .dt_bias = "dt_bias",
    .a_log = "A_log",
    .norm = "norm",
    .out_proj = "out_proj",
};

}  // namespace

extern constinit const ModelFamily kQwen3NextFamily = {
    .type = ModelType::kQwen3Next,
    .model_type = "qwen3_next",
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
    .linear_attention = &kQwen3NextLinearAttention,
    .zero_centred_norm = true,
    .attention_output_gate = true,
};

}  // namespace pw::engine
