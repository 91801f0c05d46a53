#include "common/formats/synthetic_moe.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/dtype.h"
#include "common/hash.h"
#include "common/formats/checkpoint_experts.h"
#include "common/formats/safetensors.h"

namespace pw {
namespace {

enum class Init { kNormal, kOnes, kZeros };

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
};

// gemma4: HF's default layer types, every 6th layer and the last full.
bool Gemma4Sliding(const SyntheticMoeSpec& s, int64_t l) {
  return (l + 1) % 6 != 0 && l + 1 < s.layers;
}

std::vector<TensorSpec> Tensors(const SyntheticMoeSpec& s) {
  const int64_t hd = s.hidden / s.heads;
  const int64_t q = s.heads * hd, kv = s.kv_heads * hd;
  // qwen3_next: zero-centred norms (applied as 1 + w, HF initialises w to 0), a Gated DeltaNet
  // in all but every full_attention_interval-th layer, q_proj twice as wide (the output gate).
  const bool next = s.type == ModelType::kQwen3Next;
  const Init norm = next ? Init::kZeros : Init::kOnes;
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", {s.vocab, s.hidden}, Init::kNormal});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (s.type == ModelType::kGemma4) {
      // Gemma4TextDecoderLayer with enable_moe_block (engine/models/gemma4.cc).
      for (const char* n : {"input_layernorm", "post_attention_layernorm",
                            "pre_feedforward_layernorm", "post_feedforward_layernorm",
                            "post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                            "pre_feedforward_layernorm_2"}) {
        t.push_back({p + n + ".weight", {s.hidden}, Init::kOnes});
      }
      // A full layer of its own shape: its head size and kv heads, no v_proj (k_eq_v).
      const bool own = s.full_head_dim > 0 && !Gemma4Sliding(s, l);
      const int64_t d = own ? s.full_head_dim : hd;
      const int64_t lq = s.heads * d, lkv = (own ? s.full_kv_heads : s.kv_heads) * d;
      t.push_back({p + "self_attn.q_proj.weight", {lq, s.hidden}, Init::kNormal});
      t.push_back({p + "self_attn.k_proj.weight", {lkv, s.hidden}, Init::kNormal});
      if (!own) t.push_back({p + "self_attn.v_proj.weight", {lkv, s.hidden}, Init::kNormal});
      t.push_back({p + "self_attn.o_proj.weight", {s.hidden, lq}, Init::kNormal});
      t.push_back({p + "self_attn.q_norm.weight", {d}, Init::kOnes});
      t.push_back({p + "self_attn.k_norm.weight", {d}, Init::kOnes});
      t.push_back({p + "mlp.gate_proj.weight", {s.dense_ffn, s.hidden}, Init::kNormal});
      t.push_back({p + "mlp.up_proj.weight", {s.dense_ffn, s.hidden}, Init::kNormal});
      t.push_back({p + "mlp.down_proj.weight", {s.hidden, s.dense_ffn}, Init::kNormal});
      t.push_back({p + "router.proj.weight", {s.experts, s.hidden}, Init::kNormal});
      t.push_back({p + "router.scale", {s.hidden}, Init::kOnes});
      t.push_back({p + "router.per_expert_scale", {s.experts}, Init::kOnes});
      t.push_back({p + "experts.gate_up_proj", {s.experts, 2 * s.expert_ffn, s.hidden},
                   Init::kNormal});
      t.push_back({p + "experts.down_proj", {s.experts, s.hidden, s.expert_ffn}, Init::kNormal});
      t.push_back({p + "layer_scalar", {1}, Init::kOnes});
      continue;
    }
    t.push_back({p + "input_layernorm.weight", {s.hidden}, norm});
    t.push_back({p + "post_attention_layernorm.weight", {s.hidden}, norm});
    if (next && (l + 1) % s.full_attention_interval != 0) {
      const int64_t nk = s.linear_key_heads, nv = s.linear_value_heads, d = s.linear_head_dim;
      const std::string a = p + "linear_attn.";
      t.push_back({a + "in_proj_qkvz.weight", {2 * nk * d + 2 * nv * d, s.hidden}, Init::kNormal});
      t.push_back({a + "in_proj_ba.weight", {2 * nv, s.hidden}, Init::kNormal});
      t.push_back({a + "conv1d.weight", {2 * nk * d + nv * d, 1, 4}, Init::kNormal});
      t.push_back({a + "dt_bias", {nv}, Init::kOnes});
      t.push_back({a + "A_log", {nv}, Init::kZeros});
      t.push_back({a + "norm.weight", {d}, Init::kOnes});
      t.push_back({a + "out_proj.weight", {s.hidden, nv * d}, Init::kNormal});
    } else if (next) {
      t.push_back({p + "self_attn.q_proj.weight", {2 * q, s.hidden}, Init::kNormal});
      t.push_back({p + "self_attn.k_proj.weight", {kv, s.hidden}, Init::kNormal});
      t.push_back({p + "self_attn.v_proj.weight", {kv, s.hidden}, Init::kNormal});
      t.push_back({p + "self_attn.o_proj.weight", {s.hidden, q}, Init::kNormal});
      t.push_back({p + "self_attn.q_norm.weight", {hd}, norm});
      t.push_back({p + "self_attn.k_norm.weight", {hd}, norm});
    }
    const bool mla = s.type == ModelType::kDeepseekV3;
    if (mla) {  // multi-head latent attention (HF DeepseekV3Attention's tensors)
      const std::string a = p + "self_attn.";
      const int64_t qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
      if (s.q_lora_rank > 0) {
        t.push_back({a + "q_a_proj.weight", {s.q_lora_rank, s.hidden}, Init::kNormal});
        t.push_back({a + "q_a_layernorm.weight", {s.q_lora_rank}, Init::kOnes});
        t.push_back({a + "q_b_proj.weight", {s.heads * qk, s.q_lora_rank}, Init::kNormal});
      } else {
        t.push_back({a + "q_proj.weight", {s.heads * qk, s.hidden}, Init::kNormal});
      }
      t.push_back({a + "kv_a_proj_with_mqa.weight", {s.kv_lora_rank + s.qk_rope_head_dim, s.hidden},
                   Init::kNormal});
      t.push_back({a + "kv_a_layernorm.weight", {s.kv_lora_rank}, Init::kOnes});
      t.push_back({a + "kv_b_proj.weight",
                   {s.heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank},
                   Init::kNormal});
      t.push_back({a + "o_proj.weight", {s.hidden, s.heads * s.v_head_dim}, Init::kNormal});
    }
    if (!next && !mla) t.push_back({p + "self_attn.q_proj.weight", {q, s.hidden}, Init::kNormal});
    if (!next && !mla) {
      t.push_back({p + "self_attn.k_proj.weight", {kv, s.hidden}, Init::kNormal});
      t.push_back({p + "self_attn.v_proj.weight", {kv, s.hidden}, Init::kNormal});
      t.push_back({p + "self_attn.o_proj.weight", {s.hidden, q}, Init::kNormal});
    }
    if (s.type == ModelType::kQwen2Moe || s.type == ModelType::kGlm4Moe ||
        s.type == ModelType::kGptOss) {  // q/k/v bias
      t.push_back({p + "self_attn.q_proj.bias", {q}, Init::kZeros});
      t.push_back({p + "self_attn.k_proj.bias", {kv}, Init::kZeros});
      t.push_back({p + "self_attn.v_proj.bias", {kv}, Init::kZeros});
    }
    if (s.type == ModelType::kGptOss) {
      // o_proj bias, sinks, the router with its bias, stacked experts with biases
      // (stacked_experts.h: gate and up interleaved in one [E, H, 2I] tensor).
      const std::string m = p + "mlp.";
      t.push_back({p + "self_attn.o_proj.bias", {s.hidden}, Init::kZeros});
      t.push_back({p + "self_attn.sinks", {s.heads}, Init::kZeros});
      t.push_back({m + "router.weight", {s.experts, s.hidden}, Init::kNormal});
      t.push_back({m + "router.bias", {s.experts}, Init::kZeros});
      t.push_back({m + "experts.gate_up_proj", {s.experts, s.hidden, 2 * s.expert_ffn},
                   Init::kNormal});
      t.push_back({m + "experts.gate_up_proj_bias", {s.experts, 2 * s.expert_ffn}, Init::kZeros});
      t.push_back({m + "experts.down_proj", {s.experts, s.expert_ffn, s.hidden}, Init::kNormal});
      t.push_back({m + "experts.down_proj_bias", {s.experts, s.hidden}, Init::kZeros});
      continue;
    }
    if (s.type == ModelType::kOlmoe) {  // RMSNorm over the whole projection
      t.push_back({p + "self_attn.q_norm.weight", {q}, Init::kOnes});
      t.push_back({p + "self_attn.k_norm.weight", {kv}, Init::kOnes});
    } else if (s.type == ModelType::kQwen3Moe) {  // per head
      t.push_back({p + "self_attn.q_norm.weight", {hd}, Init::kOnes});
      t.push_back({p + "self_attn.k_norm.weight", {hd}, Init::kOnes});
    }
    const bool sigmoid = s.type == ModelType::kGlm4Moe || mla;  // glm4_moe's MoE block
    if (sigmoid && l < s.dense_layers) {  // first_k_dense_replace
      t.push_back({p + "mlp.gate_proj.weight", {s.dense_ffn, s.hidden}, Init::kNormal});
      t.push_back({p + "mlp.up_proj.weight", {s.dense_ffn, s.hidden}, Init::kNormal});
      t.push_back({p + "mlp.down_proj.weight", {s.hidden, s.dense_ffn}, Init::kNormal});
      continue;
    }
    const ExpertNaming& naming = ExpertNamingOf(s.type);
    const std::string moe = p + naming.moe_block + ".";
    t.push_back({moe + "gate.weight", {s.experts, s.hidden}, Init::kNormal});
    if (sigmoid) {
      t.push_back({moe + "gate.e_score_correction_bias", {s.experts}, Init::kZeros});
      t.push_back(
          {moe + "shared_experts.gate_proj.weight", {s.shared_ffn, s.hidden}, Init::kNormal});
      t.push_back({moe + "shared_experts.up_proj.weight", {s.shared_ffn, s.hidden}, Init::kNormal});
      t.push_back(
          {moe + "shared_experts.down_proj.weight", {s.hidden, s.shared_ffn}, Init::kNormal});
    }
    for (int64_t e = 0; e < s.experts; ++e) {
      const std::string x = moe + "experts." + std::to_string(e) + ".";
      const char* const* m = naming.matrix;  // gate, up, down (ExpertMatrix order)
      t.push_back({x + m[0] + ".weight", {s.expert_ffn, s.hidden}, Init::kNormal});
      t.push_back({x + m[1] + ".weight", {s.expert_ffn, s.hidden}, Init::kNormal});
      t.push_back({x + m[2] + ".weight", {s.hidden, s.expert_ffn}, Init::kNormal});
    }
    if (s.type == ModelType::kQwen2Moe || next) {
      t.push_back(
          {moe + "shared_expert.gate_proj.weight", {s.shared_ffn, s.hidden}, Init::kNormal});
      t.push_back({moe + "shared_expert.up_proj.weight", {s.shared_ffn, s.hidden}, Init::kNormal});
      t.push_back(
          {moe + "shared_expert.down_proj.weight", {s.hidden, s.shared_ffn}, Init::kNormal});
      t.push_back({moe + "shared_expert_gate.weight", {1, s.hidden}, Init::kNormal});
    }
  }
  t.push_back({"model.norm.weight", {s.hidden}, norm});
  // gemma4 ties lm_head to the embeddings.
  if (s.type != ModelType::kGemma4) {
    t.push_back({"lm_head.weight", {s.vocab, s.hidden}, Init::kNormal});
  }
  return t;
}

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) { return Fnv1a64Of(s.data(), s.size()); }

// Fills n bf16 values: each the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled to
// standard deviation `std` (support +-2*sqrt(3)*std). Cheap, deterministic, bell-shaped.
void FillNormalBf16(uint16_t* out, size_t n, uint64_t stream, float std) {
  uint64_t state = stream;
  const float scale = std * std::sqrt(3.0f) / 65536.0f;  // var of U(0,65536) sum of 4 = 4*2^32/12
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = SplitMix64(state);
    float sum =
        static_cast<float>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48)) -
        2.0f * 65535.0f;
    out[i] = F32ToBf16(sum * scale);
  }
}

Status CheckSpec(const SyntheticMoeSpec& s) {
  auto bad = [](const std::string& m) { return InvalidArgument("synthetic model: " + m); };
  if (s.layers < 1 || s.hidden < 1 || s.heads < 1 || s.kv_heads < 1 || s.experts < 1 ||
      s.top_k < 1 || s.expert_ffn < 1 || s.vocab < 1 || s.max_positions < 1) {
    return bad("every dimension must be >= 1");
  }
  if (s.hidden % s.heads != 0) return bad("heads must divide hidden");
  if ((s.hidden / s.heads) % 2 != 0) return bad("head dim must be even");
  if (s.heads % s.kv_heads != 0) return bad("kv_heads must divide heads");
  if (s.top_k > s.experts) return bad("top_k must be <= experts");
  if (s.full_head_dim != 0 || s.full_kv_heads != 0) {
    if (s.type != ModelType::kGemma4) return bad("full_head_dim and full_kv_heads are gemma4's");
    if (s.full_head_dim < 2 || s.full_head_dim % 2 != 0 || s.full_kv_heads < 1 ||
        s.heads % s.full_kv_heads != 0) {
      return bad(
          "gemma4's full layers: full_head_dim even and >= 2, full_kv_heads >= 1 "
          "dividing heads");
    }
  }
  if (s.type == ModelType::kQwen2Moe && s.shared_ffn < 1) return bad("shared_ffn must be >= 1");
  if (s.type == ModelType::kDeepseekV3) {
    if (s.q_lora_rank < 0 || s.kv_lora_rank < 1 || s.qk_nope_head_dim < 1 ||
        s.qk_rope_head_dim < 2 || s.qk_rope_head_dim % 2 != 0 || s.v_head_dim < 1) {
      return bad("MLA: kv_lora_rank, qk_nope_head_dim and v_head_dim must be >= 1, "
                 "qk_rope_head_dim even and >= 2, q_lora_rank >= 0");
    }
    if (s.kv_heads != s.heads) return bad("deepseek_v3: kv_heads must equal heads (MLA)");
  }
  if (s.type == ModelType::kGlm4Moe || s.type == ModelType::kDeepseekV3) {
    if (s.shared_ffn < 0 || s.shared_ffn % s.expert_ffn != 0) {
      return bad("shared_ffn must be a multiple of expert_ffn (n_shared_experts)");
    }
    if (s.dense_layers < 0 || s.dense_layers > s.layers) {
      return bad("dense_layers must be in [0, layers]");
    }
    if (s.dense_layers > 0 && s.dense_ffn < 1) return bad("dense_ffn must be >= 1");
    if (s.n_group < 1 || s.experts % s.n_group != 0 || s.topk_group < 1 ||
        s.topk_group > s.n_group || (s.n_group > 1 && s.experts / s.n_group < 2) ||
        s.top_k > s.topk_group * (s.experts / s.n_group)) {
      return bad("n_group must divide experts in groups of 2 or more, topk_group be in "
                 "[1, n_group], top_k at most the kept groups' experts");
    }
    if (s.type == ModelType::kGlm4Moe && (s.hidden / s.heads) % 4 != 0) {
      return bad("head dim must be a multiple of 4");
    }
  }
  if (s.type == ModelType::kQwen3Next) {
    if (s.shared_ffn < 1) return bad("shared_ffn must be >= 1");
    if (s.linear_key_heads < 1 || s.linear_value_heads < 1 || s.linear_head_dim < 1 ||
        s.linear_value_heads % s.linear_key_heads != 0) {
      return bad("linear heads must be >= 1, the value heads a multiple of the key heads");
    }
    if (s.full_attention_interval < 1) return bad("full_attention_interval must be >= 1");
    if ((s.hidden / s.heads) % 8 != 0) return bad("head dim must be a multiple of 8");
  }
  if (s.type == ModelType::kGemma4 && s.dense_ffn < 1) return bad("dense_ffn must be >= 1");
  if (!(s.init_std > 0)) return bad("init_std must be > 0");
  return Status::Ok();
}

}  // namespace

SyntheticMoeSpec GptOss20bSpec() {
  SyntheticMoeSpec s;
  s.type = ModelType::kGptOss;
  s.layers = 2;
  s.hidden = 2880;
  s.heads = 45;  // 64-dim heads over the hidden width (gpt-oss-20b: 64 heads, q 4096 wide)
  s.kv_heads = 9;
  s.experts = 32;
  s.top_k = 4;
  s.expert_ffn = 2880;
  s.vocab = 201088;
  return s;
}

SyntheticMoeSpec Gemma4MoeSpec() {
  SyntheticMoeSpec s;
  s.type = ModelType::kGemma4;
  s.layers = 2;
  s.hidden = 2048;
  s.heads = 8;  // 256-wide heads
  s.kv_heads = 4;
  s.full_head_dim = 512;
  s.full_kv_heads = 1;
  s.experts = 128;
  s.top_k = 8;
  s.expert_ffn = 512;
  s.dense_ffn = 2048;
  s.vocab = 262144;
  s.max_positions = 4096;
  return s;
}

SyntheticMoeSpec Glm4MoeAirHalfSpec() {
  SyntheticMoeSpec s;
  s.type = ModelType::kGlm4Moe;
  s.layers = 2;
  s.hidden = 2048;
  s.heads = 16;
  s.kv_heads = 2;
  s.experts = 64;
  s.top_k = 8;
  s.expert_ffn = 704;
  s.shared_ffn = 704;
  s.dense_layers = 1;
  s.dense_ffn = 5472;
  s.vocab = 151552;
  s.max_positions = 4096;
  return s;
}

SyntheticMoeSpec WithExpertFfn(SyntheticMoeSpec spec, int64_t expert_ffn) {
  const bool counted = spec.type == ModelType::kGlm4Moe || spec.type == ModelType::kDeepseekV3;
  if (counted && spec.expert_ffn > 0 && spec.shared_ffn % spec.expert_ffn == 0) {
    spec.shared_ffn = spec.shared_ffn / spec.expert_ffn * expert_ffn;
  }
  spec.expert_ffn = expert_ffn;
  return spec;
}

SyntheticMoeSpec DeepseekV3QuarterSpec() {
  SyntheticMoeSpec s;
  s.type = ModelType::kDeepseekV3;
  s.layers = 2;
  s.hidden = 1792;
  s.heads = 32;
  s.kv_heads = 32;
  s.q_lora_rank = 384;
  s.kv_lora_rank = 512;
  s.qk_nope_head_dim = 128;
  s.qk_rope_head_dim = 64;
  s.v_head_dim = 128;
  s.experts = 64;
  s.top_k = 8;
  s.n_group = 8;
  s.topk_group = 4;
  s.expert_ffn = 512;
  s.shared_ffn = 512;
  s.dense_layers = 1;
  s.dense_ffn = 4608;
  s.vocab = 129280;
  s.max_positions = 4096;
  return s;
}

SyntheticMoeSpec Qwen3NextQuarterSpec() {
  SyntheticMoeSpec s;
  s.type = ModelType::kQwen3Next;
  s.layers = 4;
  s.hidden = 2048;
  s.heads = 8;
  s.kv_heads = 2;
  s.experts = 512;
  s.top_k = 10;
  s.expert_ffn = 128;
  s.shared_ffn = 512;
  s.linear_key_heads = 16;
  s.linear_value_heads = 32;
  s.linear_head_dim = 128;
  s.full_attention_interval = 4;
  s.vocab = 151936;
  s.max_positions = 4096;
  return s;
}

uint64_t SyntheticMoeBytes(const SyntheticMoeSpec& spec) {
  uint64_t n = 0;
  for (const auto& t : Tensors(spec)) {
    uint64_t e = 1;
    for (int64_t d : t.shape) e *= static_cast<uint64_t>(d);
    n += e * 2;
  }
  return n;
}

std::string SyntheticMoeConfigJson(const SyntheticMoeSpec& s) {
  using json = nlohmann::ordered_json;
  json j;
  const char* arch = "OlmoeForCausalLM";
  switch (s.type) {
    case ModelType::kQwen2Moe:
      arch = "Qwen2MoeForCausalLM";
      break;
    case ModelType::kQwen3Moe:
      arch = "Qwen3MoeForCausalLM";
      break;
    case ModelType::kOlmoe:
      arch = "OlmoeForCausalLM";
      break;
    case ModelType::kMixtral:
      arch = "MixtralForCausalLM";
      break;
    case ModelType::kGlm4Moe:
      arch = "Glm4MoeForCausalLM";
      break;
    case ModelType::kQwen3Next:
      arch = "Qwen3NextForCausalLM";
      break;
    case ModelType::kQwen35Moe:  // not offered by make_synthetic_moe
      arch = "Qwen3_5MoeForCausalLM";
      break;
    case ModelType::kGptOss:
      arch = "GptOssForCausalLM";
      break;
    case ModelType::kGemma4:
      arch = "Gemma4ForCausalLM";
    case ModelType::kDeepseekV3:
      arch = "DeepseekV3ForCausalLM";
      break;
  }
  j["architectures"] = {arch};
  j["model_type"] = ModelTypeName(s.type);
  j["hidden_size"] = s.hidden;
  j["num_hidden_layers"] = s.layers;
  j["num_attention_heads"] = s.heads;
  j["num_key_value_heads"] = s.kv_heads;
  j["vocab_size"] = s.vocab;
  j["max_position_embeddings"] = s.max_positions;
  j["rms_norm_eps"] = 1e-5;
  j["rope_theta"] = 10000.0;
  j["rope_scaling"] = nullptr;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = false;
  j["num_experts_per_tok"] = s.top_k;
  j["initializer_range"] = s.init_std;
  switch (s.type) {
    case ModelType::kOlmoe:
      j["num_experts"] = s.experts;
      j["intermediate_size"] = s.expert_ffn;
      j["norm_topk_prob"] = false;
      j["attention_bias"] = false;
      j["clip_qkv"] = nullptr;
      j["pad_token_id"] = 1;
      j["eos_token_id"] = s.vocab > 50279 ? 50279 : s.vocab - 1;
      break;
    case ModelType::kQwen2Moe:
    case ModelType::kQwen3Moe:
      j["num_experts"] = s.experts;
      j["moe_intermediate_size"] = s.expert_ffn;
      j["intermediate_size"] = s.expert_ffn * s.top_k;  // dense size; no dense layers here
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = json::array();
      j["norm_topk_prob"] = s.type == ModelType::kQwen3Moe;
      j["use_sliding_window"] = false;
      if (s.type == ModelType::kQwen2Moe) {
        j["shared_expert_intermediate_size"] = s.shared_ffn;
        j["qkv_bias"] = true;
      } else {
        j["head_dim"] = s.hidden / s.heads;
        j["attention_bias"] = false;
      }
      j["eos_token_id"] = s.vocab - 1;
      break;
    case ModelType::kMixtral:
      j["num_local_experts"] = s.experts;
      j["intermediate_size"] = s.expert_ffn;
      j["sliding_window"] = nullptr;
      j["bos_token_id"] = 1 % s.vocab;
      j["eos_token_id"] = 2 % s.vocab;
      break;
    case ModelType::kGlm4Moe:
      j["n_routed_experts"] = s.experts;
      j["moe_intermediate_size"] = s.expert_ffn;
      j["n_shared_experts"] = s.shared_ffn / s.expert_ffn;
      j["first_k_dense_replace"] = s.dense_layers;
      j["intermediate_size"] = s.dense_layers > 0 ? s.dense_ffn : s.expert_ffn * s.top_k;
      j["n_group"] = s.n_group;
      j["topk_group"] = s.topk_group;
      j["norm_topk_prob"] = true;
      j["routed_scaling_factor"] = 1.0;
      j["head_dim"] = s.hidden / s.heads;
      j["partial_rotary_factor"] = 0.5;
      j["attention_bias"] = true;
      j["use_qk_norm"] = false;
      j["num_nextn_predict_layers"] = 0;
      j["eos_token_id"] = s.vocab - 1;
      break;
    case ModelType::kQwen3Next:
      j["num_experts"] = s.experts;
      j["moe_intermediate_size"] = s.expert_ffn;
      j["shared_expert_intermediate_size"] = s.shared_ffn;
      j["intermediate_size"] = s.expert_ffn * s.top_k;  // dense size; no dense layers here
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = json::array();
      j["norm_topk_prob"] = true;
      j["head_dim"] = s.hidden / s.heads;
      j["partial_rotary_factor"] = 0.25;
      j["attention_bias"] = false;
      j["full_attention_interval"] = s.full_attention_interval;
      j["linear_num_key_heads"] = s.linear_key_heads;
      j["linear_num_value_heads"] = s.linear_value_heads;
      j["linear_key_head_dim"] = s.linear_head_dim;
      j["linear_value_head_dim"] = s.linear_head_dim;
      j["linear_conv_kernel_dim"] = 4;
      j["eos_token_id"] = s.vocab - 1;
      break;
    case ModelType::kQwen35Moe:  // not offered by make_synthetic_moe
      break;
    case ModelType::kGemma4: {
      // Gemma4TextConfig's fields (model_config.cc reads them), not the generic ones above.
      for (const char* k : {"rope_theta", "rope_scaling", "hidden_act", "num_experts_per_tok"}) {
        j.erase(k);
      }
      const int64_t hd = s.hidden / s.heads;
      j["rms_norm_eps"] = 1e-6;
      j["hidden_activation"] = "gelu_pytorch_tanh";
      j["tie_word_embeddings"] = true;
      j["head_dim"] = hd;
      j["global_head_dim"] = s.full_head_dim > 0 ? s.full_head_dim : hd;
      if (s.full_head_dim > 0) j["num_global_key_value_heads"] = s.full_kv_heads;
      j["enable_moe_block"] = true;
      j["num_experts"] = s.experts;
      j["top_k_experts"] = s.top_k;
      j["moe_intermediate_size"] = s.expert_ffn;
      j["intermediate_size"] = s.dense_ffn;
      j["hidden_size_per_layer_input"] = 0;
      j["num_kv_shared_layers"] = 0;
      j["attention_k_eq_v"] = s.full_head_dim > 0;
      j["sliding_window"] = 512;
      json types = json::array();  // every 6th layer and the last full, as HF's default
      for (int64_t l = 0; l < s.layers; ++l) {
        types.push_back(Gemma4Sliding(s, l) ? "sliding_attention" : "full_attention");
      }
      j["layer_types"] = types;
      j["rope_parameters"] = {
          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
          {"full_attention",
           {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25},
            {"rope_theta", 1000000.0}}}};
      j["final_logit_softcapping"] = 30.0;
      j["bos_token_id"] = 2 % s.vocab;
      j["eos_token_id"] = 1 % s.vocab;
      j["pad_token_id"] = 0;
      break;
    }
    case ModelType::kDeepseekV3:
      j["n_routed_experts"] = s.experts;
      j["moe_intermediate_size"] = s.expert_ffn;
      j["n_shared_experts"] = s.shared_ffn / s.expert_ffn;
      j["first_k_dense_replace"] = s.dense_layers;
      j["intermediate_size"] = s.dense_layers > 0 ? s.dense_ffn : s.expert_ffn * s.top_k;
      j["n_group"] = s.n_group;
      j["topk_group"] = s.topk_group;
      j["norm_topk_prob"] = true;
      j["routed_scaling_factor"] = 2.5;
      j["scoring_func"] = "sigmoid";  // as DeepSeek-V3's own config.json names its gate
      j["topk_method"] = "noaux_tc";
      j["q_lora_rank"] = s.q_lora_rank > 0 ? json(s.q_lora_rank) : json(nullptr);
      j["kv_lora_rank"] = s.kv_lora_rank;
      j["qk_nope_head_dim"] = s.qk_nope_head_dim;
      j["qk_rope_head_dim"] = s.qk_rope_head_dim;
      j["v_head_dim"] = s.v_head_dim;
      j["rope_interleave"] = true;
      // DeepSeek-V3's YaRN (its released config's rope_scaling), over this model's context.
      j["max_position_embeddings"] = 40 * s.max_positions;
      j["rope_scaling"] = {{"type", "yarn"}, {"factor", 40.0}, {"beta_fast", 32.0},
                           {"beta_slow", 1.0}, {"mscale", 1.0}, {"mscale_all_dim", 1.0},
                           {"original_max_position_embeddings", s.max_positions}};
      j["num_nextn_predict_layers"] = 0;
      j["bos_token_id"] = 0;
      j["eos_token_id"] = s.vocab - 1;
      break;
    case ModelType::kGptOss: {
      j["num_local_experts"] = s.experts;
      j["intermediate_size"] = s.expert_ffn;
      j["head_dim"] = s.hidden / s.heads;
      j["attention_bias"] = true;
      j["sliding_window"] = 128;
      json types = json::array();  // gpt-oss's alternation, sliding first
      for (int64_t l = 0; l < s.layers; ++l) {
        types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
      }
      j["layer_types"] = types;
      // gpt-oss's YaRN (its released config's rope_scaling), over this model's context.
      j["rope_theta"] = 150000.0;
      j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0},
                           {"beta_slow", 1.0}, {"truncate", false},
                           {"original_max_position_embeddings", s.max_positions}};
      j["swiglu_alpha"] = 1.702;
      j["swiglu_limit"] = 7.0;
      j["eos_token_id"] = s.vocab - 1;
      break;
    }
  }
  j["torch_dtype"] = "bfloat16";
  return j.dump(2) + "\n";
}

Status WriteSyntheticMoe(const SyntheticMoeSpec& spec, const std::string& dir) {
  PW_RETURN_IF_ERROR(CheckSpec(spec));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError(dir + ": cannot create directory: " + ec.message());

  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  w.SetMetadata("pagedweight", "synthetic random weights, seed " + std::to_string(spec.seed));
  for (const auto& t : Tensors(spec)) {
    const uint64_t stream = HashName(t.name) ^ (spec.seed * 0x9e3779b97f4a7c15ull);
    const Init init = t.init;
    const float std = spec.init_std;
    PW_RETURN_IF_ERROR(
        w.AddLazy(t.name, DType::kBF16, t.shape, [init, stream, std](uint8_t* dst, size_t nbytes) {
          auto* out = reinterpret_cast<uint16_t*>(dst);
          size_t n = nbytes / 2;
          if (init == Init::kNormal) {
            FillNormalBf16(out, n, stream, std);
          } else {
            uint16_t v = init == Init::kOnes ? F32ToBf16(1.0f) : 0;
            for (size_t i = 0; i < n; ++i) out[i] = v;
          }
        }));
  }
  PW_RETURN_IF_ERROR(w.Write(dir + "/model.safetensors"));

  const std::string cfg = dir + "/config.json";
  const std::string tmp = cfg + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << SyntheticMoeConfigJson(spec);
    f.close();
    if (!f) return IoError(tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), cfg.c_str()) != 0) {
    return IoError(cfg + ": rename failed: " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace pw
