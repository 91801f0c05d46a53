// KvBlockPool: KV blocks over the pages of a memory::PagePool (block ids and their pages).
//
// Memory layout (the cluster copies pages between processes, so it is part of the contract;
// version kKvLayoutVersion, carried in the registration so peers refuse a mismatch):
//
//   a KV block holds block_size tokens of every layer, as the pages its layer's spec asks for
//   (memory/kv_spec.h; one page per layer for full attention and sliding window; a
//   recurrent-state layer's LayerPages(l) pages hold the state bytes in order, used in a
//   sequence's first block only): a full-attention or sliding-window page (b, l) holds, with
//   no padding,
//     [kv c (0 = K, 1 = V)][kv head h][slot s][head_dim d]        of layer l
//   element offset in the page = ((c * num_kv_heads + h) * block_size + s) * head_dim + d
//   with the layer's own num_kv_heads and head_dim where its spec gives them (LayerKvHeads,
//   LayerHeadDim; gemma4's full layers), else the layout's; elements are fp32 or bf16
//   (KvLayout::dtype); bytes_per_layer() = 2 * num_kv_heads * block_size * head_dim * element
//   bytes, rounded up to 64 for the page size. A latent page
//   (b, l) (MLA, kLatent) holds [slot s][latent_dim d], the KV latent then the RoPE key:
//   element offset = s * latent_dim + d; block_size * latent_dim * element bytes. An own pool's
//   pages are as large as its largest per-token layer (memory/kv_spec.h MinPageBytes).
//
// Pages are fixed-size and shared with the expert weights of a decode worker (the worker owns
// the PagePool and lends it: CreateOn), so a page a dropped expert plane frees holds one layer
// of one KV block with no copy; a standalone pool (Create) makes its own PagePool. A block's
// pages need not be adjacent: Slab() and LayerPage() find them through the block's page list.
//
// Owner: one object allocates and frees, the engine's scheduler (engine/scheduler/); a worker
// that needs blocks for a transfer leases them through the engine (Engine::LeaseKvBlocks) and
// reads this pool only through a const reference (docs/architecture.md, "KV blocks").
//
// A sequence's token at position p lives in block table[p / block_size], slot p % block_size.
// K is stored after RoPE (and after q/k-norm where the model has one), exactly what attention
// reads, so a page copied to another pool with the same layout is usable as is.
//
// Two pools are compatible (pages can be copied between them) iff their KvLayout and layer
// specs are equal. The pool is not thread-safe: one thread (the engine's) allocates and frees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/latent_attention.h"
#include "kernels/cpu/paged_attention.h"
#include "memory/kv_layout.h"
#include "memory/kv_spec.h"
#include "memory/page_pool.h"

namespace pw::memory {

class KvBlockPool {
 public:
  // A pool with its own pages: num_blocks * pages_per_block() pages of MinPageBytes(layout,
  // specs) (kv_spec.h).
  // `specs`: one per layer (empty = every layer full attention); a kind not served is
  // kUnsupported. kInvalidArgument for non-positive sizes; kResourceExhausted when the buffer
  // cannot be allocated (message gives the bytes asked for).
  static Result<std::unique_ptr<KvBlockPool>> Create(const KvLayout& layout, int num_blocks,
                                                     std::vector<KvLayerSpec> specs = {});
  // A pool over borrowed pages (which must outlive it); up to `max_blocks` blocks, each taking
  // pages_per_block() pages of `pages` as tenant kKv when allocated. `specs` as in Create.
  static Result<std::unique_ptr<KvBlockPool>> CreateOn(const KvLayout& layout, PagePool* pages,
                                                       int max_blocks,
                                                       std::vector<KvLayerSpec> specs = {});
  ~KvBlockPool();
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  const std::vector<KvLayerSpec>& specs() const { return specs_; }
  // Pages one block takes: the sum over layers of PagesPerBlock(spec) (num_layers when every
  // layer is full attention).
  int pages_per_block() const { return pages_per_block_; }
  // Block ids are in [0, num_blocks()).
  int num_blocks() const { return num_blocks_; }
  // Blocks that can be allocated now: free ids, limited by the free pages of the page pool
  // (which other tenants share). used = num_blocks() - num_free() only for an own pool.
  int num_free() const;
  // Blocks allocated now.
  int num_used() const { return num_blocks_ - static_cast<int>(free_.size()); }
  // KV bytes of one block: the sum of its layers' LayerBlockBytes (kv_spec.h), a recurrent
  // state counting layout().bytes_per_layer(); layout().bytes_per_block() when every layer is
  // full attention of the layout's shape.
  size_t bytes_per_block() const;
  PagePool& pages() { return *pages_; }
  const PagePool& pages() const { return *pages_; }
  // The page of layer `layer` of block `id` (allocated; checked: a broken invariant aborts).
  PageId PageOf(int32_t id, int layer) const;
  uint8_t* LayerPage(int32_t id, int layer);
  const uint8_t* LayerPage(int32_t id, int layer) const;
  // Pages layer `layer` takes in every block (PagesPerBlock of its spec: 1 for full attention,
  // more for a recurrent state larger than a page), and page k < LayerPages(layer) of it.
  int LayerPages(int layer) const;
  // The id of page k < LayerPages(layer) of layer `layer` of block `id` (checked as PageOf).
  PageId PageOf(int32_t id, int layer, int k) const;
  uint8_t* LayerPage(int32_t id, int layer, int k);
  const uint8_t* LayerPage(int32_t id, int layer, int k) const;
  // [block_size][head_dim] K (kv = 0) or V (kv = 1) of one layer and kv head of a block (the
  // layer's own head_dim and kv heads where its spec gives them), as fp32 (layout().dtype must
  // be kF32) or bf16 bits (kBf16).
  float* Slab(int32_t block, int layer, int kv, int kv_head);
  const float* Slab(int32_t block, int layer, int kv, int kv_head) const;
  uint16_t* SlabBf16(int32_t block, int layer, int kv, int kv_head);
  const uint16_t* SlabBf16(int32_t block, int layer, int kv, int kv_head) const;

  // The recurrent state (a kRecurrentState layer's spec.state_bytes) of layer `layer` kept in
  // block `id`'s pages of that layer: copied out to / in from contiguous memory of state_bytes
  // (the pages need not be adjacent). The engine keeps a sequence's state in its first block.
  void ReadState(int32_t id, int layer, void* dst) const;
  void WriteState(int32_t id, int layer, const void* src);

  // Layer `layer` of every block as the paged-attention kernel reads it (kernels/cpu/
  // paged_attention.h); valid until the next Allocate or Free.
  cpu::PagedKvView LayerView(int layer) const;
  // A kLatent layer of every block as the latent-attention kernel reads it (kernels/cpu/
  // latent_attention.h), its rows ending in `rope_dim` RoPE-key values; valid until the next
  // Allocate or Free.
  cpu::LatentKvView LatentView(int layer, int rope_dim) const;

  // Takes n free blocks (and their pages), all or nothing; kResourceExhausted (nothing taken)
  // when fewer than n are free. Block contents are unspecified.
  Result<std::vector<int32_t>> Allocate(int n);
  // Returns blocks (and their pages). kInvalidArgument (nothing freed) if an id is out of
  // range, not allocated, or repeated.
  Status Free(std::span<const int32_t> ids);
  // True if `id` is in range and currently allocated. Used to validate ids from a peer.
  bool IsAllocated(int32_t id) const;

  // Gives the pages of block `id`'s sliding-window layers back to the page pool: the block lies
  // wholly behind the window of the sequence holding it, so no query reads them again. The
  // block keeps its id and its other layers' pages until Free; its released pages are no longer
  // reachable (PageOf aborts, LayerView has null there). Releasing twice, or a block without
  // sliding layers, changes nothing. kInvalidArgument if `id` is not allocated.
  Status ReleaseWindowPages(int32_t id);
  // Pages layer `layer` holds now: LayerPages(layer) in each allocated block whose pages of it
  // were not released (a recurrent state's several per block).
  int LayerPagesInUse(int layer) const;

 private:
  KvBlockPool(const KvLayout& layout, std::vector<KvLayerSpec> specs, std::vector<int> first_page,
              int pages_per_block, PagePool* pages, int num_blocks);
  // Index of layer `layer`'s first page of block `id` in page_of_ / page_ptr_.
  size_t At(int32_t id, int layer) const {
    return static_cast<size_t>(id) * static_cast<size_t>(pages_per_block_) +
           static_cast<size_t>(first_page_[static_cast<size_t>(layer)]);
  }
  // Element offset of kv head `kv_head`'s K (kv = 0) or V (kv = 1) in a page of layer `layer`.
  size_t SlabOffset(int layer, int kv, int kv_head) const;
  KvLayout layout_;
  std::vector<KvLayerSpec> specs_;  // [layer]
  std::vector<int> first_page_;     // [layer]: its first page among a block's pages
  int pages_per_block_;
  std::unique_ptr<PagePool> own_pages_;  // null when borrowed
  PagePool* pages_;
  int num_blocks_;
  std::vector<int32_t> free_;             // stack of free ids (lowest id handed out first)
  std::vector<uint8_t> allocated_;        // per block: 1 if allocated
  std::vector<uint8_t> released_;         // per block: 1 once ReleaseWindowPages ran
  std::vector<PageId> page_of_;           // [block][page of the block]
  std::vector<const uint8_t*> page_ptr_;  // [block][page of the block]: address (null when free)
};

// Blocks needed to hold n tokens.
inline int BlocksForTokens(int n_tokens, int block_size) {
  return (n_tokens + block_size - 1) / block_size;
}

}  // namespace pw::memory
