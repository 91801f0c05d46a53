// qwen3_5_moe_text (transformers Qwen3_5MoeTextModel: the language model of Qwen3.5-MoE, the
// text_config of a qwen3_5_moe checkpoint): qwen3_next's hybrid (Gated DeltaNet and
// output-gated full attention, zero-centred norms, a sigmoid-gated shared expert) with the
// linear layers' input projections split (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a), top-k
// weights always renormalised and every layer MoE (model_config.cc). The multimodal checkpoint
// is served text-only: its language model's tensors under "model.language_model.", the vision
// tower's (model.visual.*) skipped with a log line.
#include "engine/models/family.h"

namespace pw::engine {

namespace {

constexpr GatedDeltaNetNames kQwen35MoeLinearAttention = {
    .prefix = "linear_attn.",
    .in_proj_qkvz = nullptr,
    .in_proj_ba = nullptr,
    .in_proj_qkv = "in_proj_qkv",
    .in_proj_z = "in_proj_z",
    .in_proj_b = "in_proj_b",
    .in_proj_a = "in_proj_a",
    .conv1d = "conv1d",
    .dt_bias = "dt_bias",
    .a_log = "A_log",
    .norm = "norm",
    .out_proj = "out_proj",
};

}  // namespace

extern constinit const ModelFamily kQwen35MoeFamily = {
    .type = ModelType::kQwen35Moe,
    .model_type = "qwen3_5_moe_text",
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
    .linear_attention = &kQwen35MoeLinearAttention,
    .zero_centred_norm = true,
    .attention_output_gate = true,
    .text_of_wrapper = "qwen3_5_moe",
};

}  // namespace pw::engine
