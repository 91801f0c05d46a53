#include "bench/decode_bytes.h"

#include <algorithm>
#include <initializer_list>
#include <vector>

#include "memory/kv_spec.h"

namespace pw::bench {
namespace {

using engine::Bf16Matrix;
using engine::MlpWeights;

double Matrix(const Bf16Matrix& m) {
  if (m.data == nullptr) return 0;
  if (m.ap != nullptr) return static_cast<double>(m.ap->Bytes());
  if (m.packed != nullptr) return static_cast<double>(m.packed->Bytes());
  return static_cast<double>(m.rows) * static_cast<double>(m.cols) * (m.q8 != nullptr ? 1 : 2);
}

double Floats(std::initializer_list<const std::vector<float>*> vs) {
  double n = 0;
  for (const std::vector<float>* v : vs) n += static_cast<double>(v->size());
  return 4 * n;
}

double Mlp(const MlpWeights& m) { return Matrix(m.gate) + Matrix(m.up) + Matrix(m.down); }

double LayerWeightBytes(const engine::LayerWeights& w) {
  double b = Floats({&w.input_norm, &w.post_attn_norm});
  b += Matrix(w.q) + Matrix(w.k) + Matrix(w.v) + Matrix(w.o);
  b += Floats({&w.q_bias, &w.k_bias, &w.v_bias, &w.o_bias, &w.q_norm, &w.k_norm, &w.sinks});
  if (w.is_linear_attention) {
    const engine::GatedDeltaNetWeights& g = w.linear;
    b += Matrix(g.in_proj_qkvz) + Matrix(g.in_proj_ba) + Matrix(g.in_proj_qkv) +
         Matrix(g.in_proj_z) + Matrix(g.in_proj_b) + Matrix(g.in_proj_a) + Matrix(g.out_proj);
    b += Floats({&g.conv, &g.dt_bias, &g.a_log, &g.norm});
  }
  if (w.is_mla) {
    // The absorbed attention reads W_UK through its transposed copy (uk_t) and W_UV from kv_b:
    // kv_b's bytes once.
    const engine::MlaWeights& m = w.mla;
    b += Matrix(m.q) + Matrix(m.q_a) + Matrix(m.q_b) + Matrix(m.kv_a) + Matrix(m.kv_b) + Matrix(m.o);
    b += Floats({&m.q_a_bias, &m.q_a_norm, &m.kv_a_bias, &m.kv_a_norm, &m.o_bias});
  }
  if (w.is_moe) {
    b += Matrix(w.router) + Floats({&w.router_bias, &w.router_logits_bias});
    if (w.has_shared_expert) b += Mlp(w.shared_expert) + Matrix(w.shared_expert_gate);
    b += Floats({&w.router_input_scale, &w.expert_weight_scale});
  }
  b += Mlp(w.mlp);  // a dense layer, or the dense MLP beside the experts (gemma4)
  b += Floats({&w.attn_out_norm, &w.ffn_out_norm, &w.dense_out_norm, &w.experts_in_norm,
               &w.experts_out_norm});
  return b;
}

}  // namespace

StepBytes DecodeStepBytes(const engine::Model& model, int batch, double ctx, double kv_elem_bytes,
                          double expert_bytes_per_moe_layer) {
  const ModelConfig& c = model.config();
  const double B = batch, H = static_cast<double>(c.hidden_size);
  const std::vector<memory::KvLayerSpec> specs = memory::ModelKvSpecs(c);
  StepBytes s;
  for (size_t l = 0; l < model.layers().size(); ++l) {
    const engine::LayerWeights& w = model.layers()[l];
    s.weights += LayerWeightBytes(w);
    if (w.is_moe) s.experts += expert_bytes_per_moe_layer;
    const memory::KvLayerSpec& spec = specs[l];
    const int64_t layer = static_cast<int64_t>(l);
    const double kv_width = 2 * static_cast<double>(c.LayerKvHeads(layer) * c.LayerHeadDim(layer));
    switch (spec.kind) {
      case memory::KvKind::kFullAttention:
        s.kv += B * ctx * kv_width * kv_elem_bytes;
        break;
      case memory::KvKind::kSlidingWindow:
        s.kv += B * std::min(ctx, static_cast<double>(spec.window)) * kv_width * kv_elem_bytes;
        break;
      case memory::KvKind::kLatent:
        s.kv += B * ctx * spec.latent_dim * kv_elem_bytes;
        break;
      case memory::KvKind::kRecurrentState:
        s.state += B * 2 * static_cast<double>(spec.state_bytes);
        break;
    }
  }
  s.weights += Matrix(model.lm_head()) + 4 * static_cast<double>(model.final_norm().size());
  s.weights += B * H * 2;  // the embedding rows
  return s;
}

}  // namespace pw::bench
