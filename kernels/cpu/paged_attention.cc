#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cstring>

namespace pw::cpu {
const float* KvSlab(const PagedKvView& kv, int32_t block, int c, int h, int32_t n, float* widen) {
  const uint8_t* page = kv.pages[static_cast<size_t>(block) * kv.page_stride];
  const size_t offset =
      (static_cast<size_t>(c) * kv.num_kv_heads + h) * kv.block_size * kv.head_dim;
  if (kv.element == KvElement::kF32) return reinterpret_cast<const float*>(page) + offset;
  const auto* src = reinterpret_cast<const uint16_t*>(page) + offset;
  const size_t count = static_cast<size_t>(n) * kv.head_dim;
  for (size_t i = 0; i < count; ++i) widen[i] = Bf16Bits(src[i]);
  return widen;
}

void PagedAttention(const kernels::DenseKernels& k, const PagedKvView& kv,
                    const AttentionQueries& qs, size_t job_begin, size_t job_end, float* scores,
                    float* widen, float* out) {
  const size_t D = static_cast<size_t>(kv.head_dim);
  const size_t nh = static_cast<size_t>(qs.num_heads);
  const size_t group = nh / static_cast<size_t>(kv.num_kv_heads);
  const size_t qd = nh * D;
  const int32_t bs = kv.block_size;
  for (size_t job = job_begin; job < job_end; ++job) {
    const size_t t = job / nh, hd = job % nh;
    const int kvh = static_cast<int>(hd / group);
    const float* q = qs.q + t * qd + hd * D;
    float* o = out + t * qd + hd * D;
    const int32_t n = qs.positions[t] + 1;
    const int32_t* blocks = qs.block_tables[t];
    for (int32_t j0 = 0; j0 < n; j0 += bs) {
      const int32_t jn = std::min(n - j0, bs);
      const float* kb = KvSlab(kv, blocks[j0 / bs], 0, kvh, jn, widen);
      for (int32_t s = 0; s < jn; ++s) scores[j0 + s] = k.dot(q, kb + s * D, D) * qs.scale;
    }
    k.softmax(scores, static_cast<size_t>(n));
    std::memset(o, 0, D * sizeof(float));
    for (int32_t j0 = 0; j0 < n; j0 += bs) {
      const int32_t jn = std::min(n - j0, bs);
      const float* vb = KvSlab(kv, blocks[j0 / bs], 1, kvh, jn, widen);
      for (int32_t s = 0; s < jn; ++s) k.axpy(scores[j0 + s], vb + s * D, D, o);
    }
  }
}

}  // namespace pw::cpu
