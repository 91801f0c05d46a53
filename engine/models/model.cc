#include "engine/models/model.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/dtype.h"
#include "common/formats/bf16_tensor.h"
#include "common/formats/checkpoint_experts.h"
#include "common/formats/stacked_experts.h"
#include "common/logging.h"
#include "engine/models/rope.h"
#include "kernels/cpu/thread_pool.h"

namespace pw::engine {

Result<std::unique_ptr<Model>> Model::Load(const std::string& dir, FileLoad load) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return NotFound("model directory " + dir + " does not exist or is not a directory");
  }
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  PW_ASSIGN_OR_RETURN(m->config_, LoadModelConfig(dir + "/config.json"));
  m->family_ = FindFamily(m->config_.type);
  if (m->family_ == nullptr) {
    return Unsupported(dir + "/config.json: model_type '" + m->config_.model_type +
                       "' has no registered model family (engine/models/family.cc)");
  }
  const std::string& wrapper = m->config_.wrapper_model_type;
  const char* served = m->family_->text_of_wrapper;
  if (!wrapper.empty() && (served == nullptr || wrapper != served)) {
    return Unsupported(dir + "/config.json: model_type '" + wrapper + "' wraps a " +
                       m->config_.model_type +
                       " text_config; only text-model checkpoints are served (load the language "
                       "model's own checkpoint)");
  }
  PW_ASSIGN_OR_RETURN(m->ckpt_, Checkpoint::Open(dir, load));
  PW_RETURN_IF_ERROR(m->LoadTensors());
  const int64_t d = m->config_.rotary_dim;
  if (d % 2 != 0 || d < 2 || d > m->config_.head_dim) {
    return InvalidArgument(dir + "/config.json: RoPE over " + std::to_string(d) +
                           " dims of head_dim " + std::to_string(m->config_.head_dim) +
                           "; they must be even, in [2, head_dim]");
  }
  m->rope_ = ComputeRope(m->config_, m->config_.max_position_embeddings);
  if (m->config_.sliding_rope) m->sliding_rope_ = ComputeSlidingRope(m->config_);
  return m;
}

Result<Bf16Matrix> Model::Matrix(const std::string& name, int64_t rows, int64_t cols) {
  // An fp16 or fp32 checkpoint's matrices are rounded to bf16 here (common/formats/bf16_tensor.h).
  std::vector<uint16_t> converted;
  PW_ASSIGN_OR_RETURN(TensorView t, GetAsBf16(*ckpt_, name, {rows, cols}, &converted,
                                              {config_.fp8_block_rows, config_.fp8_block_cols}));
  Bf16Matrix m{nullptr, rows, cols};
  if (converted.empty() && reinterpret_cast<uintptr_t>(t.data) % alignof(uint16_t) == 0) {
    m.data = reinterpret_cast<const uint16_t*>(t.data);
  } else {
    auto copy = std::make_unique<uint16_t[]>(static_cast<size_t>(rows * cols));
    std::memcpy(copy.get(), t.data, t.nbytes);
    m.data = copy.get();
    owned_.push_back(std::move(copy));
  }
  return m;
}

Result<std::vector<float>> Model::Vector(const std::string& name, int64_t n) {
  return Floats(name, {n});
}

Result<std::vector<float>> Model::Floats(const std::string& name,
                                         const std::vector<int64_t>& shape) {
  PW_ASSIGN_OR_RETURN(TensorView t, ckpt_->Get(name));
  if (t.shape != shape) {
    return InvalidArgument("tensor " + name + " in " + dir_ + " has shape " +
                           ShapeToString(t.shape) + ", expected " + ShapeToString(shape));
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> out(static_cast<size_t>(n));
  if (t.dtype == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      out[static_cast<size_t>(i)] = Bf16ToF32(h);
    }
  } else if (t.dtype == DType::kF32) {
    std::memcpy(out.data(), t.data, static_cast<size_t>(n) * 4);
  } else if (t.dtype == DType::kF16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      out[static_cast<size_t>(i)] = F16ToF32(h);
    }
  } else {
    return InvalidArgument("tensor " + name + " in " + dir_ + " has dtype " +
                           std::string(DTypeName(t.dtype)) + ", expected BF16, F16 or F32");
  }
  return out;
}

std::string Model::Whole(const char* name) const {
  const std::string n = name;
  if (n.rfind("model.", 0) != 0) return n;
  return config_.weights_prefix + n.substr(6);
}

Result<MlpWeights> Model::Mlp(const std::string& prefix, const MlpNames& names, int64_t ffn) {
  const int64_t h = config_.hidden_size;
  MlpWeights w;
  PW_ASSIGN_OR_RETURN(w.gate, Matrix(prefix + names.gate + ".weight", ffn, h));
  PW_ASSIGN_OR_RETURN(w.up, Matrix(prefix + names.up + ".weight", ffn, h));
  PW_ASSIGN_OR_RETURN(w.down, Matrix(prefix + names.down + ".weight", h, ffn));
  return w;
}

Status Model::LoadGatedDeltaNet(const std::string& prefix, GatedDeltaNetWeights* w) {
  const ModelConfig& c = config_;
  const LinearAttentionConfig& la = c.linear_attention;
  const GatedDeltaNetNames& n = *family_->linear_attention;
  const std::string p = prefix + n.prefix;
  const int64_t h = c.hidden_size, nk = la.num_key_heads, nv = la.num_value_heads;
  const int64_t dk = la.key_head_dim, dv = la.value_head_dim;
  w->split = n.in_proj_qkvz == nullptr;
  if (w->split) {
    PW_ASSIGN_OR_RETURN(w->in_proj_qkv, Matrix(p + n.in_proj_qkv + ".weight", la.conv_dim(), h));
    PW_ASSIGN_OR_RETURN(w->in_proj_z, Matrix(p + n.in_proj_z + ".weight", nv * dv, h));
    PW_ASSIGN_OR_RETURN(w->in_proj_b, Matrix(p + n.in_proj_b + ".weight", nv, h));
    PW_ASSIGN_OR_RETURN(w->in_proj_a, Matrix(p + n.in_proj_a + ".weight", nv, h));
  } else {
    PW_ASSIGN_OR_RETURN(w->in_proj_qkvz,
                        Matrix(p + n.in_proj_qkvz + ".weight", 2 * nk * dk + 2 * nv * dv, h));
    PW_ASSIGN_OR_RETURN(w->in_proj_ba, Matrix(p + n.in_proj_ba + ".weight", 2 * nv, h));
  }
  PW_ASSIGN_OR_RETURN(w->conv, Floats(p + n.conv1d + ".weight", {la.conv_dim(), 1, la.conv_kernel}));
  PW_ASSIGN_OR_RETURN(w->dt_bias, Vector(p + n.dt_bias, nv));
  PW_ASSIGN_OR_RETURN(w->a_log, Vector(p + n.a_log, nv));
  PW_ASSIGN_OR_RETURN(w->norm, Vector(p + n.norm + ".weight", dv));
  PW_ASSIGN_OR_RETURN(w->out_proj, Matrix(p + n.out_proj + ".weight", h, nv * dv));
  return Status::Ok();
}

Status Model::LoadMla(const std::string& prefix, MlaWeights* w) {
  const ModelConfig& c = config_;
  const MlaConfig& m = c.mla;
  const MlaNames& n = *family_->latent_attention;
  const std::string p = prefix + n.prefix;
  const int64_t h = c.hidden_size, nh = c.num_heads, r = m.kv_lora_rank;
  const int64_t qk = m.qk_head_dim(), nope = m.qk_nope_head_dim, v = m.v_head_dim;
  if (m.q_lora_rank > 0) {
    PW_ASSIGN_OR_RETURN(w->q_a, Matrix(p + n.q_a + ".weight", m.q_lora_rank, h));
    PW_ASSIGN_OR_RETURN(w->q_a_norm, Vector(p + n.q_a_norm + ".weight", m.q_lora_rank));
    PW_ASSIGN_OR_RETURN(w->q_b, Matrix(p + n.q_b + ".weight", nh * qk, m.q_lora_rank));
    if (c.qkv_bias) {
      PW_ASSIGN_OR_RETURN(w->q_a_bias, Vector(p + n.q_a + ".bias", m.q_lora_rank));
    }
  } else {
    PW_ASSIGN_OR_RETURN(w->q, Matrix(p + n.q + ".weight", nh * qk, h));
  }
  PW_ASSIGN_OR_RETURN(w->kv_a, Matrix(p + n.kv_a + ".weight", m.latent_dim(), h));
  if (c.qkv_bias) {
    PW_ASSIGN_OR_RETURN(w->kv_a_bias, Vector(p + n.kv_a + ".bias", m.latent_dim()));
  }
  PW_ASSIGN_OR_RETURN(w->kv_a_norm, Vector(p + n.kv_a_norm + ".weight", r));
  PW_ASSIGN_OR_RETURN(w->kv_b, Matrix(p + n.kv_b + ".weight", nh * (nope + v), r));
  PW_ASSIGN_OR_RETURN(w->o, Matrix(p + n.o + ".weight", h, nh * v));
  if (c.o_bias) {
    PW_ASSIGN_OR_RETURN(w->o_bias, Vector(p + n.o + ".bias", h));
  }
  // W_UK^T per head for the absorbed query (MlaWeights::uk_t).
  std::vector<uint16_t> t(static_cast<size_t>(nh * r * nope));
  for (int64_t hd = 0; hd < nh; ++hd) {
    const uint16_t* uk = w->kv_b.data + hd * (nope + v) * r;  // [nope, r]
    for (int64_t i = 0; i < nope; ++i) {
      for (int64_t j = 0; j < r; ++j) t[static_cast<size_t>((hd * r + j) * nope + i)] = uk[i * r + j];
    }
  }
  w->uk_t = Own(t, nh * r, nope);
  return Status::Ok();
}

Bf16Matrix Model::Own(const std::vector<uint16_t>& values, int64_t rows, int64_t cols) {
  auto copy = std::make_unique<uint16_t[]>(values.size());
  std::memcpy(copy.get(), values.data(), values.size() * sizeof(uint16_t));
  Bf16Matrix m{copy.get(), rows, cols};
  owned_.push_back(std::move(copy));
  return m;
}

Status Model::StackedExperts(int64_t l, const std::string& block, LayerWeights* w) {
  const ModelConfig& c = config_;
  StackedExpertShape shape{c.num_experts, c.hidden_size, c.moe_intermediate_size};
  if (!StackedLayoutOf(c.type, &shape.layout)) {
    return Internal(dir_ + ": family " + family_->model_type + " has stacked experts, but " +
                    ModelTypeName(c.type) + " no stacked layout");
  }
  const bool biases = shape.layout == StackedLayout::kGptOss;
  const size_t I = static_cast<size_t>(shape.ffn), H = static_cast<size_t>(shape.hidden);
  if (biases) {
    w->expert_gate_up_bias.resize(static_cast<size_t>(c.num_experts) * 2 * I);
    w->expert_down_bias.resize(static_cast<size_t>(c.num_experts) * H);
  }
  std::vector<uint16_t> gate, up, down;
  std::vector<float> bg, bu, bd;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    Status s = ReadStackedExpert(*ckpt_, block, shape, e, &gate, &up, &down);
    if (s.ok() && biases) s = ReadStackedExpertBiases(*ckpt_, block, shape, e, &bg, &bu, &bd);
    if (!s.ok()) return s.WithContext(dir_ + ", layer " + std::to_string(l));
    MlpWeights& x = w->experts[static_cast<size_t>(e)];
    x.gate = Own(gate, shape.ffn, shape.hidden);
    x.up = Own(up, shape.ffn, shape.hidden);
    x.down = Own(down, shape.hidden, shape.ffn);
    if (!biases) continue;
    float* b = &w->expert_gate_up_bias[static_cast<size_t>(e) * 2 * I];
    std::memcpy(b, bg.data(), I * sizeof(float));
    std::memcpy(b + I, bu.data(), I * sizeof(float));
    std::memcpy(&w->expert_down_bias[static_cast<size_t>(e) * H], bd.data(), H * sizeof(float));
  }
  return Status::Ok();
}

Status Model::LoadSandwich(int64_t l, const std::string& p, LayerWeights* w) {
  const ModelConfig& c = config_;
  const SandwichNames& n = *family_->sandwich;
  const int64_t h = c.hidden_size;
  PW_ASSIGN_OR_RETURN(w->attn_out_norm, Vector(p + n.attn_out_norm + ".weight", h));
  PW_ASSIGN_OR_RETURN(w->ffn_out_norm, Vector(p + n.ffn_out_norm + ".weight", h));
  PW_ASSIGN_OR_RETURN(std::vector<float> scalar, Vector(p + n.layer_scalar, 1));
  w->layer_scalar = scalar[0];
  if (!w->is_moe) return Status::Ok();
  PW_ASSIGN_OR_RETURN(w->mlp, Mlp(p + family_->dense_mlp, family_->mlp, c.intermediate_size));
  PW_ASSIGN_OR_RETURN(w->dense_out_norm, Vector(p + n.dense_out_norm + ".weight", h));
  PW_ASSIGN_OR_RETURN(w->experts_in_norm, Vector(p + n.experts_in_norm + ".weight", h));
  PW_ASSIGN_OR_RETURN(w->experts_out_norm, Vector(p + n.experts_out_norm + ".weight", h));
  PW_ASSIGN_OR_RETURN(w->router_input_scale, Vector(p + n.router_scale, h));
  // HF: norm(x) * scale * hidden^-0.5, in that order, in fp32; one factor here (the rounding
  // differs from HF's two products by at most an ulp).
  const float root = static_cast<float>(std::pow(static_cast<double>(h), -0.5));
  for (float& s : w->router_input_scale) s *= root;
  PW_ASSIGN_OR_RETURN(w->expert_weight_scale, Vector(p + n.expert_scale, c.num_experts));
  return Status::Ok();
}

// Every name comes from the family (family.h) or, for the routed experts, from the naming
// table the broker shares (checkpoint_experts.h); what is present follows the config.
Status Model::LoadTensors() {
  const ModelConfig& c = config_;
  const ModelFamily& f = *family_;
  const int64_t h = c.hidden_size, nh = c.num_heads;
  PW_ASSIGN_OR_RETURN(embed_, Matrix(Whole(f.embed), c.vocab_size, h));
  PW_ASSIGN_OR_RETURN(final_norm_, Vector(Whole(f.final_norm), h));
  if (c.tie_word_embeddings && !ckpt_->Has(Whole(f.lm_head))) {
    lm_head_ = embed_;
  } else {
    PW_ASSIGN_OR_RETURN(lm_head_, Matrix(Whole(f.lm_head), c.vocab_size, h));
  }
  if (c.shared_expert_intermediate_size > 0 && f.shared_expert == nullptr) {
    return Internal(dir_ + "/config.json: a shared expert of size " +
                    std::to_string(c.shared_expert_intermediate_size) + ", but family " +
                    f.model_type + " has none");
  }
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& w = layers_[static_cast<size_t>(l)];
    const std::string p = c.weights_prefix + "layers." + std::to_string(l) + ".";
    PW_ASSIGN_OR_RETURN(w.input_norm, Vector(p + f.input_norm + ".weight", h));
    PW_ASSIGN_OR_RETURN(w.post_attn_norm, Vector(p + f.post_attn_norm + ".weight", h));
    if (c.linear_attention.IsLinear(l)) {
      if (f.linear_attention == nullptr) {
        return Internal(dir_ + "/config.json: layer " + std::to_string(l) +
                        " is linear attention, but family " + f.model_type + " has none");
      }
      w.is_linear_attention = true;
      PW_RETURN_IF_ERROR(LoadGatedDeltaNet(p, &w.linear));
    } else if (c.mla.enabled()) {
      if (f.latent_attention == nullptr) {
        return Internal(dir_ + "/config.json: MLA attention, but family " + f.model_type +
                        " has none");
      }
      w.is_mla = true;
      PW_RETURN_IF_ERROR(LoadMla(p, &w.mla));
    } else {
      // The layer's own head size and kv heads (gemma4's full layers: global_head_dim).
      const int64_t d = c.LayerHeadDim(l), nkv = c.LayerKvHeads(l);
      const std::string a = p + f.attention.prefix;
      const std::string q = a + f.attention.q, k = a + f.attention.k, v = a + f.attention.v,
                        o = a + f.attention.o;
      const int64_t q_rows = (f.attention_output_gate ? 2 : 1) * nh * d;
      PW_ASSIGN_OR_RETURN(w.q, Matrix(q + ".weight", q_rows, h));
      PW_ASSIGN_OR_RETURN(w.k, Matrix(k + ".weight", nkv * d, h));
      // attention_k_eq_v: a full layer's values are its keys' projection (no v_proj).
      if (!(c.k_eq_v && !c.IsSlidingLayer(l))) {
        PW_ASSIGN_OR_RETURN(w.v, Matrix(v + ".weight", nkv * d, h));
      }
      PW_ASSIGN_OR_RETURN(w.o, Matrix(o + ".weight", h, nh * d));
      if (c.qkv_bias) {
        PW_ASSIGN_OR_RETURN(w.q_bias, Vector(q + ".bias", nh * d));
        PW_ASSIGN_OR_RETURN(w.k_bias, Vector(k + ".bias", nkv * d));
        PW_ASSIGN_OR_RETURN(w.v_bias, Vector(v + ".bias", nkv * d));
      }
      if (c.o_bias) {
        PW_ASSIGN_OR_RETURN(w.o_bias, Vector(o + ".bias", h));
      }
      if (c.attention_sinks) {
        PW_ASSIGN_OR_RETURN(w.sinks, Vector(a + f.attention.sinks, nh));
      }
      if (c.IsSlidingLayer(l)) w.sliding_window = static_cast<int>(c.sliding_window);
      const std::string qn = a + f.attention.q_norm + ".weight",
                        kn = a + f.attention.k_norm + ".weight";
      if (c.qk_norm == QkNorm::kPerHead) {
        PW_ASSIGN_OR_RETURN(w.q_norm, Vector(qn, d));
        PW_ASSIGN_OR_RETURN(w.k_norm, Vector(kn, d));
      } else if (c.qk_norm == QkNorm::kFull) {
        PW_ASSIGN_OR_RETURN(w.q_norm, Vector(qn, nh * d));
        PW_ASSIGN_OR_RETURN(w.k_norm, Vector(kn, nkv * d));
      }
    }
    w.is_moe = c.IsMoeLayer(l);
    if (w.is_moe) {
      const std::string m = MoeBlockPrefix(c, l);
      w.gate = f.gate;
      w.activation = f.activation;
      PW_ASSIGN_OR_RETURN(w.router, Matrix(m + f.router + ".weight", c.num_experts, h));
      if (f.router_bias != nullptr) {
        PW_ASSIGN_OR_RETURN(w.router_bias, Vector(m + f.router_bias, c.num_experts));
      }
      if (f.router_logits_bias != nullptr) {
        PW_ASSIGN_OR_RETURN(w.router_logits_bias, Vector(m + f.router_logits_bias, c.num_experts));
      }
      w.experts.resize(static_cast<size_t>(c.num_experts));
      if (f.stacked_experts) PW_RETURN_IF_ERROR(StackedExperts(l, m, &w));
      for (int64_t e = 0; e < c.num_experts && !f.stacked_experts; ++e) {
        MlpWeights& x = w.experts[static_cast<size_t>(e)];
        const int64_t i = c.moe_intermediate_size;
        PW_ASSIGN_OR_RETURN(x.gate, Matrix(ExpertTensorName(c, l, e, ExpertMatrix::kGate), i, h));
        PW_ASSIGN_OR_RETURN(x.up, Matrix(ExpertTensorName(c, l, e, ExpertMatrix::kUp), i, h));
        PW_ASSIGN_OR_RETURN(x.down, Matrix(ExpertTensorName(c, l, e, ExpertMatrix::kDown), h, i));
      }
      if (f.shared_expert != nullptr && c.shared_expert_intermediate_size > 0) {
        w.has_shared_expert = true;
        PW_ASSIGN_OR_RETURN(w.shared_expert,
                            Mlp(m + f.shared_expert, f.mlp, c.shared_expert_intermediate_size));
        if (f.shared_expert_gate != nullptr) {
          PW_ASSIGN_OR_RETURN(w.shared_expert_gate,
                              Matrix(m + f.shared_expert_gate + ".weight", 1, h));
        }
      }
    } else {
      PW_ASSIGN_OR_RETURN(w.mlp, Mlp(p + f.dense_mlp, f.mlp, c.intermediate_size));
    }
    if (f.sandwich != nullptr) PW_RETURN_IF_ERROR(LoadSandwich(l, p, &w));
  }
  if (f.zero_centred_norm) {
    // Stored as w, applied as (1 + w) (HF Qwen3NextRMSNorm): the 1 is added once here.
    auto add_one = [](std::vector<float>& v) {
      for (float& x : v) x += 1.f;
    };
    add_one(final_norm_);
    for (LayerWeights& w : layers_) {
      for (std::vector<float>* v : {&w.input_norm, &w.post_attn_norm, &w.q_norm, &w.k_norm}) {
        add_one(*v);
      }
    }
  }
  // Layers stored after the last (GLM-4.5's MTP modules) are never run: said once, not loaded.
  int64_t extra = 0, other = 0;
  const std::string layers = c.weights_prefix + "layers.";
  for (const std::string& name : ckpt_->TensorNames()) {
    if (!c.wrapper_model_type.empty() && name.rfind(c.weights_prefix, 0) != 0 &&
        name != f.lm_head) {
      ++other;  // a multimodal checkpoint's other towers (model.visual.*)
      continue;
    }
    if (name.rfind(layers, 0) != 0) continue;
    const int64_t l = std::atoll(name.c_str() + layers.size());
    if (l >= c.num_layers) ++extra;
  }
  if (other > 0) {
    PW_LOG(INFO) << dir_ << ": served text-only: " << other << " tensors of "
                 << c.wrapper_model_type << " outside its language model (" << c.weights_prefix
                 << "*; e.g. the vision tower) are not loaded";
  }
  if (extra > 0) {
    PW_LOG(INFO) << dir_ << ": " << extra << " tensors of layers after the last ("
                 << c.num_nextn_predict_layers
                 << " next-token-prediction layers in config.json) are not loaded";
  }
  return Status::Ok();
}

size_t Model::KeepIfSmaller(cpu::PackedBf16Matrix m, Bf16Matrix* w,
                            std::vector<std::unique_ptr<cpu::PackedBf16Matrix>>* owner) {
  if (m.Bytes() >= m.PlainBytes()) return m.PlainBytes();  // values of many binades, or narrow rows
  owner->push_back(std::make_unique<cpu::PackedBf16Matrix>(std::move(m)));
  w->packed = owner->back().get();
  return w->packed->Bytes();
}

Status Model::QuantizeDense(DenseFormat dense, DenseFormat lm_head, int threads) {
  if (dense_done_) return Internal(dir_ + ": the dense matrices were converted already");
  if (dense == DenseFormat::kAsDense) return InvalidArgument("dense format 'dense' names only the lm_head's");
  lm_head = LmHeadFormat(dense, lm_head);
  dense_done_ = true;
  dense_format_ = dense;
  lm_head_format_ = lm_head;
  if (dense == DenseFormat::kBf16 && lm_head == DenseFormat::kBf16) return Status::Ok();
  const auto start = std::chrono::steady_clock::now();
  // The range the kernels of this CPU multiply fastest (63 on AVX2: kernels/anyprec/q8.h), or
  // the kernels.dense_q8_max knob's.
  int range = 127;
  if (dense == DenseFormat::kInt8 || lm_head == DenseFormat::kInt8) {
    PW_ASSIGN_OR_RETURN(range, anyprec::DenseQ8Range());
  }
  double packed_bytes[2] = {0, 0};  // the packed matrices' bf16 bytes, and what they take now
  auto convert = [&](Bf16Matrix& w, const std::string& name, DenseFormat f) -> Status {
    if (w.data == nullptr || w.rows < 1 || f == DenseFormat::kBf16) return Status::Ok();
    const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);
    if (f == DenseFormat::kBf16Packed) {
      packed_bytes[0] += 2.0 * rows * cols;
      packed_bytes[1] += static_cast<double>(KeepIfSmaller(
          cpu::PackBf16(w.data, static_cast<size_t>(rows), static_cast<size_t>(cols)), &w, &packed_));
      return Status::Ok();
    }
    if (f == DenseFormat::kInt8) {
      auto c = std::make_unique<Q8Copy>();
      c->values.resize(anyprec::Q8MatrixValueBytes(rows, cols));
      c->scales.resize(rows);
      Status s = anyprec::QuantizeBf16Rows(w.data, rows, cols, c->values.data(), c->scales.data(), range);
      if (!s.ok()) return s.WithContext(dir_ + ": " + name);
      c->m = {rows, cols, c->values.data(), c->scales.data(), range};
      w.q8 = &c->m;
      q8_.push_back(std::move(c));
      return Status::Ok();
    }
    auto m = anyprec::QuantizeDenseAp(w.data, rows, cols, DenseApBits(f), threads);
    if (!m.ok()) return m.status().WithContext(dir_ + ": " + name);
    w.ap = m->get();
    ap_.push_back(std::move(*m));
    return Status::Ok();
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    LayerWeights& L = layers_[l];
    const std::string at = "layer " + std::to_string(l) + " ";
    for (auto [w, name] : {std::pair{&L.q, "q_proj"}, {&L.k, "k_proj"}, {&L.v, "v_proj"},
                           {&L.o, "o_proj"}, {&L.mla.q, "q_proj"}, {&L.mla.q_a, "q_a_proj"},
                           {&L.mla.q_b, "q_b_proj"}, {&L.mla.kv_a, "kv_a_proj_with_mqa"},
                           {&L.mla.o, "o_proj"}}) {
      PW_RETURN_IF_ERROR(convert(*w, at + name, dense));
    }
    for (MlpWeights* m : {&L.mlp, &L.shared_expert}) {
      PW_RETURN_IF_ERROR(convert(m->gate, at + "mlp gate", dense));
      PW_RETURN_IF_ERROR(convert(m->up, at + "mlp up", dense));
      PW_RETURN_IF_ERROR(convert(m->down, at + "mlp down", dense));
    }
  }
  // A tied lm_head is a copy of the embeddings' view: they stay bf16 (looked up, never multiplied).
  PW_RETURN_IF_ERROR(convert(lm_head_, "lm_head", lm_head));
  if (packed_bytes[0] > 0) {
    PW_LOG(INFO) << dir_ << ": dense matrices " << DenseFormatName(dense) << ", lm_head "
                 << DenseFormatName(lm_head) << ": " << packed_bytes[0] / 1e6 << " MB of bf16 in "
                 << packed_bytes[1] / 1e6 << " MB, packed in "
                 << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s";
  }
  if (DenseApBits(dense) > 0 || DenseApBits(lm_head) > 0) {  // the fit takes seconds on large models
    PW_LOG(INFO) << dir_ << ": dense matrices " << DenseFormatName(dense) << ", lm_head "
                 << DenseFormatName(lm_head) << ", made in "
                 << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s on "
                 << threads << " threads";
  }
  return Status::Ok();
}

Status Model::PackExperts(int threads) {
  if (!packed_experts_.empty()) return Internal(dir_ + ": the experts were packed already");
  const auto start = std::chrono::steady_clock::now();
  std::vector<Bf16Matrix*> todo;
  for (LayerWeights& L : layers_) {
    for (MlpWeights& e : L.experts) {
      for (Bf16Matrix* w : {&e.gate, &e.up, &e.down}) {
        if (w->data != nullptr && w->rows > 0) todo.push_back(w);
      }
    }
  }
  std::vector<cpu::PackedBf16Matrix> made(todo.size());
  cpu::ThreadPool pool(threads);
  pool.ParallelFor(todo.size(), 1, 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      made[i] = cpu::PackBf16(todo[i]->data, static_cast<size_t>(todo[i]->rows), static_cast<size_t>(todo[i]->cols));
    }
  });
  double plain = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    plain += static_cast<double>(made[i].PlainBytes());
    const size_t held = KeepIfSmaller(std::move(made[i]), todo[i], &packed_experts_);
    if (todo[i]->packed != nullptr) packed_expert_bytes_ += held;
  }
  PW_LOG(INFO) << dir_ << ": " << packed_experts_.size() << " of " << todo.size() << " expert matrices packed, "
               << plain / 1e6 << " MB of bf16 in " << static_cast<double>(packed_expert_bytes_) / 1e6
               << " MB (those left bf16 not counted), in "
               << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s on "
               << pool.num_threads() << " threads";
  return Status::Ok();
}

}  // namespace pw::engine
