// Latent attention: multi-head latent attention (MLA, DeepSeek-V3) over a paged latent KV
// cache, in the absorbed form. Each position keeps one row of latent_dim values shared by
// every head: the KV latent c (latent_dim - rope_dim values, normalised) then the RoPE key
// k_r (rope_dim values, rotated). A head's query arrives already absorbed: q_c = W_UK^T q_nope
// (latent_dim - rope_dim values) then its rotated q_rope, so its score against position j is
// one dot over the row, (q_c . c_j + q_rope . k_r,j) * scale, and its output is the softmax-
// weighted sum of the latents c_j; W_UV (after this kernel) maps that to the head's value.
//
// The KV of one layer as the kernel sees it (the engine's KV pool lays its kLatent pages out
// so, memory/kv_spec.h):
//   page(block)     = pages[block * page_stride]
//   element offset  = s * latent_dim + d      (slot s < block_size, d < latent_dim)
//   elements fp32 or bf16. Token position p is in block table[p / block_size], slot
//   p % block_size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/dense.h"
#include "kernels/cpu/paged_attention.h"

namespace pw::cpu {

// One layer of a paged latent KV cache (non-owning).
struct LatentKvView {
  const uint8_t* const* pages = nullptr;  // pages[block * page_stride]: the block's page
  size_t page_stride = 1;
  KvElement element = KvElement::kF32;
  int block_size = 0;  // tokens per block
  int latent_dim = 0;  // values per position: the latent, then the RoPE key
  int rope_dim = 0;
};

// [n][latent_dim] rows of `block` as fp32: the page itself (fp32 pages) or its first n rows
// widened from bf16 into `widen` (LatentAttentionWidenFloats(kv) floats).
const float* LatentRows(const LatentKvView& kv, int32_t block, int32_t n, float* widen);

inline size_t LatentAttentionWidenFloats(const LatentKvView& kv) {
  return kv.element == KvElement::kBf16 ? static_cast<size_t>(kv.block_size) * kv.latent_dim : 0;
}

// out[(t * num_heads + h) * (latent_dim - rope_dim) + d] for the jobs j in [job_begin,
// job_end), job j = (token j / num_heads, head j % num_heads); qs.q is [T, num_heads *
// latent_dim] (per head the absorbed query, then the rope query). Threads may split jobs.
// `scores`: PagedAttentionScoreFloats(the batch's largest position) floats.
void LatentAttention(const kernels::DenseKernels& k, const LatentKvView& kv,
                     const AttentionQueries& qs, size_t job_begin, size_t job_end, float* scores,
                     float* widen, float* out);

}  // namespace pw::cpu
