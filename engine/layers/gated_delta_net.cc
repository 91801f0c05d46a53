#include "engine/layers/gated_delta_net.h"

#include <algorithm>
#include <cmath>

#include "engine/ops/linear.h"
#include "kernels/cpu/gated_delta_rule.h"

namespace pw::engine {

namespace {

float Softplus(float x) {
  // torch's F.softplus (beta 1, threshold 20).
  return x > 20.f ? x : std::log1p(std::exp(x));
}

float Sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

}  // namespace

void RunGatedDeltaNet(const LinearAttentionConfig& la, float eps, const GatedDeltaNetWeights& w,
                      std::span<const DeltaNetSequence> seqs, const float* x, size_t T, size_t H,
                      float* out, GatedDeltaNetScratch* scratch, cpu::ThreadPool* threads,
                      const kernels::DenseKernels& k) {
  const size_t nk = static_cast<size_t>(la.num_key_heads);
  const size_t nv = static_cast<size_t>(la.num_value_heads);
  const size_t dk = static_cast<size_t>(la.key_head_dim);
  const size_t dv = static_cast<size_t>(la.value_head_dim);
  const size_t r = nv / nk;
  const size_t kernel = static_cast<size_t>(la.conv_kernel);
  const size_t C = static_cast<size_t>(la.conv_dim());
  // Row t of qkvz / ba: fused, per key head [q, k, v, z] and [b, a]; split, [q, k, v, z] and
  // [b, a] each whole (the conv's channel order).
  const size_t qkvz_w = 2 * nk * dk + 2 * nv * dv, ba_w = 2 * nv;
  const size_t conv_floats = static_cast<size_t>(la.conv_state_floats());
  scratch->qkvz.resize(T * qkvz_w);
  scratch->ba.resize(T * ba_w);
  scratch->core.resize(T * nv * dv);
  if (w.split) {
    float* qkvz = scratch->qkvz.data();
    float* ba = scratch->ba.data();
    Linear(threads, k, x, H, T, w.in_proj_qkv, qkvz, qkvz_w);
    Linear(threads, k, x, H, T, w.in_proj_z, qkvz + C, qkvz_w);
    Linear(threads, k, x, H, T, w.in_proj_b, ba, ba_w);
    Linear(threads, k, x, H, T, w.in_proj_a, ba + nv, ba_w);
  } else {
    Linear(threads, k, x, H, T, w.in_proj_qkvz, scratch->qkvz.data(), qkvz_w);
    Linear(threads, k, x, H, T, w.in_proj_ba, scratch->ba.data(), ba_w);
  }
  const float q_scale = 1.f / std::sqrt(static_cast<float>(dk));
  threads->ParallelFor(seqs.size(), 1, 1, [&](size_t begin, size_t end) {
    std::vector<float> mixed(C), conv(C), z(nv * dv), b(nv), a(nv);
    for (size_t s = begin; s < end; ++s) {
      const DeltaNetSequence& seq = seqs[s];
      float* conv_state = seq.state;
      float* matrices = seq.state + conv_floats;
      for (size_t t = seq.first; t < seq.first + seq.n; ++t) {
        // Per key head g the projection holds [q dk, k dk, v r*dv, z r*dv] and [b r, a r];
        // the conv's channels are all q, then all k, then all v.
        const float* p = &scratch->qkvz[t * qkvz_w];
        const float* pba = &scratch->ba[t * ba_w];
        if (w.split) {
          std::copy(p, p + C, mixed.begin());
          std::copy(p + C, p + C + nv * dv, z.begin());
          std::copy(pba, pba + nv, b.begin());
          std::copy(pba + nv, pba + 2 * nv, a.begin());
        }
        for (size_t g = 0; g < nk && !w.split; ++g) {
          const float* pg = p + g * (2 * dk + 2 * r * dv);
          for (size_t i = 0; i < dk; ++i) {
            mixed[g * dk + i] = pg[i];
            mixed[nk * dk + g * dk + i] = pg[dk + i];
          }
          for (size_t i = 0; i < r * dv; ++i) {
            mixed[2 * nk * dk + g * r * dv + i] = pg[2 * dk + i];
            z[g * r * dv + i] = pg[2 * dk + r * dv + i];
          }
          for (size_t j = 0; j < r; ++j) {
            b[g * r + j] = pba[g * 2 * r + j];
            a[g * r + j] = pba[g * 2 * r + r + j];
          }
        }
        cpu::CausalConv1dSiluStep(mixed.data(), w.conv.data(), C, kernel, conv_state,
                                  conv.data());
        float* q = conv.data();
        float* kk = conv.data() + nk * dk;
        const float* v = conv.data() + 2 * nk * dk;
        for (size_t g = 0; g < nk; ++g) {
          cpu::L2NormalizeInPlace(q + g * dk, dk, 1e-6f);
          cpu::L2NormalizeInPlace(kk + g * dk, dk, 1e-6f);
          for (size_t i = 0; i < dk; ++i) q[g * dk + i] *= q_scale;
        }
        float* o = &scratch->core[t * nv * dv];
        for (size_t h = 0; h < nv; ++h) {
          const size_t g = h / r;
          const float decay =
              -std::exp(w.a_log[h]) * Softplus(a[h] + w.dt_bias[h]);
          cpu::GatedDeltaRuleStep(q + g * dk, kk + g * dk, v + h * dv, decay, Sigmoid(b[h]), dk,
                                  dv, matrices + h * dk * dv, o + h * dv);
          // Gated RMSNorm: norm(o) * weight * silu(z), per value head.
          float ss = 0.f;
          for (size_t j = 0; j < dv; ++j) ss += o[h * dv + j] * o[h * dv + j];
          const float inv = 1.f / std::sqrt(ss / static_cast<float>(dv) + eps);
          for (size_t j = 0; j < dv; ++j) {
            const float zj = z[h * dv + j];
            o[h * dv + j] = o[h * dv + j] * inv * w.norm[j] * (zj * Sigmoid(zj));
          }
        }
      }
    }
  });
  Linear(threads, k, scratch->core.data(), nv * dv, T, w.out_proj, out, H);
}

}  // namespace pw::engine
