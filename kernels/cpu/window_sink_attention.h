// Paged attention with a sliding window and attention sinks (gpt-oss's attention):
//   - window w > 0: the query at position p attends to positions (p - w, p] only (HF's
//     sliding_window: the last w positions, its own included); w = 0 attends to [0, p];
//   - sinks: one learned logit per query head that joins the softmax as one more column and is
//     then dropped, so the weights of the real positions sum to less than 1 (HF's
//     eager_attention_forward with module.sinks). Null: none.
// The KV layout, the queries and the job split are PagedAttention's (paged_attention.h); with
// no window and no sinks the result is PagedAttention's, bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/dense.h"
#include "kernels/cpu/paged_attention.h"

namespace pw::cpu {

struct WindowSinks {
  int32_t window = 0;           // positions attended, 0: all
  const float* sinks = nullptr;  // [num_heads] logits; null: no sink column
};

// Scratch for `scores`: one float more than PagedAttention's (the sink's column).
inline size_t WindowSinkAttentionScoreFloats(int32_t max_position) {
  return static_cast<size_t>(max_position) + 2;
}

// As PagedAttention, over the window of each query and with the sink column.
void WindowSinkAttention(const kernels::DenseKernels& k, const PagedKvView& kv,
                         const AttentionQueries& qs, const WindowSinks& ws, size_t job_begin,
                         size_t job_end, float* scores, float* widen, float* out);

}  // namespace pw::cpu
