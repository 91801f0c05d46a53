// Random-weight MoE checkpoints at real dimensions, for speed measurements only.
//
// WriteSyntheticMoe writes <dir>/config.json and <dir>/model.safetensors in the Hugging Face
// layout of the chosen model type (tensor names and shapes as transformers saves them), so the
// engine loads it like any checkpoint. Weights are bf16: linear layers and embeddings drawn
// from a zero-mean, bell-shaped distribution with standard deviation `init_std` (0.02, the HF
// initializer_range), norm weights 1, biases 0 — an initialisation, so activations stay in a
// sane range through the layers. The output depends only on the spec (seed included); each
// tensor's stream is derived from the seed and the tensor name. No tokenizer is written: the
// benchmark feeds token ids directly.
#pragma once

#include <cstdint>
#include <string>

#include "common/formats/model_config.h"
#include "common/status.h"

namespace pw {

// Defaults: OLMoE-1B-7B's dimensions with 2 layers (about 2.1 GB of bf16).
struct SyntheticMoeSpec {
  ModelType type = ModelType::kOlmoe;
  int64_t layers = 2;
  int64_t hidden = 2048;
  int64_t heads = 16;
  int64_t kv_heads = 16;
  int64_t experts = 64;
  int64_t top_k = 8;
  int64_t expert_ffn = 1024;  // moe_intermediate_size / intermediate_size
  int64_t shared_ffn = 4096;  // qwen2_moe: shared_expert_intermediate_size; glm4_moe: the
                              // shared experts' width, a multiple of expert_ffn
                              // (n_shared_experts = shared_ffn / expert_ffn)
  // glm4_moe and deepseek_v3: the first dense_layers layers are dense MLPs of dense_ffn
  // (first_k_dense_replace, intermediate_size); routing groups (n_group, topk_group).
  // gemma4: every layer's dense MLP beside the experts is of dense_ffn.
  int64_t dense_layers = 0;
  int64_t dense_ffn = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  // deepseek_v3 only: MLA (common/formats/mla_config.h) over `heads` heads; q_lora_rank 0 is a
  // direct q_proj.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // qwen3_next only: Gated DeltaNet layers (all but every full_attention_interval-th) of
  // linear_key_heads / linear_value_heads heads of linear_head_dim (keys and values).
  int64_t full_attention_interval = 4;
  int64_t linear_key_heads = 0;
  int64_t linear_value_heads = 0;
  int64_t linear_head_dim = 0;
  // gemma4 only: the full layers' own head size and kv heads (global_head_dim,
  // num_global_key_value_heads), their values their keys' projection (attention_k_eq_v, no
  // v_proj); both 0: the sliding layers' shape, with a v_proj.
  int64_t full_head_dim = 0;
  int64_t full_kv_heads = 0;
  int64_t vocab = 50304;
  int64_t max_positions = 4096;
  uint64_t seed = 1;
  float init_std = 0.02f;
};

// GLM-4.5-Air (glm4_moe) at half its width and expert count, 2 layers (one dense, one MoE):
// hidden 2048, 16 heads of 128 (RoPE over 64), 2 kv heads, 64 experts top-8 of 704, one
// shared expert of 704, dense FFN 5472, vocab 151552; about 1.9 GB of bf16.
SyntheticMoeSpec Glm4MoeAirHalfSpec();
// DeepSeek-V3 (deepseek_v3) at a quarter of its width with its MLA head dimensions, 2 layers
// (one dense, one MoE): hidden 1792, 32 heads (q_lora_rank 384; kv_lora_rank 512, qk 128 + 64,
// v 128: the real model's latent KV of 576 values per token), 64 experts top-8 of 512 in 8
// groups keeping 4, one shared expert of 512, dense FFN 4608, vocab 129280, DeepSeek-V3's YaRN
// (factor 40, mscale = mscale_all_dim = 1); about 1.4 GB of bf16.
SyntheticMoeSpec DeepseekV3QuarterSpec();
// gpt-oss-20b's experts (32 of 2880 x 2880, top-4, with biases, stacked as transformers saves
// them) and vocabulary, 2 layers (sliding, full); its attention at the hidden width: 45 heads of
// 64, 9 kv heads (gpt-oss-20b: 64 query heads, 8 kv heads, q 4096 wide).
SyntheticMoeSpec GptOss20bSpec();

// Qwen3-Next-80B-A3B's layer at a quarter of its expert width, 4 layers (3 Gated DeltaNet, 1
// full attention): hidden 2048, 8 heads of 256 (output-gated, RoPE over 64), 2 kv heads, linear
// heads 16 key / 32 value of 128, 512 experts top-10 of 128 plus a gated shared expert of 512,
// vocab 151936; about 4.6 GB of bf16 (experts 805 MB a layer).
SyntheticMoeSpec Qwen3NextQuarterSpec();

// Gemma-4's MoE layout (gemma4_text with enable_moe_block: a dense gelu-tanh MLP of dense_ffn
// beside stacked routed experts in every layer, sandwich norms, 5 sliding layers to 1 full and
// the last full, RoPE per layer type, 256-wide heads, tied 262144-token vocabulary) at sizes
// chosen here, not read from a released config: 2 layers (sliding, full), hidden 2048, 8 heads,
// 4 kv heads of 256 on the sliding layer, 1 of 512 on the full one (attention_k_eq_v: half the
// sliding layer's KV, as Gemma-4-26B-A4B's 2 x 512 against 8 x 256), 128 experts top-8 of 512,
// dense FFN 2048; about 2.8 GB of bf16.
SyntheticMoeSpec Gemma4MoeSpec();

// `spec` with routed experts of width `expert_ffn`. glm4_moe and deepseek_v3 hold
// n_shared_experts = shared_ffn / expert_ffn shared experts of the routed width: as many of the
// new width.
SyntheticMoeSpec WithExpertFfn(SyntheticMoeSpec spec, int64_t expert_ffn);

// Total bytes of tensor data the spec produces (bf16).
uint64_t SyntheticMoeBytes(const SyntheticMoeSpec& spec);

// The config.json text for `spec` (accepted by LoadModelConfig).
std::string SyntheticMoeConfigJson(const SyntheticMoeSpec& spec);

// Writes config.json and model.safetensors into `dir` (created if missing). kInvalidArgument
// for an inconsistent spec (heads not dividing hidden, top_k > experts, ...); kIoError naming
// the path on write failure. Files are replaced atomically.
Status WriteSyntheticMoe(const SyntheticMoeSpec& spec, const std::string& dir);

}  // namespace pw
