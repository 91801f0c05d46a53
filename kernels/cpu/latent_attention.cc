#include "kernels/cpu/latent_attention.h"

#include <algorithm>
#include <cstring>

namespace pw::cpu {

const float* LatentRows(const LatentKvView& kv, int32_t block, int32_t n, float* widen) {
  const uint8_t* page = kv.pages[static_cast<size_t>(block) * kv.page_stride];
  if (kv.element == KvElement::kF32) return reinterpret_cast<const float*>(page);
  const auto* src = reinterpret_cast<const uint16_t*>(page);
  const size_t count = static_cast<size_t>(n) * kv.latent_dim;
  for (size_t i = 0; i < count; ++i) widen[i] = Bf16Bits(src[i]);
  return widen;
}

void LatentAttention(const kernels::DenseKernels& k, const LatentKvView& kv,
                     const AttentionQueries& qs, size_t job_begin, size_t job_end, float* scores,
                     float* widen, float* out) {
  const size_t L = static_cast<size_t>(kv.latent_dim);
  const size_t C = L - static_cast<size_t>(kv.rope_dim);  // the latent's own values
  const size_t nh = static_cast<size_t>(qs.num_heads);
  const int32_t bs = kv.block_size;
  for (size_t job = job_begin; job < job_end; ++job) {
    const size_t t = job / nh, hd = job % nh;
    const float* q = qs.q + (t * nh + hd) * L;
    float* o = out + (t * nh + hd) * C;
    const int32_t n = qs.positions[t] + 1;
    const int32_t* blocks = qs.block_tables[t];
    for (int32_t j0 = 0; j0 < n; j0 += bs) {
      const int32_t jn = std::min(n - j0, bs);
      const float* rows = LatentRows(kv, blocks[j0 / bs], jn, widen);
      for (int32_t s = 0; s < jn; ++s) scores[j0 + s] = k.dot(q, rows + s * L, L) * qs.scale;
    }
    k.softmax(scores, static_cast<size_t>(n));
    std::memset(o, 0, C * sizeof(float));
    for (int32_t j0 = 0; j0 < n; j0 += bs) {
      const int32_t jn = std::min(n - j0, bs);
      const float* rows = LatentRows(kv, blocks[j0 / bs], jn, widen);
      for (int32_t s = 0; s < jn; ++s) k.axpy(scores[j0 + s], rows + s * L, C, o);
    }
  }
}

}  // namespace pw::cpu
