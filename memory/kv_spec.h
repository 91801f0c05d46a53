// What one layer keeps per token (or per sequence) in the KV pages: the per-layer KV spec.
//
// Every layer of a block takes its own pages of the same memory::PagePool, so layers of
// different kinds can share one pool (vLLM's KVCacheSpec, one manager per kind over the same
// pages). A block's pages are laid out layer after layer; how many pages a layer takes in a
// block follows from its spec alone (PagesPerBlock), never from a model family.
//
// Kinds:
//   kFullAttention   K and V of every position, [2][num_kv_heads][block_size][head_dim] in one
//                    page per block (layout in memory/kv_blocks.h); the heads and head_dim are
//                    the layout's unless the spec gives the layer its own (gemma4's full layers:
//                    global_head_dim, num_global_key_value_heads). Served.
//   kSlidingWindow   K and V laid out as full attention (one page per block), read only for
//                    the last `window` positions: a block wholly behind the window of the
//                    sequence holding it gives its pages of these layers back to the page pool
//                    (KvBlockPool::ReleaseWindowPages), keeping its full-attention pages. Served.
//   kLatent          one compressed latent of `latent_dim` values per position (MLA: the KV latent
//                    then the RoPE key, shared by every head), [block_size][latent_dim] in one
//                    page per block (kernels/cpu/latent_attention.h); fp32 or bf16 as the
//                    layout's dtype. Served.
//   kRecurrentState  a fixed `state_bytes` per sequence (Mamba, linear attention), not per
//                    token: ceil(state_bytes / page_bytes) pages per block. A sequence's state
//                    is held in the layer's pages of the first block of its table (block
//                    table[0]; KvBlockPool::ReadState / WriteState); its other blocks' pages of
//                    the layer are reserved and unused. So the state's bytes count in the pool,
//                    and copying a sequence's blocks (the prefill -> decode transfer, a page
//                    copy) carries its state. Served.
// A kind that is not served is refused with kUnsupported when a pool is made, naming the layer
// and the kind, until a model family needs it. The pool's pages are as large as its largest
// per-token layer needs (LayerBlockBytes): a pool of latent layers only has pages of
// block_size * latent_dim elements, and a layer narrower than the widest leaves the rest of its
// page unused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/formats/model_config.h"
#include "common/status.h"
#include "memory/kv_layout.h"

namespace pw::memory {

enum class KvKind : uint8_t {
  kFullAttention = 0,
  kSlidingWindow = 1,
  kLatent = 2,
  kRecurrentState = 3,
};
const char* KvKindName(KvKind k);

struct KvLayerSpec {
  KvKind kind = KvKind::kFullAttention;
  int window = 0;          // kSlidingWindow: positions kept
  int latent_dim = 0;      // kLatent: elements per position
  size_t state_bytes = 0;  // kRecurrentState: bytes per sequence
  // kFullAttention, kSlidingWindow: this layer's kv heads and head size where they are not the
  // layout's (ModelKvSpecs sets them only then); 0: the layout's.
  int num_kv_heads = 0;
  int head_dim = 0;
  bool operator==(const KvLayerSpec&) const = default;
};

// The kv heads and head size of a full-attention or sliding-window layer of `spec` in a pool of
// `layout`: the spec's own where given, else the layout's.
inline int LayerKvHeads(const KvLayerSpec& spec, const KvLayout& layout) {
  return spec.num_kv_heads > 0 ? spec.num_kv_heads : layout.num_kv_heads;
}
inline int LayerHeadDim(const KvLayerSpec& spec, const KvLayout& layout) {
  return spec.head_dim > 0 ? spec.head_dim : layout.head_dim;
}
// True if `spec` gives its layer a shape of its own (num_kv_heads or head_dim set).
inline bool HasOwnShape(const KvLayerSpec& spec) {
  return spec.num_kv_heads > 0 || spec.head_dim > 0;
}

// Every layer full attention: the spec of each model served today.
std::vector<KvLayerSpec> FullAttentionSpecs(const KvLayout& layout);

// The spec of each of `c`'s layers: a latent of c.mla.latent_dim() values per position for an
// MLA model (deepseek_v3), a recurrent state of c.linear_attention.state_bytes() for a
// linear-attention layer, a sliding window of c.sliding_window for a sliding layer, full
// attention otherwise; an attention layer whose kv heads or head size differ from the model's
// num_kv_heads and head_dim (c.LayerKvHeads, c.LayerHeadDim: gemma4's full layers) gets its own.
// The engine lays its pool out with them; the router and the broker check a worker's registration
// against them (services/common/registration_check.h).
std::vector<KvLayerSpec> ModelKvSpecs(const ModelConfig& c);
// Bytes one block of a layer of `spec` uses in its page: full attention and sliding window
// 2 * kv heads * block_size * head_dim * element bytes (layout.bytes_per_layer() unless the spec
// has its own shape), latent block_size * latent_dim * element bytes; 0 for a recurrent state
// (whole pages, PagesPerBlock).
size_t LayerBlockBytes(const KvLayerSpec& spec, const KvLayout& layout);
// The smallest page that holds one block of every per-token layer of `specs` (rounded up to
// 64 bytes; layout.min_page_bytes() when every layer is full attention).
size_t MinPageBytes(const KvLayout& layout, const std::vector<KvLayerSpec>& specs);

// Pages one block takes for `spec` in pages of `page_bytes`, with `layout`'s heads, head_dim,
// block_size and dtype: 1 for full attention, sliding window and latent (LayerBlockBytes must
// fit one page, else kInvalidArgument; a latent of latent_dim < 1 too, and an own shape set on
// another kind, or with kv heads or head size negative); for a recurrent
// state, the pages its state_bytes take (kInvalidArgument when 0). kUnsupported for a kind
// not served yet. `layer` only names the layer in the message.
Result<int> PagesPerBlock(const KvLayerSpec& spec, const KvLayout& layout, size_t page_bytes,
                          int layer);

// Where each layer's pages sit among a block's pages of `page_bytes`: entry l is layer l's first
// page, entry specs.size() the pages one block takes (layers in order, PagesPerBlock each). A
// peer with pages of another size lays the same block out differently (a recurrent state over
// fewer or more pages), so a transfer maps the state's bytes, not its pages. Errors as
// PagesPerBlock.
Result<std::vector<int>> BlockPageOffsets(std::span<const KvLayerSpec> specs, const KvLayout& layout,
                                          size_t page_bytes);

}  // namespace pw::memory
