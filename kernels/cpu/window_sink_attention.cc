#include "kernels/cpu/window_sink_attention.h"

#include <algorithm>
#include <cstring>

namespace pw::cpu {
void WindowSinkAttention(const kernels::DenseKernels& k, const PagedKvView& kv,
                         const AttentionQueries& qs, const WindowSinks& ws, size_t job_begin,
                         size_t job_end, float* scores, float* widen, float* out) {
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
    const int32_t end = qs.positions[t] + 1;
    const int32_t begin = ws.window > 0 ? std::max(0, end - ws.window) : 0;
    const int32_t n = end - begin;
    const int32_t* blocks = qs.block_tables[t];
    // Positions [begin, end) in block-sized runs: run j covers [j, min(end, next boundary)).
    for (int32_t j = begin; j < end;) {
      const int32_t s0 = j % bs, jn = std::min(end - j, bs - s0);
      const float* kb = KvSlab(kv, blocks[j / bs], 0, kvh, s0 + jn, widen);
      for (int32_t s = 0; s < jn; ++s) {
        scores[j - begin + s] = k.dot(q, kb + (s0 + s) * D, D) * qs.scale;
      }
      j += jn;
    }
    size_t columns = static_cast<size_t>(n);
    if (ws.sinks != nullptr) scores[columns++] = ws.sinks[hd];
    k.softmax(scores, columns);
    std::memset(o, 0, D * sizeof(float));
    for (int32_t j = begin; j < end;) {
      const int32_t s0 = j % bs, jn = std::min(end - j, bs - s0);
      const float* vb = KvSlab(kv, blocks[j / bs], 1, kvh, s0 + jn, widen);
      for (int32_t s = 0; s < jn; ++s) k.axpy(scores[j - begin + s], vb + (s0 + s) * D, D, o);
      j += jn;
    }
  }
}

}  // namespace pw::cpu
