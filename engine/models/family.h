// ModelFamily: how one model family's checkpoint maps onto the shared layers.
//
// Each family is a file, engine/models/<model_type>.cc, defining one ModelFamily: the names of
// its tensors, the gate its MoE layers route with and the activation its experts apply. The
// table in family.cc registers them; Model::Load looks the config's type up (FindFamily) and
// loads every tensor by the names found here, so the loader and the layers name no family.
// What a family decides elsewhere:
//   - config.json's fields and defaults, the attention biases, the qk-norm kind and
//     norm_topk_prob: ModelConfig, parsed per model_type (common/formats/model_config.cc);
//   - the names of the MoE block and of the routed experts: the ExpertNaming table of
//     common/formats/checkpoint_experts.cc, which the broker reads too.
// docs/architecture.md ("Model families") has the recipe for adding one.
//
// Tensor names: whole-model tensors are full names; a layer's are relative to
// "model.layers.{l}.", a MoE block's to MoeBlockPrefix (checkpoint_experts.h); a matrix `m`
// is read as "{m}.weight" and its bias, when the config says there is one, as "{m}.bias".
#pragma once

#include <string_view>

#include "common/formats/model_config.h"
#include "engine/models/moe_kinds.h"

namespace pw::engine {

// The three matrices of a SwiGLU MLP: gate and up [F, H], down [H, F].
struct MlpNames {
  const char* gate;
  const char* up;
  const char* down;
};

struct AttentionNames {
  const char* prefix;  // of every name below, e.g. "self_attn."
  const char* q;       // [nh*D, H] (+ bias when config.qkv_bias)
  const char* k;       // [nkv*D, H] (+ bias when config.qkv_bias)
  const char* v;       // [nkv*D, H] (+ bias when config.qkv_bias)
  const char* o;       // [H, nh*D] (+ bias when config.o_bias)
  const char* q_norm;  // read when config.qk_norm != kNone: [D] per head, [nh*D] full
  const char* k_norm;  // likewise [D] or [nkv*D]
  const char* sinks = nullptr;  // [nh] attention sinks, read when config.attention_sinks
};

// The tensors of a multi-head latent attention layer (deepseek_v3; common/formats/mla_config.h),
// relative to `prefix`; r = kv_lora_rank, qk = qk_nope_head_dim + qk_rope_head_dim.
struct MlaNames {
  const char* prefix;          // e.g. "self_attn."
  const char* q;               // [nh*qk, H] when q_lora_rank is null
  const char* q_a;             // [q_lora_rank, H] (+ bias when config.qkv_bias)
  const char* q_a_norm;        // [q_lora_rank]
  const char* q_b;             // [nh*qk, q_lora_rank]
  const char* kv_a;            // [r + qk_rope_head_dim, H] (+ bias when config.qkv_bias)
  const char* kv_a_norm;       // [r]
  const char* kv_b;            // [nh*(qk_nope_head_dim + v_head_dim), r]: per head k_nope, v
  const char* o;               // [H, nh*v_head_dim] (+ bias when config.o_bias)
};

// The tensors of a Gated DeltaNet (linear-attention) layer, relative to `prefix`: the input
// projections fused per key head (qwen3_next) or split (qwen3_5_moe_text), one pair null.
struct GatedDeltaNetNames {
  const char* prefix;        // e.g. "linear_attn."
  const char* in_proj_qkvz;  // fused: [2*nk*dk + 2*nv*dv, H], per key head q, k, v, z
  const char* in_proj_ba;    // fused: [2*nv, H], per key head b, a
  const char* in_proj_qkv;   // split: [2*nk*dk + nv*dv, H], all q, all k, all v
  const char* in_proj_z;     // split: [nv*dv, H]
  const char* in_proj_b;     // split: [nv, H]
  const char* in_proj_a;     // split: [nv, H]
  const char* conv1d;        // [conv_dim, 1, K] depthwise, no bias
  const char* dt_bias;       // [nv], a full name (no ".weight")
  const char* a_log;         // [nv], a full name
  const char* norm;          // [dv] gated RMSNorm
  const char* out_proj;      // [H, nv*dv]
};

// A Gemma-4 layer's other tensors (gemma4): each block's output normed before its residual
// add, a dense MLP beside the experts, the router reading its own normed and scaled copy of
// the residual, the layer's output times a learned scalar. Relative to "model.layers.{l}.";
// norms [H] ("{name}.weight"), the others full names.
struct SandwichNames {
  const char* attn_out_norm;     // on attention's output (post_attention_layernorm)
  const char* ffn_out_norm;      // on the dense + experts sum (post_feedforward_layernorm)
  const char* dense_out_norm;    // on the dense MLP's output (post_feedforward_layernorm_1)
  const char* experts_in_norm;   // the experts' input (pre_feedforward_layernorm_2)
  const char* experts_out_norm;  // on the experts' output (post_feedforward_layernorm_2)
  const char* router_scale;      // [H] on the router's RMS-normed input (router.scale)
  const char* expert_scale;      // [E] each expert's weight factor (router.per_expert_scale)
  const char* layer_scalar;      // [1] the layer's output factor
};

struct ModelFamily {
  ModelType type;
  const char* model_type;  // config.json's model_type

  // Whole-model tensors.
  const char* embed;       // [V, H]
  const char* final_norm;  // [H]
  const char* lm_head;     // [V, H]; absent with tie_word_embeddings: embed is reused

  // Per layer.
  const char* input_norm;      // [H], before attention
  const char* post_attn_norm;  // [H], before the MLP or MoE block
  AttentionNames attention;
  const char* dense_mlp;  // prefix of a dense (non-MoE) layer's MLP, e.g. "mlp."
  MlpNames mlp;           // the matrices of a dense MLP and of the shared expert

  // MoE block.
  const char* router;              // [E, H]
  const char* router_bias;         // [E] selection bias (kSigmoidGroupedTopK); nullptr: none
  const char* shared_expert;       // prefix of the shared expert's MLP; nullptr: none
  const char* shared_expert_gate;  // [1, H], its sigmoid gate; nullptr: added ungated
  GateKind gate;
  ExpertActivation activation;

  // Hybrids: the tensors of a linear-attention layer (ModelConfig::linear_attention says which
  // layers); nullptr: the family has none.
  const GatedDeltaNetNames* linear_attention = nullptr;
  // Multi-head latent attention in every layer instead of `attention` (ModelConfig::mla);
  // nullptr: the family has none.
  const MlaNames* latent_attention = nullptr;
  // The RMSNorm weights (input, post-attention, final, q/k norm) are stored zero-centred: the
  // norm multiplies by (1 + w). The loader adds the 1.
  bool zero_centred_norm = false;
  // q_proj is twice as wide: per head the query then a gate, and the attention output is
  // multiplied by sigmoid(gate) before o_proj.
  bool attention_output_gate = false;
  // The multimodal wrapper whose checkpoint is served text-only (config.json's top-level
  // model_type around this family's text_config; its tensors under
  // ModelConfig::weights_prefix, the others, e.g. model.visual.*, skipped); nullptr: none.
  const char* text_of_wrapper = nullptr;
  // [E] bias added to the router logits before the gate (gpt_oss "router.bias"); nullptr: none.
  const char* router_logits_bias = nullptr;
  // The routed experts are stacked tensors (common/formats/stacked_experts.h, the layout of the
  // config's type), not per-expert matrices named by ExpertNaming.
  bool stacked_experts = false;
  // Gemma-4's layer (SandwichNames); nullptr: the plain pre-norm layer. The norm before the
  // dense MLP is post_attn_norm, the dense MLP dense_mlp (run in MoE layers too).
  const SandwichNames* sandwich = nullptr;
};

// The names most Hugging Face MoE families share (Llama's layout). Names starting "model." are
// read under ModelConfig::weights_prefix ("model.language_model.embed_tokens.weight" in a
// multimodal checkpoint).
inline constexpr const char* kHfEmbed = "model.embed_tokens.weight";
inline constexpr const char* kHfFinalNorm = "model.norm.weight";
inline constexpr const char* kHfLmHead = "lm_head.weight";
inline constexpr AttentionNames kHfAttention = {"self_attn.", "q_proj", "k_proj", "v_proj",
                                                "o_proj",     "q_norm", "k_norm"};
inline constexpr MlpNames kHfMlp = {"gate_proj", "up_proj", "down_proj"};

// The registered family of `type` / of config.json's `model_type` string; nullptr when none is.
const ModelFamily* FindFamily(ModelType type);
const ModelFamily* FindFamily(std::string_view model_type);

}  // namespace pw::engine
