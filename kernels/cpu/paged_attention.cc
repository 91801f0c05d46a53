#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/attention_tiles.h"

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
  if (job_begin >= job_end) return;
  // Per head, the tokens whose job is in range: [t_lo, t_hi) with t * nh + hd in it.
  for (size_t hd = 0; hd < nh; ++hd) {
    const size_t t_lo = job_begin > hd ? (job_begin - hd + nh - 1) / nh : 0;
    const size_t t_hi = job_end > hd ? (job_end - hd - 1) / nh + 1 : 0;
    const int kvh = static_cast<int>(hd / group);
    for (size_t t0 = t_lo; t0 < t_hi;) {
      // A tile: consecutive tokens of one block table.
      const int32_t* blocks = qs.block_tables[t0];
      size_t t1 = t0 + 1;
      while (t1 < t_hi && t1 - t0 < kAttentionQueryTile && qs.block_tables[t1] == blocks) ++t1;
      const size_t nq = t1 - t0;
      int32_t n_max = 0;
      for (size_t i = 0; i < nq; ++i) n_max = std::max(n_max, qs.positions[t0 + i] + 1);
      const size_t row = static_cast<size_t>(n_max);
      for (int32_t j0 = 0; j0 < n_max; j0 += bs) {
        // Every query of the tile against the block's keys up to the tile's last position: a
        // query's scores past its own position are written (inside its row) and never read.
        const int32_t jn = std::min(n_max - j0, bs);
        const float* kb = KvSlab(kv, blocks[j0 / bs], 0, kvh, jn, widen);
        AttentionDots(k, qs.q + t0 * qd + hd * D, qd, nq, kb, static_cast<size_t>(jn), D, qs.scale,
                      scores + j0, row);
      }
      for (size_t i = 0; i < nq; ++i) {
        k.softmax(scores + i * row, static_cast<size_t>(qs.positions[t0 + i] + 1));
        std::memset(out + (t0 + i) * qd + hd * D, 0, D * sizeof(float));
      }
      for (int32_t j0 = 0; j0 < n_max; j0 += bs) {
        const float* vb = KvSlab(kv, blocks[j0 / bs], 1, kvh, std::min(n_max - j0, bs), widen);
        for (size_t i = 0; i < nq; ++i) {
          const int32_t n = qs.positions[t0 + i] + 1;
          if (j0 >= n) continue;
          const float* sc = scores + i * row;
          float* o = out + (t0 + i) * qd + hd * D;
          AttentionAxpys(k, sc + j0, static_cast<size_t>(std::min(n - j0, bs)), vb, D, o);
        }
      }
      t0 = t1;
    }
  }
}

}  // namespace pw::cpu
