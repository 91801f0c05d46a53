// Paged attention: each query token attends to positions [0, its own] of its sequence, whose
// K and V live in fixed-size blocks reached through the sequence's block table (as vLLM's
// paged attention reads them). One kernel over any DenseKernels table: the scalar table makes
// it the reference every other backend is checked against (tests/kernels_cpu/op_backend_test).
//
// The KV of one layer as the kernel sees it (the engine's KV pool lays its pages out so):
//   page(block)      = pages[block * page_stride]   (a block's page of this layer)
//   element offset   = ((c * num_kv_heads + h) * block_size + s) * head_dim + d
//                      c = 0 for K, 1 for V; h the kv head; s the slot; d < head_dim
//   elements fp32 or bf16 (the top half of an fp32). Token position p is in block
//   table[p / block_size], slot p % block_size.
// Grouped-query attention: query head qh reads kv head qh / (num_heads / num_kv_heads).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/dense.h"

namespace pw::cpu {

enum class KvElement : uint8_t { kF32 = 0, kBf16 = 1 };

// One layer of a paged KV cache (non-owning).
struct PagedKvView {
  const uint8_t* const* pages = nullptr;  // pages[block * page_stride]: the block's page
  size_t page_stride = 1;
  KvElement element = KvElement::kF32;
  int num_kv_heads = 0;
  int block_size = 0;  // tokens per block
  int head_dim = 0;
};

// The batch's queries (non-owning). Query token t of the batch is at position positions[t] of
// its sequence, whose block table is block_tables[t] (>= positions[t] / block_size + 1 ids).
struct AttentionQueries {
  const float* q = nullptr;  // [T, num_heads * head_dim]
  size_t T = 0;
  int num_heads = 0;
  const int32_t* positions = nullptr;            // [T]
  const int32_t* const* block_tables = nullptr;  // [T]
  float scale = 1.f;                             // usually 1 / sqrt(head_dim)
};

// [block_size][head_dim] K (c = 0) or V (c = 1) of kv head h of `block`, as fp32: the page
// itself (fp32 pages), or its first n slots widened from bf16 into `widen`
// (PagedAttentionWidenFloats(kv) floats). Shared by the attention kernels over this view.
const float* KvSlab(const PagedKvView& kv, int32_t block, int c, int h, int32_t n, float* widen);

// Queries PagedAttention takes together: up to this many consecutive tokens of one head that
// share a block table (one sequence's prompt chunk) read each K and V slab once, widened once.
inline constexpr size_t kAttentionQueryTile = 16;

// Scratch one caller of PagedAttention needs (never allocated by the kernel): a score row of
// every position for each query of a tile.
inline size_t PagedAttentionScoreFloats(int32_t max_position) {
  return kAttentionQueryTile * (static_cast<size_t>(max_position) + 1);
}
inline size_t PagedAttentionWidenFloats(const PagedKvView& kv) {
  return kv.element == KvElement::kBf16 ? static_cast<size_t>(kv.block_size) * kv.head_dim : 0;
}

// out[t * num_heads * head_dim + h * head_dim + d] for the jobs j in [job_begin, job_end), job
// j = (token j / num_heads, head j % num_heads): softmax over positions of (q . k) * scale,
// then the weighted sum of V. Threads may split jobs. The jobs of one head run in tiles
// (kAttentionQueryTile); each query's arithmetic is the same dots, softmax and axpys in the
// same order as alone, so a result does not depend on the tiling. `scores`: PagedAttentionScoreFloats(the
// largest position of the batch) floats; `widen`: PagedAttentionWidenFloats(kv) floats.
void PagedAttention(const kernels::DenseKernels& k, const PagedKvView& kv,
                    const AttentionQueries& qs, size_t job_begin, size_t job_end, float* scores,
                    float* widen, float* out);

}  // namespace pw::cpu
