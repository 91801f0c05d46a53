// Model: a loaded checkpoint of a supported MoE family (qwen2_moe, qwen3_moe, olmoe, mixtral,
// glm4_moe, qwen3_next, qwen3_5_moe_text, gpt_oss, gemma4_text, deepseek_v3 and kimi_k2).
//
// Tensor names and shapes follow each type's Hugging Face transformers modeling code (H =
// hidden_size, D = head_dim, nh/nkv = query/kv heads, E = experts, I = expert FFN size,
// V = vocab). The loader reads them from the family's description (engine/models/family.h,
// one file per family); with prefix P = "model.layers.{l}.":
//   model.embed_tokens.weight [V, H]; model.norm.weight [H]; lm_head.weight [V, H] (absent
//     when tie_word_embeddings: the embedding matrix is reused)
//   P input_layernorm.weight [H]; P post_attention_layernorm.weight [H]
//   P self_attn.{q,k,v,o}_proj.weight [nh*D, H], [nkv*D, H], [nkv*D, H], [H, nh*D]
//     + .bias on q/k/v when qkv_bias, on o when o_bias
//   P self_attn.{q,k}_norm.weight  [D] (per head, qwen3_moe) or [nh*D] / [nkv*D] (olmoe)
//   MoE layer, qwen types and olmoe: P mlp.gate.weight [E, H];
//     P mlp.experts.{e}.{gate_proj,up_proj}.weight [I, H], .down_proj.weight [H, I]
//   MoE layer, mixtral: P block_sparse_moe.gate.weight [E, H];
//     P block_sparse_moe.experts.{e}.{w1,w3}.weight [I, H] (gate, up), .w2.weight [H, I]
//   qwen2_moe shared expert: P mlp.shared_expert.{gate,up,down}_proj.weight,
//     P mlp.shared_expert_gate.weight [1, H]
//   dense layer (qwen types, per decoder_sparse_step / mlp_only_layers):
//     P mlp.{gate,up,down}_proj.weight with intermediate_size
//   glm4_moe: P mlp.gate.weight [E, H] and P mlp.gate.e_score_correction_bias [E]; routed
//     experts as the qwen types; P mlp.shared_experts.{gate,up,down}_proj.weight of
//     n_shared_experts * moe_intermediate_size (no gate); dense layers (below
//     first_k_dense_replace) as the qwen types. Tensors of the MTP layers stored after the last
//     (model.layers.{num_hidden_layers + i}.*) are not read.
//   qwen3_next: a linear-attention layer has P linear_attn.{in_proj_qkvz, in_proj_ba, conv1d,
//     norm, out_proj}.weight, P linear_attn.{dt_bias, A_log} (GatedDeltaNetWeights) and no
//     self_attn.*; a full-attention layer's q_proj is [2*nh*D, H]; MoE as qwen2_moe.
//   deepseek_v3: P self_attn.{q_a_proj [q_lora, H], q_a_layernorm [q_lora], q_b_proj
//     [nh*(nope+rope), q_lora]} or P self_attn.q_proj [nh*(nope+rope), H] (q_lora_rank null),
//     P self_attn.kv_a_proj_with_mqa [kv_lora + rope, H], P self_attn.kv_a_layernorm [kv_lora],
//     P self_attn.kv_b_proj [nh*(nope+v), kv_lora], P self_attn.o_proj [H, nh*v] (MlaWeights);
//     MoE, shared experts and dense layers as glm4_moe. FP8 checkpoints: F8_E4M3 matrices with
//     X.weight_scale_inv beside them, dequantized to bf16 at load.
//   gpt_oss: q/k/v/o with biases, P self_attn.sinks [nh]; P mlp.router.{weight [E, H], bias [E]};
//     stacked experts P mlp.experts.* (common/formats/stacked_experts.h: bf16 / f16 / f32 or
//     MXFP4, with biases), copied at load into per-expert bf16 matrices.
//   gemma4_text: P input_layernorm, post_attention_layernorm (on attention's output),
//     pre_feedforward_layernorm, post_feedforward_layernorm{,_1,_2}, pre_feedforward_layernorm_2
//     [H]; P self_attn.{q,k}_norm [D] (no v_proj in full layers with attention_k_eq_v; a full
//     layer of its own shape has its D and nkv in every attention tensor: global_head_dim,
//     num_global_key_value_heads, ModelConfig::LayerHeadDim / LayerKvHeads);
//     P mlp.{gate,up,down}_proj (dense, every layer); P router.{proj.weight [E, H], scale [H],
//     per_expert_scale [E]}; stacked P experts.gate_up_proj [E, 2I, H], experts.down_proj
//     [E, H, I]; P layer_scalar [1]. In a gemma4 checkpoint under model.language_model.
// BF16 matrices stay in the mmapped file, read in place; F16 and F32 ones (fp16 / fp32
// checkpoints) are rounded to bf16 at load into Model-owned memory (common/formats/bf16_tensor.h);
// norms and biases may be BF16, F16 or F32 (converted to fp32 at load). A missing or mis-shaped
// tensor is an error naming the tensor and the directory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/model_config.h"
#include "common/formats/safetensors.h"
#include "common/status.h"
#include "engine/models/rope.h"
#include "engine/models/family.h"
#include "engine/models/moe_kinds.h"
#include "common/dense_format.h"
#include "kernels/anyprec/dense_ap.h"
#include "kernels/anyprec/q8.h"
#include "kernels/cpu/packed_bf16.h"

namespace pw::engine {

// A bf16 row-major matrix [rows, cols] (non-owning; data in the mmapped checkpoint or in
// Model-owned memory when the file's copy was not 2-byte aligned).
struct Bf16Matrix {
  const uint16_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  // With int8, any-precision or packed bf16 dense weights (Model::QuantizeDense): the copy the
  // forward pass reads instead of `data` (at most one is set).
  const anyprec::Q8Matrix* q8 = nullptr;
  const anyprec::DenseApMatrix* ap = nullptr;
  const cpu::PackedBf16Matrix* packed = nullptr;
};

// A SwiGLU MLP: down(silu(gate x) * up x).
struct MlpWeights {
  Bf16Matrix gate;  // [F, H]
  Bf16Matrix up;    // [F, H]
  Bf16Matrix down;  // [H, F]
};

// A Gated DeltaNet layer (linear attention; engine/layers/gated_delta_net.h), nk/nv key/value
// heads of dk/dv, r = nv / nk value heads per key head, C = conv_dim, K = conv kernel.
struct GatedDeltaNetWeights {
  // The input projections, fused per key head or split (GatedDeltaNetNames): one set is read.
  bool split = false;
  Bf16Matrix in_proj_qkvz;      // [2*nk*dk + 2*nv*dv, H]: per key head q dk, k dk, v r*dv, z r*dv
  Bf16Matrix in_proj_ba;        // [2*nv, H]: per key head b r, a r
  Bf16Matrix in_proj_qkv;       // [C, H]: the conv's channels in order
  Bf16Matrix in_proj_z;         // [nv*dv, H]
  Bf16Matrix in_proj_b;         // [nv, H]
  Bf16Matrix in_proj_a;         // [nv, H]
  std::vector<float> conv;      // [C][K] over the channels q (nk*dk), k (nk*dk), v (nv*dv)
  std::vector<float> dt_bias;   // [nv]
  std::vector<float> a_log;     // [nv]
  std::vector<float> norm;      // [dv], gated RMSNorm (not zero-centred)
  Bf16Matrix out_proj;          // [H, nv*dv]
};

// A multi-head latent attention layer (MlaConfig; nh heads, r = kv_lora_rank, qk =
// qk_nope_head_dim + qk_rope_head_dim, v = v_head_dim).
struct MlaWeights {
  Bf16Matrix q;                     // [nh*qk, H] when q_lora_rank is 0
  Bf16Matrix q_a;                   // [q_lora_rank, H]
  std::vector<float> q_a_bias;      // [q_lora_rank] with attention_bias; else empty
  std::vector<float> q_a_norm;      // [q_lora_rank]
  Bf16Matrix q_b;                   // [nh*qk, q_lora_rank]
  Bf16Matrix kv_a;                  // [r + qk_rope_head_dim, H]
  std::vector<float> kv_a_bias;     // with attention_bias; else empty
  std::vector<float> kv_a_norm;     // [r]
  Bf16Matrix kv_b;                  // [nh*(qk_nope_head_dim + v), r]: per head W_UK then W_UV
  // W_UK transposed per head, [nh*r, qk_nope_head_dim] (a Model-owned copy): row h*r + j is
  // column j of head h's W_UK, so the absorbed query q_nope^T W_UK is one product per head.
  Bf16Matrix uk_t;
  Bf16Matrix o;                     // [H, nh*v]
  std::vector<float> o_bias;        // [H] with attention_bias; else empty
};

struct LayerWeights {
  std::vector<float> input_norm;      // [H]
  std::vector<float> post_attn_norm;  // [H]
  // A linear-attention layer (ModelConfig::linear_attention) has `linear` and no q/k/v/o.
  bool is_linear_attention = false;
  GatedDeltaNetWeights linear;
  // A multi-head latent attention layer (family.latent_attention) has `mla` and no q/k/v/o.
  bool is_mla = false;
  MlaWeights mla;
  // With the family's attention_output_gate, q is [2*nh*D, H]: per head the query, then a gate.
  Bf16Matrix q, k, v, o;
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // empty when the model has none
  std::vector<float> q_norm, k_norm;                  // empty when qk_norm == kNone
  std::vector<float> sinks;  // [nh] attention sinks (config.attention_sinks); else empty
  int sliding_window = 0;    // positions this layer attends to (IsSlidingLayer); 0: all
  bool is_moe = false;
  // MoE layer.
  GateKind gate = GateKind::kSoftmaxTopK;                   // the family's (moe_kinds.h)
  ExpertActivation activation = ExpertActivation::kSwiGlu;  // the family's
  Bf16Matrix router;                                        // [E, H]
  std::vector<float> router_bias;  // [E] selection-only bias (family.router_bias); else empty
  std::vector<MlpWeights> experts;                          // [E]
  std::vector<float> router_logits_bias;  // [E] added to the logits (family); else empty
  // Expert biases (stacked experts): [E, 2I] gate then up per expert, [E, H]; else empty.
  std::vector<float> expert_gate_up_bias, expert_down_bias;
  bool has_shared_expert = false;  // the family has one and the config gives it a size
  MlpWeights shared_expert;
  Bf16Matrix shared_expert_gate;  // [1, H]; data null when the family adds it ungated
  // Dense layer (and, with the family's sandwich, the dense MLP beside the experts).
  MlpWeights mlp;
  // The family's sandwich (SandwichNames; gemma4), else empty: norms [H] on attention's output,
  // on the feed-forward sum, on the dense MLP's output, of the experts' input and on their output;
  // the router's input scale [H] (router.scale x hidden^-0.5, on the RMS-normed residual); each
  // expert's weight factor [E]; the layer's output factor.
  std::vector<float> attn_out_norm, ffn_out_norm, dense_out_norm, experts_in_norm, experts_out_norm;
  std::vector<float> router_input_scale;
  std::vector<float> expert_weight_scale;
  float layer_scalar = 1.f;
};

class Model {
 public:
  // Loads `dir`/config.json and the checkpoint (mapped, or copied into the process: `load`),
  // by the names of the config's registered family (kUnsupported when it has none). Errors
  // name the file and the field or tensor.
  static Result<std::unique_ptr<Model>> Load(const std::string& dir, FileLoad load = FileLoad::kMap);

  const ModelConfig& config() const { return config_; }
  const ModelFamily& family() const { return *family_; }
  const std::string& dir() const { return dir_; }
  const Bf16Matrix& embed() const { return embed_; }
  const Bf16Matrix& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  // RoPE inverse frequencies [rotary_dim / 2], computed in fp32 as HF does, and the cos/sin
  // multiplier, for passes within max_position_embeddings (engine/models/rope.h: dynamic NTK
  // recomputes them for longer ones).
  const std::vector<float>& rope_inv_freq() const { return rope_.inv_freq; }
  const RopeTable& rope() const { return rope_; }
  // The sliding layers' own table (config.sliding_rope, gemma4); else empty.
  const RopeTable& sliding_rope() const { return sliding_rope_; }

  // Gives the dense matrices the forward pass reads once per token (attention q/k/v/o,
  // lm_head, dense and shared-expert MLPs) a copy in `dense` (common/dense_format.h),
  // the lm_head one in `lm_head` (kAsDense: the same), used from then on instead of bf16: int8
  // with one scale per row (kernels/anyprec/q8.h), any-precision codes at one width fitted
  // on `threads` threads (kernels/anyprec/dense_ap.h), or the bf16 values packed losslessly
  // (kernels/cpu/packed_bf16.h; a matrix whose packed form would not be smaller stays bf16). The router, the embeddings and the
  // routed experts (their own providers) stay as they are, and so do a hybrid's
  // linear-attention projections: int8 rows there moved the fixtures' logits by 0.27-0.30
  // relative (attention's q/k/v/o by 0.01-0.05 each), the delta rule's L2-normalised keys and
  // its recurrence amplifying the rounding. MLA's kv_b (absorbed per head) stays bf16. int8
  // values span anyprec::DenseQ8Range (63 on AVX2, 127 with AVX-512, or the
  // kernels.dense_q8_max knob's). Called once; a second call is an error.
  Status QuantizeDense(DenseFormat dense, DenseFormat lm_head, int threads);
  // Gives every routed expert's gate, up and down a packed copy of its bf16 values
  // (kernels/cpu/packed_bf16.h: lossless, ~0.75x the bytes), made on `threads` threads; the
  // checkpoint's provider (engine/experts/bf16_expert_provider.h) multiplies those from then
  // on. Called at most once; a matrix whose packed form would not be smaller stays bf16.
  Status PackExperts(int threads);
  // The bytes the packed experts take (0 before PackExperts).
  uint64_t packed_expert_bytes() const { return packed_expert_bytes_; }
  // The formats QuantizeDense gave (kBf16 before it).
  DenseFormat dense_format() const { return dense_format_; }
  DenseFormat lm_head_format() const { return lm_head_format_; }

 private:
  Model() = default;
  Status LoadTensors();
  Result<Bf16Matrix> Matrix(const std::string& name, int64_t rows, int64_t cols);
  Result<std::vector<float>> Vector(const std::string& name, int64_t n);
  // A norm, bias or small tensor of any shape as fp32 (row-major).
  Result<std::vector<float>> Floats(const std::string& name, const std::vector<int64_t>& shape);
  Status LoadGatedDeltaNet(const std::string& prefix, GatedDeltaNetWeights* w);
  Status LoadMla(const std::string& prefix, MlaWeights* w);
  Result<MlpWeights> Mlp(const std::string& prefix, const MlpNames& names, int64_t ffn);
  // A whole-model tensor's name (family.h: "model.x" is read under config.weights_prefix).
  std::string Whole(const char* name) const;
  // Layer l's stacked experts (family.stacked_experts), into Model-owned bf16 matrices.
  Status StackedExperts(int64_t l, const std::string& block, LayerWeights* w);
  // Layer l's tensors of the family's sandwich (family.h), `p` its prefix.
  Status LoadSandwich(int64_t l, const std::string& p, LayerWeights* w);
  // Keeps the packed copy m of *w in *owner and points w at it when m is smaller than the bf16
  // rows; returns the bytes *w is read from either way.
  static size_t KeepIfSmaller(cpu::PackedBf16Matrix m, Bf16Matrix* w,
                              std::vector<std::unique_ptr<cpu::PackedBf16Matrix>>* owner);
  // A Model-owned copy of `values` as a [rows, cols] matrix.
  Bf16Matrix Own(const std::vector<uint16_t>& values, int64_t rows, int64_t cols);

  std::string dir_;
  ModelConfig config_;
  const ModelFamily* family_ = nullptr;  // registered, never null after Load
  std::unique_ptr<Checkpoint> ckpt_;
  std::vector<std::unique_ptr<uint16_t[]>> owned_;  // realigned copies
  Bf16Matrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  RopeTable rope_;
  RopeTable sliding_rope_;
  struct Q8Copy {
    std::vector<int8_t> values;
    std::vector<float> scales;
    anyprec::Q8Matrix m;
  };
  std::vector<std::unique_ptr<Q8Copy>> q8_;
  std::vector<std::unique_ptr<anyprec::DenseApMatrix>> ap_;
  std::vector<std::unique_ptr<cpu::PackedBf16Matrix>> packed_;
  DenseFormat dense_format_ = DenseFormat::kBf16;
  DenseFormat lm_head_format_ = DenseFormat::kBf16;
  bool dense_done_ = false;
  std::vector<std::unique_ptr<cpu::PackedBf16Matrix>> packed_experts_;
  uint64_t packed_expert_bytes_ = 0;
};

}  // namespace pw::engine
