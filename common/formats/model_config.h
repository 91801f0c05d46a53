// ModelConfig: the architecture of a supported MoE checkpoint, read from its config.json.
//
// Supported model_type values and how each one maps (following the Hugging Face transformers
// configuration and modeling classes of each type, including their defaults):
//   qwen2_moe  experts: num_experts; expert FFN: moe_intermediate_size; norm_topk_prob from the
//              file (default false); shared expert with a sigmoid gate; q/k/v bias: qkv_bias
//              (default true), no o_proj bias; no qk norm; head_dim: file or hidden/heads;
//              dense layers from mlp_only_layers and decoder_sparse_step.
//   qwen3_moe  as qwen2_moe but no shared expert; attention_bias (default false) on q/k/v/o;
//              qk norm per head (weights [head_dim]).
//   olmoe      experts: num_experts; expert FFN: intermediate_size; norm_topk_prob from the file
//              (default false); attention_bias on q/k/v/o; qk norm over the whole q and k
//              projections; head_dim always hidden/heads; optional clip_qkv; no dense layers.
//   mixtral    experts: num_local_experts; expert FFN: intermediate_size; top-k weights always
//              renormalised; no biases; no qk norm; head_dim: file or hidden/heads.
//   glm4_moe   experts: n_routed_experts; expert FFN: moe_intermediate_size; sigmoid routing with
//              e_score_correction_bias, grouped top-k (n_group, topk_group, default 1 and 1),
//              norm_topk_prob (default true), routed_scaling_factor (default 1); n_shared_experts
//              (default 1) shared experts of moe_intermediate_size each, no gate; dense layers
//              below first_k_dense_replace (default 1) of intermediate_size; attention_bias
//              (default false) on q/k/v only; qk norm per head when use_qk_norm; RoPE over the
//              first partial_rotary_factor (default 0.5) of head_dim; head_dim: file or
//              hidden/heads; num_nextn_predict_layers MTP layers after the last, not run.
//   qwen3_next hybrid: layer_types (or every full_attention_interval-th layer, default 4) full
//              attention, the others Gated DeltaNet linear attention (linear_* fields,
//              LinearAttentionConfig); experts and dense layers as qwen2_moe (shared expert of
//              shared_expert_intermediate_size behind a sigmoid gate, norm_topk_prob default
//              true); attention_bias (default false) on q/k/v/o; qk norm per head; RoPE over
//              the first partial_rotary_factor (default 0.25) of head_dim.
//   qwen3_5_moe_text  (Qwen3.5-MoE's language model, the text_config of a qwen3_5_moe
//              checkpoint) as qwen3_next, but the top-k weights always renormalised, every
//              layer MoE, and RoPE's mrope_section / mrope_interleaved accepted (text only: the
//              three position axes are equal, so M-RoPE is plain RoPE); served from the
//              multimodal checkpoint (weights_prefix "model.language_model.").
//   deepseek_v3 (and kimi_k2, whose checkpoints declare the DeepseekV3ForCausalLM architecture)
//              MLA attention (MlaConfig: q_lora_rank, null for a direct q_proj; kv_lora_rank,
//              qk_nope_head_dim, qk_rope_head_dim, v_head_dim, rope_interleave default true;
//              head_dim = rotary_dim = qk_rope_head_dim, as HF); YaRN's mscale_all_dim scales
//              the softmax; attention_bias on q_a_proj, kv_a_proj_with_mqa and o_proj; experts
//              and routing as glm4_moe with DeepSeek-V3's defaults (n_group 8, topk_group 4,
//              routed_scaling_factor 2.5, first_k_dense_replace 3, intermediate_size 18432);
//              moe_layer_freq (default 1): a layer at or past first_k_dense_replace is MoE when
//              its index is a multiple of it (DeepSeek's rule; HF ignores the field, every
//              released checkpoint has 1). FP8 checkpoints (quantization_config quant_method
//              "fp8", fmt e4m3, weight_block_size [rows, cols]): weights float8_e4m3fn with a
//              float32 weight_scale_inv per block, dequantized at load.
//   gpt_oss    experts: num_local_experts; expert FFN: intermediate_size; top-k of the router
//              logits (router bias added), softmax over the k (= norm_topk_prob); attention_bias
//              (default true) on q/k/v/o; per-head attention sinks; layer_types (one per layer,
//              "sliding_attention" or "full_attention"; absent: sliding on even layers, as HF)
//              with sliding_window (default 128); swiglu_alpha 1.702 and swiglu_limit 7 (the
//              only values served, others refused naming the field).
//   gemma4_text (Gemma-4's language model; the text_config of a gemma4 checkpoint, served
//              text-only from it) with enable_moe_block: every layer runs a dense MLP of
//              intermediate_size beside num_experts experts (top_k_experts, FFN
//              moe_intermediate_size), gelu_pytorch_tanh, top-k weights renormalised;
//              layer_types (default: every 6th layer full, the last full) sliding_window
//              (default 512) / full attention with their own rope_parameters (per layer type:
//              "default" or "proportional"), q/k norm per head, an unscaled v norm, attention
//              scale 1, embeddings x sqrt(hidden), final_logit_softcapping, tied embeddings by
//              default; attention_k_eq_v (full layers' values are their keys' projection).
//              Full layers of their own shape: global_head_dim (default 512) and, with
//              attention_k_eq_v, num_global_key_value_heads (absent: num_key_value_heads), or
//              the per_layer_config transformers 5 writes instead (head_dim and
//              num_key_value_heads per layer index; every full layer alike, every sliding
//              layer the top-level shape); the full layers' RoPE spans their own head_dim.
//              use_bidirectional_attention "vision" is causal on text (served text-only).
//              Refused, naming the field: enable_moe_block false, per-layer inputs
//              (hidden_size_per_layer_input, HF default 256), num_kv_shared_layers,
//              use_bidirectional_attention "all", attention_bias, another per_layer_config
//              key, hidden_activation other than gelu_pytorch_tanh.
//
// Structural dimensions are required (a missing one is an error, not a silent default):
// hidden_size, num_hidden_layers, num_attention_heads, vocab_size, the expert count,
// num_experts_per_tok and the expert FFN size. Everything else takes the type's HF default.
// Refused with kUnsupported: another model_type, hidden_act other than silu, sliding-window
// attention (use_sliding_window, 5.x layer_types other than "full_attention"; gpt_oss reads
// them), a RoPE type
// other than default/linear/dynamic/yarn/llama3.
//
// Files written by transformers 4.x and 5.x are both read. Where the two versions name a field
// differently, either name is accepted, and both present with different values is an error
// naming both (never one silently preferred):
//   expert count      num_experts | num_local_experts (5.x writes the latter for qwen3_moe)
//   RoPE              rope_parameters (5.x: {rope_type, rope_theta, factor, ...}) |
//                     rope_theta + rope_scaling (4.x; "type" for "rope_type")
//   dtype             dtype (5.x) | torch_dtype (4.x): bfloat16, float16 or float32
//   original context  original_max_position_embeddings top level | in the RoPE dict
// A multimodal wrapper (a top-level text_config whose model_type is supported) is read from its
// text_config; `wrapper_model_type` records the wrapper. A key of the RoPE dict that its type
// does not use is refused, as is partial_rotary_factor other than 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/formats/linear_attention_config.h"
#include "common/formats/mla_config.h"
#include "common/status.h"

namespace pw {

enum class ModelType {
  kQwen2Moe,
  kQwen3Moe,
  kOlmoe,
  kMixtral,
  kGlm4Moe,
  kQwen3Next,
  kQwen35Moe,
  kGptOss,
  kGemma4,
  kDeepseekV3,
};

// RoPE frequency scaling (HF transformers' rope_type; engine/models/rope.h computes it).
enum class RopeType {
  kDefault,  // inv_freq = theta^(-2i/d)
  kLinear,   // inv_freq / factor (position interpolation)
  kDynamic,  // NTK: theta grows with the sequence length once it passes max_position_embeddings
  kYarn,     // per-dimension blend of interpolation and extrapolation, cos/sin x attention_factor
  kLlama3,   // low frequencies / factor, high kept, a smooth band between
  // gemma4's full layers: rotate-half over all of head_dim, the first
  // partial_rotary_factor * head_dim / 2 pairs at theta^(-2i/head_dim) / factor, the rest at
  // frequency 0 (passed through).
  kProportional,
};

const char* RopeTypeName(RopeType t);  // "default", "linear", ...

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;                           // linear, dynamic, yarn, llama3
  int64_t original_max_position_embeddings = 0;  // yarn, llama3 (default: max_position_embeddings)
  // yarn: the cos/sin multiplier; absent in the file, derived from factor (and mscale,
  // mscale_all_dim when both are given) as HF does.
  double attention_factor = 1.0;
  double mscale_all_dim = 0;                 // yarn: 0 when absent (MLA's softmax scale)
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  bool truncate = true;                      // yarn: floor/ceil the correction range
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double proportion = 1.0;                               // proportional: partial_rotary_factor
};

// Normalisation applied to queries and keys after their projection, before RoPE.
enum class QkNorm {
  kNone,     // no q/k norm
  kPerHead,  // RMSNorm over each head's head_dim values (weights [head_dim]); qwen3_moe
  kFull,     // RMSNorm over the whole projection (q: [heads*head_dim], k: [kv_heads*head_dim]);
             // olmoe
};

const char* ModelTypeName(ModelType t);  // "qwen2_moe", ...

struct ModelConfig {
  ModelType type = ModelType::kQwen2Moe;
  std::string model_type;  // the string from config.json

  // Transformer body.
  int64_t hidden_size = 0;   // d_model
  int64_t num_layers = 0;    // num_hidden_layers
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (GQA); num_heads % num_kv_heads == 0
  int64_t head_dim = 0;      // per-head size; q_proj is [num_heads*head_dim, hidden_size]
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;       // RoPE base; rotary over all head_dim dims, NeoX (half) layout
  // The first rotary_dim dims of each head are rotated (NeoX layout within them), the rest pass
  // through: head_dim * partial_rotary_factor (glm4_moe); head_dim for the other types.
  int64_t rotary_dim = 0;
  bool tie_word_embeddings = false;  // lm_head reuses embed_tokens

  // Attention details.
  bool qkv_bias = false;  // q_proj/k_proj/v_proj have a bias
  bool o_bias = false;    // o_proj has a bias
  QkNorm qk_norm = QkNorm::kNone;
  std::optional<double> clip_qkv;  // olmoe: clamp q, k, v to [-clip, clip] after projection

  // Mixture of experts.
  int64_t num_experts = 0;            // routed experts per MoE layer
  int64_t num_experts_per_tok = 0;    // top-k
  int64_t moe_intermediate_size = 0;  // one expert's FFN size (gate/up: [ffn, hidden])
  bool norm_topk_prob = false;        // renormalise the top-k softmax probabilities to sum to 1
  int64_t shared_expert_intermediate_size = 0;  // 0 = no shared expert (qwen2_moe has one)
  // Dense-MLP layers (qwen2_moe / qwen3_moe): a layer is MoE iff it is not in mlp_only_layers and
  // (layer + 1) % decoder_sparse_step == 0; otherwise it is a dense SwiGLU MLP of
  // intermediate_size.
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  int64_t intermediate_size = 0;  // dense MLP size (qwen types); == expert size otherwise
  // glm4_moe: layers below first_k_dense_replace are dense MLPs of intermediate_size.
  int64_t first_k_dense_replace = 0;
  // Sigmoid routing (glm4_moe): experts split into n_group groups of num_experts / n_group; a
  // token keeps the topk_group groups with the largest sum of their two best selection scores
  // (sigmoid + e_score_correction_bias) and takes its top-k inside them; the weights are the
  // unbiased sigmoid scores (renormalised with norm_topk_prob) times routed_scaling_factor.
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  int64_t n_shared_experts = 0;  // glm4_moe: shared experts, one MLP of n * moe_intermediate_size
  int64_t num_nextn_predict_layers = 0;  // MTP layers stored after the last layer; never run
  // deepseek_v3: a layer at or past first_k_dense_replace is MoE iff layer % moe_layer_freq == 0.
  int64_t moe_layer_freq = 1;
  MlaConfig mla;  // deepseek_v3's attention; disabled (kv_lora_rank 0) for the other types
  // FP8 block-scaled weights (quantization_config quant_method "fp8"): the block of one
  // weight_scale_inv value, rows x cols; 0 x 0 when the checkpoint is not FP8.
  int64_t fp8_block_rows = 0, fp8_block_cols = 0;
  LinearAttentionConfig linear_attention;  // hybrids (qwen3_next); empty layers: none

  // Sliding-window attention (gpt_oss): a layer with layer_sliding[l] attends to the last
  // sliding_window positions (its own included), the others to every position. Empty: none.
  int64_t sliding_window = 0;
  std::vector<bool> layer_sliding;
  bool attention_sinks = false;  // gpt_oss: per-head learned logit, an extra softmax column

  // gemma4 (all off for the other types).
  // Sliding layers' own RoPE (rope_parameters.sliding_attention); the fields above
  // (rope_theta, rope_scaling) are the full layers'.
  bool sliding_rope = false;
  double sliding_rope_theta = 10000.0;
  RopeScaling sliding_rope_scaling;
  double attention_scale = 0;          // query-key scale; 0: 1 / sqrt(head_dim)
  bool v_norm = false;                 // values RMS-normed per head, without weights
  bool k_eq_v = false;                 // full layers have no v_proj: values are k_proj's output
  // The full-attention layers' own head size and kv-head count (gemma4's global_head_dim and
  // num_global_key_value_heads); 0: head_dim and num_kv_heads, as every other layer's.
  int64_t full_head_dim = 0;
  int64_t full_num_kv_heads = 0;
  bool scale_embeddings = false;       // embeddings x sqrt(hidden_size)
  double final_logit_softcapping = 0;  // logits = c * tanh(logits / c); 0: none

  // Special tokens (absent in the file: nullopt / empty).
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // config.json may give one id or a list
  std::optional<int64_t> pad_token_id;

  // transformers 4.x / 5.x details (see the top of this file).
  RopeScaling rope_scaling;         // kDefault unless the file scales RoPE
  std::string dtype;                // "bfloat16", "float16", "float32"; empty when absent
  std::string wrapper_model_type;   // a multimodal wrapper's model_type; empty when none
  // Where the language model's tensors are: "model." ("model.layers.{l}.", "model.norm"), or
  // "model.language_model." in a multimodal checkpoint served text-only (qwen3_5_moe).
  std::string weights_prefix = "model.";

  // The longest sequence the model serves by default: max_position_embeddings, times the
  // factor for dynamic NTK RoPE (which exists to run past it; vLLM's rule too).
  int64_t MaxContext() const;
  // True if `layer` (0-based) uses routed experts; false for a dense-MLP layer.
  bool IsMoeLayer(int64_t layer) const;
  // True if `layer` attends through the sliding window.
  bool IsSlidingLayer(int64_t layer) const {
    return layer >= 0 && static_cast<size_t>(layer) < layer_sliding.size() &&
           layer_sliding[static_cast<size_t>(layer)];
  }
  // Layer `layer`'s head size and kv-head count: a full-attention layer's own
  // (full_head_dim, full_num_kv_heads) where the config gives them, else head_dim and
  // num_kv_heads. Its query heads are always num_heads.
  int64_t LayerHeadDim(int64_t layer) const {
    return full_head_dim > 0 && !IsSlidingLayer(layer) ? full_head_dim : head_dim;
  }
  int64_t LayerKvHeads(int64_t layer) const {
    return full_num_kv_heads > 0 && !IsSlidingLayer(layer) ? full_num_kv_heads : num_kv_heads;
  }
  // The largest LayerHeadDim and LayerKvHeads * LayerHeadDim over the layers (buffer sizes).
  int64_t MaxHeadDim() const;
  int64_t MaxKvWidth() const;
  // Short human-readable summary ("olmoe: 2 layers, hidden 2048, 16/16 heads x 128, ...").
  std::string Summary() const;
};

// Parses config.json at `path`. Errors name the file and the field:
//   kNotFound / kIoError   the file cannot be read
//   kInvalidArgument       malformed JSON, a required field missing, a field of the wrong JSON
//                          type, or a value out of range / inconsistent (e.g. heads not divisible)
//   kUnsupported           unknown model_type, RoPE type or key, hidden_act, sliding window,
//                          dtype
Result<ModelConfig> LoadModelConfig(const std::string& path);
// Same, from JSON text; `label` stands for the file name in messages.
Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& label);

}  // namespace pw
