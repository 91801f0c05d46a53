// MlaConfig: multi-head latent attention (DeepSeek-V2/V3's MLA), as config.json describes it.
//
// Per token, the hidden state is projected to a KV latent of kv_lora_rank values (RMSNorm'd by
// kv_a_layernorm) and one decoupled RoPE key of qk_rope_head_dim values shared by every head;
// kv_b_proj expands the latent to each head's no-RoPE key (qk_nope_head_dim) and value
// (v_head_dim). The query comes through a low-rank q_a_proj (q_lora_rank, with q_a_layernorm)
// and q_b_proj, or directly through q_proj when q_lora_rank is null; each head's query is
// qk_nope_head_dim then qk_rope_head_dim values. The KV cache keeps only the latent and the RoPE
// key (latent_dim() values per token per layer; memory/kv_spec.h kLatent).
#pragma once

#include <cstdint>

namespace pw {

struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: no low-rank query (q_proj)
  int64_t kv_lora_rank = 0;  // 0: the model has no MLA
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // RoPE pairs dims (2i, 2i+1) of the rope part (rope_interleave, HF's default) rather than
  // (i, i + half); HF rotates either way into the half layout.
  bool rope_interleave = true;
  // The attention softmax scale: qk_head_dim^-0.5, times mscale^2 when YaRN gives
  // mscale_all_dim (HF yarn_apply_mscale).
  double softmax_scale = 1.0;

  bool enabled() const { return kv_lora_rank > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Values the KV cache keeps per token and layer: the latent, then the RoPE key.
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

}  // namespace pw
