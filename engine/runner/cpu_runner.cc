#include "engine/runner/cpu_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/dtype.h"
#include "engine/models/rope.h"
#include "engine/ops/linear.h"
#include "kernels/cpu/latent_attention.h"
#include "kernels/cpu/window_sink_attention.h"

namespace pw::engine {

CpuRunner::CpuRunner(const Model& model, memory::KvBlockPool* kv, int num_threads)
    : model_(model),
      cfg_(model.config()),
      kv_(kv),
      threads_(num_threads),
      k_(cpu::Kernels()),
      bf16_provider_(model) {}

void CpuRunner::SetHooks(const MoeHooks& hooks) { hooks_ = hooks; }

Status CpuRunner::Forward(const Batch& batch, std::vector<float>* logits) {
  const size_t T = Prepare(batch.items);
  if (T == 0) return Status::Ok();
  using Clock = std::chrono::steady_clock;
  if (times_ != nullptr) ++times_->passes;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const LayerWeights& w = model_.layers()[static_cast<size_t>(l)];
    const Clock::time_point t0 = times_ != nullptr ? Clock::now() : Clock::time_point{};
    BlockKind kind = BlockKind::kFullAttention;
    if (w.is_linear_attention) {
      kind = BlockKind::kLinearAttention;
      LinearAttentionBlock(static_cast<int>(l), w, T, batch.items);
    } else if (w.is_mla) {
      kind = BlockKind::kLatentAttention;
      MlaAttentionBlock(static_cast<int>(l), w, T);
    } else {
      AttentionBlock(static_cast<int>(l), w, T);
    }
    const Clock::time_point t1 = times_ != nullptr ? Clock::now() : Clock::time_point{};
    PW_RETURN_IF_ERROR(MlpBlock(static_cast<int>(l), w, T, batch.pure_decode));
    if (times_ != nullptr) {
      times_->Add(kind, std::chrono::duration<double>(t1 - t0).count());
      times_->Add(BlockKind::kMlp, std::chrono::duration<double>(Clock::now() - t1).count());
    }
  }
  Logits(batch.items, logits);
  return Status::Ok();
}

size_t CpuRunner::Prepare(std::span<const ForwardItem> items) {
  const size_t H = static_cast<size_t>(cfg_.hidden_size);
  // The widest layer's q and k/v rows (gemma4's full layers may be wider than the others).
  const size_t qd = static_cast<size_t>(cfg_.num_heads * cfg_.MaxHeadDim());
  const size_t kvd = static_cast<size_t>(cfg_.MaxKvWidth());
  size_t T = 0;
  for (const ForwardItem& it : items) T += static_cast<size_t>(it.n);
  if (T == 0) return 0;
  tok_seq_.resize(T);
  tok_pos_.resize(T);
  tok_blocks_.resize(T);
  x_.resize(T * H);
  h_.resize(T * H);
  q_.resize(T * qd);
  k_buf_.resize(T * kvd);
  v_buf_.resize(T * kvd);
  attn_.resize(T * qd);
  tmp_.resize(T * H);
  // Pairs of each table: rotary_dim / 2, the full layers' own head size / 2 (gemma4).
  const size_t half = model_.rope().inv_freq.size();
  const size_t sliding_half = model_.sliding_rope().inv_freq.size();
  cos_.resize(T * half);
  sin_.resize(T * half);
  const bool sliding_rope = sliding_half > 0;
  if (sliding_rope) {
    sliding_cos_.resize(T * sliding_half);
    sliding_sin_.resize(T * sliding_half);
  }
  // Gemma's embeddings are scaled by sqrt(hidden) (fp32, as HF's fp32 reference).
  const float embed_scale =
      cfg_.scale_embeddings ? static_cast<float>(std::sqrt(static_cast<double>(H))) : 1.f;
  size_t t = 0;
  for (const ForwardItem& it : items) {
    // Dynamic NTK RoPE past max_position_embeddings: the frequencies HF computes for a pass
    // reaching this item's last position.
    RopeTable grown;
    const int64_t reach = static_cast<int64_t>(it.start_pos) + it.n;
    if (RopeDependsOnLength(cfg_, reach)) grown = ComputeRope(cfg_, reach);
    const RopeTable& rope = grown.inv_freq.empty() ? model_.rope() : grown;
    const std::vector<float>& inv_freq = rope.inv_freq;
    const float mscale = rope.attention_factor;
    for (int i = 0; i < it.n; ++i, ++t) {
      const int32_t id = it.tokens[i];
      PW_CHECK(id >= 0 && static_cast<int64_t>(id) < cfg_.vocab_size);
      tok_seq_[t] = it.seq_id;
      tok_pos_[t] = it.start_pos + i;
      tok_blocks_[t] = it.blocks;
      const uint16_t* row = model_.embed().data + static_cast<size_t>(id) * H;
      for (size_t j = 0; j < H; ++j) x_[t * H + j] = cpu::Bf16Bits(row[j]) * embed_scale;
      const float pos = static_cast<float>(tok_pos_[t]);
      for (size_t j = 0; j < half; ++j) {
        const float angle = pos * inv_freq[j];
        cos_[t * half + j] = static_cast<float>(std::cos(static_cast<double>(angle))) * mscale;
        sin_[t * half + j] = static_cast<float>(std::sin(static_cast<double>(angle))) * mscale;
      }
      if (sliding_rope) {
        const RopeTable& sr = model_.sliding_rope();
        for (size_t j = 0; j < sliding_half; ++j) {
          const double angle = static_cast<double>(pos * sr.inv_freq[j]);
          sliding_cos_[t * sliding_half + j] =
              static_cast<float>(std::cos(angle)) * sr.attention_factor;
          sliding_sin_[t * sliding_half + j] =
              static_cast<float>(std::sin(angle)) * sr.attention_factor;
        }
      }
    }
  }
  return T;
}

void CpuRunner::AttentionBlock(int layer, const LayerWeights& w, size_t T) {
  const size_t H = static_cast<size_t>(cfg_.hidden_size);
  const size_t D = static_cast<size_t>(cfg_.LayerHeadDim(layer));
  const size_t qd = static_cast<size_t>(cfg_.num_heads) * D;
  const size_t kvd = static_cast<size_t>(cfg_.LayerKvHeads(layer)) * D;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  for (size_t i = 0; i < T; ++i) k_.rms_norm(&x_[i * H], w.input_norm.data(), H, eps, &h_[i * H]);
  const bool gated = model_.family().attention_output_gate;
  if (gated) {
    // Per head, q_proj gives the query then its gate (HF Qwen3NextAttention).
    q_wide_.resize(T * 2 * qd);
    gate_.resize(T * qd);
    Linear(&threads_, k_, h_.data(), H, T, w.q, q_wide_.data(), 2 * qd);
    for (size_t i = 0; i < T; ++i) {
      for (size_t hd = 0; hd < qd / D; ++hd) {
        const float* src = &q_wide_[i * 2 * qd + hd * 2 * D];
        std::memcpy(&q_[i * qd + hd * D], src, D * sizeof(float));
        std::memcpy(&gate_[i * qd + hd * D], src + D, D * sizeof(float));
      }
    }
  } else {
    Linear(&threads_, k_, h_.data(), H, T, w.q, q_.data(), qd);
  }
  Linear(&threads_, k_, h_.data(), H, T, w.k, k_buf_.data(), kvd);
  if (w.v.data != nullptr) {
    Linear(&threads_, k_, h_.data(), H, T, w.v, v_buf_.data(), kvd);
  } else {
    // attention_k_eq_v (gemma4's full layers): the values are the keys' projection.
    std::memcpy(v_buf_.data(), k_buf_.data(), T * kvd * sizeof(float));
  }
  for (size_t i = 0; i < T; ++i) {
    ShapeQkv(layer, w, i);
    WriteKv(layer, i);
  }
  Attention(layer, T);
  if (gated) {
    for (size_t j = 0; j < T * qd; ++j) attn_[j] *= 1.f / (1.f + std::exp(-gate_[j]));
  }
  Linear(&threads_, k_, attn_.data(), qd, T, w.o, tmp_.data(), H);
  for (size_t i = 0; i < T; ++i) {
    if (!w.o_bias.empty()) k_.axpy(1.f, w.o_bias.data(), H, &tmp_[i * H]);
    if (!w.attn_out_norm.empty()) {
      k_.rms_norm(&tmp_[i * H], w.attn_out_norm.data(), H, eps, &tmp_[i * H]);
    }
    k_.axpy(1.f, &tmp_[i * H], H, &x_[i * H]);
  }
}

void CpuRunner::MlaAttentionBlock(int layer, const LayerWeights& lw, size_t T) {
  const MlaConfig& m = cfg_.mla;
  const MlaWeights& w = lw.mla;
  const size_t H = static_cast<size_t>(cfg_.hidden_size);
  const size_t nh = static_cast<size_t>(cfg_.num_heads);
  const size_t r = static_cast<size_t>(m.kv_lora_rank);
  const size_t rope = static_cast<size_t>(m.qk_rope_head_dim);
  const size_t nope = static_cast<size_t>(m.qk_nope_head_dim);
  const size_t vd = static_cast<size_t>(m.v_head_dim);
  const size_t qk = nope + rope, L = r + rope;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  // q_a_layernorm and kv_a_layernorm are built with the RMSNorm's default eps (HF
  // DeepseekV3RMSNorm(dim)), not rms_norm_eps.
  constexpr float kLatentNormEps = 1e-6f;
  for (size_t i = 0; i < T; ++i) k_.rms_norm(&x_[i * H], lw.input_norm.data(), H, eps, &h_[i * H]);
  mla_q_.resize(T * nh * qk);
  if (m.q_lora_rank > 0) {
    const size_t qr = static_cast<size_t>(m.q_lora_rank);
    mla_qa_.resize(T * qr);
    Linear(&threads_, k_, h_.data(), H, T, w.q_a, mla_qa_.data(), qr);
    for (size_t i = 0; i < T; ++i) {
      float* a = &mla_qa_[i * qr];
      if (!w.q_a_bias.empty()) k_.axpy(1.f, w.q_a_bias.data(), qr, a);
      k_.rms_norm(a, w.q_a_norm.data(), qr, kLatentNormEps, a);
    }
    Linear(&threads_, k_, mla_qa_.data(), qr, T, w.q_b, mla_q_.data(), nh * qk);
  } else {
    Linear(&threads_, k_, h_.data(), H, T, w.q, mla_q_.data(), nh * qk);
  }
  mla_kv_.resize(T * L);
  Linear(&threads_, k_, h_.data(), H, T, w.kv_a, mla_kv_.data(), L);
  // RoPE on each head's last `rope` query dims and on the shared key: HF rotates interleaved
  // pairs (2j, 2j+1) into the half layout (rope_interleave), else halves (j, j + half) in place.
  const size_t half = rope / 2;
  std::vector<float> tmp(rope);
  auto rotate = [&](float* v, const float* c, const float* s) {
    if (m.rope_interleave) {
      for (size_t j = 0; j < half; ++j) {
        const float x1 = v[2 * j], x2 = v[2 * j + 1];
        tmp[j] = x1 * c[j] - x2 * s[j];
        tmp[j + half] = x2 * c[j] + x1 * s[j];
      }
      std::memcpy(v, tmp.data(), rope * sizeof(float));
    } else {
      for (size_t j = 0; j < half; ++j) {
        const float x1 = v[j], x2 = v[j + half];
        v[j] = x1 * c[j] - x2 * s[j];
        v[j + half] = x2 * c[j] + x1 * s[j];
      }
    }
  };
  const int bs = kv_->layout().block_size;
  const bool bf16 = kv_->layout().dtype == memory::KvDtype::kBf16;
  for (size_t i = 0; i < T; ++i) {
    float* kv = &mla_kv_[i * L];
    if (!w.kv_a_bias.empty()) k_.axpy(1.f, w.kv_a_bias.data(), L, kv);
    k_.rms_norm(kv, w.kv_a_norm.data(), r, kLatentNormEps, kv);
    const float* c = &cos_[i * half];
    const float* s = &sin_[i * half];
    rotate(kv + r, c, s);
    for (size_t hd = 0; hd < nh; ++hd) rotate(&mla_q_[(i * nh + hd) * qk + nope], c, s);
    // The latent row of this token: the normalised latent, then the rotated key.
    const int32_t pos = tok_pos_[i];
    uint8_t* page = kv_->LayerPage(tok_blocks_[i][pos / bs], layer);
    const size_t row = static_cast<size_t>(pos % bs) * L;
    if (bf16) {
      uint16_t* dst = reinterpret_cast<uint16_t*>(page) + row;
      for (size_t d = 0; d < L; ++d) dst[d] = F32ToBf16(kv[d]);
    } else {
      std::memcpy(reinterpret_cast<float*>(page) + row, kv, L * sizeof(float));
    }
  }
  // Absorbed queries: per head W_UK^T q_nope (r values), then the rotated q_rope.
  mla_qabs_.resize(T * nh * L);
  HeadsLinear(&threads_, k_, nh, mla_q_.data(), qk, nh * qk, T, w.uk_t.data, r * nope, r, nope,
              mla_qabs_.data(), L, nh * L);
  for (size_t i = 0; i < T; ++i) {
    for (size_t hd = 0; hd < nh; ++hd) {
      std::memcpy(&mla_qabs_[(i * nh + hd) * L + r], &mla_q_[(i * nh + hd) * qk + nope],
                  rope * sizeof(float));
    }
  }
  int32_t max_pos = 0;
  for (size_t i = 0; i < T; ++i) max_pos = std::max(max_pos, tok_pos_[i]);
  const size_t work = static_cast<size_t>(max_pos + 1) * L * 2;
  const size_t min_per = std::max<size_t>(1, kMinParallelMacs / std::max<size_t>(1, work));
  const cpu::LatentKvView view = kv_->LatentView(layer, static_cast<int>(rope));
  cpu::AttentionQueries qs;
  qs.q = mla_qabs_.data();
  qs.T = T;
  qs.num_heads = static_cast<int>(nh);
  qs.positions = tok_pos_.data();
  qs.block_tables = tok_blocks_.data();
  qs.scale = static_cast<float>(m.softmax_scale);
  mla_lat_.resize(T * nh * r);
  threads_.ParallelFor(T * nh, 1, min_per, [&](size_t begin, size_t end) {
    std::vector<float> scores(cpu::PagedAttentionScoreFloats(max_pos));
    std::vector<float> widen(cpu::LatentAttentionWidenFloats(view));
    cpu::LatentAttention(k_, view, qs, begin, end, scores.data(), widen.data(), mla_lat_.data());
  });
  // Each head's value: W_UV (rows nope.. of the head's block of kv_b) times its latent.
  attn_.resize(T * nh * vd);
  HeadsLinear(&threads_, k_, nh, mla_lat_.data(), r, nh * r, T, w.kv_b.data + nope * r,
              (nope + vd) * r, vd, r, attn_.data(), vd, nh * vd);
  Linear(&threads_, k_, attn_.data(), nh * vd, T, w.o, tmp_.data(), H);
  for (size_t i = 0; i < T; ++i) {
    if (!w.o_bias.empty()) k_.axpy(1.f, w.o_bias.data(), H, &tmp_[i * H]);
    k_.axpy(1.f, &tmp_[i * H], H, &x_[i * H]);
  }
}

void CpuRunner::LinearAttentionBlock(int layer, const LayerWeights& w, size_t T,
                                     std::span<const ForwardItem> items) {
  const size_t H = static_cast<size_t>(cfg_.hidden_size);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const LinearAttentionConfig& la = cfg_.linear_attention;
  const size_t per_seq = static_cast<size_t>(la.state_floats());
  for (size_t i = 0; i < T; ++i) k_.rms_norm(&x_[i * H], w.input_norm.data(), H, eps, &h_[i * H]);
  states_.resize(items.size() * per_seq);
  delta_seqs_.clear();
  size_t t = 0;
  for (size_t s = 0; s < items.size(); ++s) {
    const ForwardItem& it = items[s];
    float* state = &states_[s * per_seq];
    // A sequence starts from a zero state; later chunks and decode steps continue its own.
    if (it.start_pos == 0) {
      std::fill(state, state + per_seq, 0.f);
    } else {
      kv_->ReadState(it.blocks[0], layer, state);
    }
    delta_seqs_.push_back({t, static_cast<size_t>(it.n), state});
    t += static_cast<size_t>(it.n);
  }
  RunGatedDeltaNet(la, eps, w.linear, delta_seqs_, h_.data(), T, H, tmp_.data(), &delta_,
                   &threads_, k_);
  for (size_t s = 0; s < items.size(); ++s) {
    if (items[s].n > 0) kv_->WriteState(items[s].blocks[0], layer, &states_[s * per_seq]);
  }
  for (size_t i = 0; i < T; ++i) k_.axpy(1.f, &tmp_[i * H], H, &x_[i * H]);
}

void CpuRunner::ShapeQkv(int layer, const LayerWeights& w, size_t i) {
  const size_t D = static_cast<size_t>(cfg_.LayerHeadDim(layer));
  const size_t nh = static_cast<size_t>(cfg_.num_heads);
  const size_t nkv = static_cast<size_t>(cfg_.LayerKvHeads(layer));
  const size_t qd = nh * D, kvd = nkv * D;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  float* q = &q_[i * qd];
  float* kk = &k_buf_[i * kvd];
  float* vv = &v_buf_[i * kvd];
  if (!w.q_bias.empty()) {
    k_.axpy(1.f, w.q_bias.data(), qd, q);
    k_.axpy(1.f, w.k_bias.data(), kvd, kk);
    k_.axpy(1.f, w.v_bias.data(), kvd, vv);
  }
  if (cfg_.qk_norm == QkNorm::kFull) {
    k_.rms_norm(q, w.q_norm.data(), qd, eps, q);
    k_.rms_norm(kk, w.k_norm.data(), kvd, eps, kk);
  }
  if (cfg_.clip_qkv) {
    const float c = static_cast<float>(*cfg_.clip_qkv);
    for (size_t j = 0; j < qd; ++j) q[j] = std::clamp(q[j], -c, c);
    for (size_t j = 0; j < kvd; ++j) {
      kk[j] = std::clamp(kk[j], -c, c);
      vv[j] = std::clamp(vv[j], -c, c);
    }
  }
  if (cfg_.qk_norm == QkNorm::kPerHead) {
    for (size_t hd = 0; hd < nh; ++hd) k_.rms_norm(q + hd * D, w.q_norm.data(), D, eps, q + hd * D);
    for (size_t hd = 0; hd < nkv; ++hd) {
      k_.rms_norm(kk + hd * D, w.k_norm.data(), D, eps, kk + hd * D);
    }
  }
  if (cfg_.v_norm) {
    // gemma4: RMSNorm without weights over each value head.
    ones_.assign(D, 1.f);
    for (size_t hd = 0; hd < nkv; ++hd) k_.rms_norm(vv + hd * D, ones_.data(), D, eps, vv + hd * D);
  }
  // RoPE, rotate-half convention over the first R = rotary_dim dims of each head (the rest
  // pass through, as HF's partial rotary): (x1, x2) -> (x1 c - x2 s, x2 c + x1 s). R is the
  // table's: gemma4's full layers rotate over their own head size.
  const bool own = w.sliding_window > 0 && !sliding_cos_.empty();  // the sliding layers' RoPE
  const size_t half = (own ? model_.sliding_rope() : model_.rope()).inv_freq.size();
  const float* c = own ? &sliding_cos_[i * half] : &cos_[i * half];
  const float* s = own ? &sliding_sin_[i * half] : &sin_[i * half];
  auto rope = [&](float* v) {
    for (size_t j = 0; j < half; ++j) {
      const float x1 = v[j], x2 = v[j + half];
      v[j] = x1 * c[j] - x2 * s[j];
      v[j + half] = x2 * c[j] + x1 * s[j];
    }
  };
  for (size_t hd = 0; hd < nh; ++hd) rope(q + hd * D);
  for (size_t hd = 0; hd < nkv; ++hd) rope(kk + hd * D);
}

void CpuRunner::WriteKv(int layer, size_t i) {
  const size_t D = static_cast<size_t>(cfg_.LayerHeadDim(layer));
  const size_t nkv = static_cast<size_t>(cfg_.LayerKvHeads(layer));
  const float* kk = &k_buf_[i * nkv * D];
  const float* vv = &v_buf_[i * nkv * D];
  const int bs = kv_->layout().block_size;
  const int32_t pos = tok_pos_[i];
  const int32_t block = tok_blocks_[i][pos / bs];
  const size_t slot = static_cast<size_t>(pos % bs);
  const bool bf16 = kv_->layout().dtype == memory::KvDtype::kBf16;
  for (size_t hd = 0; hd < nkv; ++hd) {
    const int h = static_cast<int>(hd);
    if (bf16) {
      uint16_t* kd = kv_->SlabBf16(block, layer, 0, h) + slot * D;
      uint16_t* vd = kv_->SlabBf16(block, layer, 1, h) + slot * D;
      for (size_t d = 0; d < D; ++d) {
        kd[d] = F32ToBf16(kk[hd * D + d]);
        vd[d] = F32ToBf16(vv[hd * D + d]);
      }
    } else {
      std::memcpy(kv_->Slab(block, layer, 0, h) + slot * D, kk + hd * D, D * sizeof(float));
      std::memcpy(kv_->Slab(block, layer, 1, h) + slot * D, vv + hd * D, D * sizeof(float));
    }
  }
}

void CpuRunner::Attention(int layer, size_t T) {
  const size_t D = static_cast<size_t>(cfg_.LayerHeadDim(layer));
  const size_t nh = static_cast<size_t>(cfg_.num_heads);
  int32_t max_pos = 0;
  for (size_t i = 0; i < T; ++i) max_pos = std::max(max_pos, tok_pos_[i]);
  const size_t work = static_cast<size_t>(max_pos + 1) * D * T * nh;
  const size_t min_per =
      std::max<size_t>(1, kMinParallelMacs / std::max<size_t>(1, work / (T * nh)));
  const cpu::PagedKvView kv = kv_->LayerView(layer);
  cpu::AttentionQueries qs;
  qs.q = q_.data();
  qs.T = T;
  qs.num_heads = static_cast<int>(nh);
  qs.positions = tok_pos_.data();
  qs.block_tables = tok_blocks_.data();
  qs.scale = cfg_.attention_scale > 0 ? static_cast<float>(cfg_.attention_scale)
                                      : 1.0f / std::sqrt(static_cast<float>(D));
  // A sliding window or sinks (gpt_oss) take the kernel that has them.
  const LayerWeights& w = model_.layers()[static_cast<size_t>(layer)];
  if (w.sliding_window > 0 || !w.sinks.empty()) {
    const cpu::WindowSinks ws{w.sliding_window, w.sinks.empty() ? nullptr : w.sinks.data()};
    threads_.ParallelFor(T * nh, 1, min_per, [&](size_t begin, size_t end) {
      std::vector<float> scores(cpu::WindowSinkAttentionScoreFloats(max_pos));
      std::vector<float> widen(cpu::PagedAttentionWidenFloats(kv));
      cpu::WindowSinkAttention(k_, kv, qs, ws, begin, end, scores.data(), widen.data(),
                               attn_.data());
    });
    return;
  }
  threads_.ParallelFor(T * nh, 1, min_per, [&](size_t begin, size_t end) {
    std::vector<float> scores(cpu::PagedAttentionScoreFloats(max_pos));
    std::vector<float> widen(cpu::PagedAttentionWidenFloats(kv));
    cpu::PagedAttention(k_, kv, qs, begin, end, scores.data(), widen.data(), attn_.data());
  });
}

Status CpuRunner::MlpBlock(int layer, const LayerWeights& w, size_t T, bool pure_decode) {
  if (model_.family().sandwich != nullptr) return SandwichMlpBlock(layer, w, T, pure_decode);
  const size_t H = static_cast<size_t>(cfg_.hidden_size);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  for (size_t i = 0; i < T; ++i) {
    k_.rms_norm(&x_[i * H], w.post_attn_norm.data(), H, eps, &h_[i * H]);
  }
  if (w.is_moe) {
    const RoutingContext ctx = Routing(layer, T, pure_decode);
    ExpertWeightProvider* provider = hooks_.provider ? hooks_.provider : &bf16_provider_;
    PW_RETURN_IF_ERROR(
        RunMoeLayer(cfg_, w, ctx, h_.data(), tmp_.data(), hooks_, provider, &moe_, &threads_, k_));
  } else {
    PW_RETURN_IF_ERROR(RunDenseMlp(w.mlp, model_.family().activation, h_.data(), T, H, tmp_.data(),
                                   &mlp_tmp_, &threads_, k_));
  }
  for (size_t i = 0; i < T; ++i) k_.axpy(1.f, &tmp_[i * H], H, &x_[i * H]);
  return Status::Ok();
}

RoutingContext CpuRunner::Routing(int layer, size_t T, bool pure_decode) {
  RoutingContext ctx;
  ctx.layer = layer;
  ctx.num_tokens = static_cast<int>(T);
  ctx.pure_decode = pure_decode;
  ctx.seq_ids = tok_seq_.data();
  ctx.positions = tok_pos_.data();
  ctx.residency = hooks_.residency ? hooks_.residency : &all_resident_;
  ctx.fetcher = hooks_.fetcher;
  return ctx;
}

Status CpuRunner::SandwichMlpBlock(int layer, const LayerWeights& w, size_t T, bool pure_decode) {
  // HF Gemma4TextDecoderLayer: y = dense(pre_ff_norm(x)); with experts,
  // y = dense_out_norm(y) + experts_out_norm(experts(experts_in_norm(x)) routed by
  // rms(x) * scale); x = (x + ffn_out_norm(y)) * layer_scalar.
  const size_t H = static_cast<size_t>(cfg_.hidden_size);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  for (size_t i = 0; i < T; ++i) {
    k_.rms_norm(&x_[i * H], w.post_attn_norm.data(), H, eps, &h_[i * H]);
  }
  PW_RETURN_IF_ERROR(RunDenseMlp(w.mlp, model_.family().activation, h_.data(), T, H, tmp_.data(),
                                 &mlp_tmp_, &threads_, k_));
  if (w.is_moe) {
    router_x_.resize(T * H);
    moe_out_.resize(T * H);
    ones_.assign(H, 1.f);
    for (size_t i = 0; i < T; ++i) {
      k_.rms_norm(&tmp_[i * H], w.dense_out_norm.data(), H, eps, &tmp_[i * H]);
      float* r = &router_x_[i * H];
      k_.rms_norm(&x_[i * H], ones_.data(), H, eps, r);
      for (size_t j = 0; j < H; ++j) r[j] *= w.router_input_scale[j];
      k_.rms_norm(&x_[i * H], w.experts_in_norm.data(), H, eps, &h_[i * H]);
    }
    ExpertWeightProvider* provider = hooks_.provider ? hooks_.provider : &bf16_provider_;
    PW_RETURN_IF_ERROR(RunMoeLayer(cfg_, w, Routing(layer, T, pure_decode), h_.data(),
                                   moe_out_.data(), hooks_, provider, &moe_, &threads_, k_,
                                   router_x_.data()));
    for (size_t i = 0; i < T; ++i) {
      k_.rms_norm(&moe_out_[i * H], w.experts_out_norm.data(), H, eps, &moe_out_[i * H]);
      k_.axpy(1.f, &moe_out_[i * H], H, &tmp_[i * H]);
    }
  }
  for (size_t i = 0; i < T; ++i) {
    k_.rms_norm(&tmp_[i * H], w.ffn_out_norm.data(), H, eps, &tmp_[i * H]);
    float* x = &x_[i * H];
    k_.axpy(1.f, &tmp_[i * H], H, x);
    if (w.layer_scalar != 1.f) {
      for (size_t j = 0; j < H; ++j) x[j] *= w.layer_scalar;
    }
  }
  return Status::Ok();
}

void CpuRunner::Logits(std::span<const ForwardItem> items, std::vector<float>* logits) {
  const size_t H = static_cast<size_t>(cfg_.hidden_size);
  const size_t V = static_cast<size_t>(cfg_.vocab_size);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  size_t rows = 0;
  size_t t = 0;
  for (const ForwardItem& it : items) {
    const size_t n = static_cast<size_t>(it.n);
    size_t first = n;
    if (it.logits == LogitsWanted::kAll) first = 0;
    if (it.logits == LogitsWanted::kLast) first = n - 1;
    for (size_t i = first; i < n; ++i, ++rows) {
      k_.rms_norm(&x_[(t + i) * H], model_.final_norm().data(), H, eps, &h_[rows * H]);
    }
    t += n;
  }
  if (rows > 0) {
    const size_t old = logits->size();
    logits->resize(old + rows * V);
    Linear(&threads_, k_, h_.data(), H, rows, model_.lm_head(), logits->data() + old, V);
    if (cfg_.final_logit_softcapping > 0) {
      const float cap = static_cast<float>(cfg_.final_logit_softcapping);
      for (float* l = logits->data() + old; l != logits->data() + logits->size(); ++l) {
        *l = cap * std::tanh(*l / cap);
      }
    }
  }
}

}  // namespace pw::engine
