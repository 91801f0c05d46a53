// Paged KV cache: one pool of fixed-size blocks and per-sequence block tables.
//
// Memory layout (the cluster copies whole blocks between processes, so it is part of the
// contract). The pool is ONE contiguous, 64-byte aligned buffer of `num_blocks` blocks:
//
//   block b starts at  base() + b * bytes_per_block()
//   inside a block (all fp32, little-endian, no padding):
//     [layer l][kv c (0 = K, 1 = V)][kv head h][slot s][head_dim d]
//   float offset in the block = (((l * 2 + c) * num_kv_heads + h) * block_size + s) * head_dim + d
//   bytes_per_block = num_layers * 2 * num_kv_heads * block_size * head_dim * 4
//
// A sequence's token at position p lives in block table[p / block_size], slot p % block_size.
// K is stored after RoPE (and after q/k-norm where the model has one), exactly what attention
// reads, so a block copied to another pool with the same layout is usable as is.
//
// Two pools are compatible (blocks can be copied between them) iff their KvLayout is equal.
// The pool is not thread-safe: one thread (the engine's) allocates and frees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"

namespace pw::engine {

// Shape of the KV data of one block.
struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;  // tokens per block

  // Floats of K (or of V) for one layer in one block: num_kv_heads * block_size * head_dim.
  size_t floats_per_layer_kv() const {
    return static_cast<size_t>(num_kv_heads) * block_size * head_dim;
  }
  // num_layers * 2 * floats_per_layer_kv() * sizeof(float).
  size_t bytes_per_block() const {
    return static_cast<size_t>(num_layers) * 2 * floats_per_layer_kv() * 4;
  }
  bool operator==(const KvLayout&) const = default;
};

class KvBlockPool {
 public:
  // kInvalidArgument for non-positive sizes; kResourceExhausted when the buffer cannot be
  // allocated (message gives the bytes asked for).
  static Result<std::unique_ptr<KvBlockPool>> Create(const KvLayout& layout, int num_blocks);
  ~KvBlockPool();
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  int num_blocks() const { return num_blocks_; }
  // Free blocks now; used = num_blocks() - num_free().
  int num_free() const { return static_cast<int>(free_.size()); }
  size_t bytes_per_block() const { return bytes_per_block_; }
  size_t total_bytes() const { return bytes_per_block_ * static_cast<size_t>(num_blocks_); }
  // Start of the pool buffer (what a transport registers).
  uint8_t* base() { return base_; }
  const uint8_t* base() const { return base_; }
  // Start of block `id`; id must be in [0, num_blocks()) (checked: a broken invariant aborts).
  uint8_t* BlockAddress(int32_t id);
  // [block_size][head_dim] K (kv = 0) or V (kv = 1) floats of one layer and kv head of a block.
  float* Slab(int32_t block, int layer, int kv, int kv_head);
  const float* Slab(int32_t block, int layer, int kv, int kv_head) const;

  // Takes n free blocks, all or nothing; kResourceExhausted (nothing taken) when fewer than n
  // are free. Block contents are unspecified.
  Result<std::vector<int32_t>> Allocate(int n);
  // Returns blocks to the pool. kInvalidArgument (nothing freed) if an id is out of range,
  // not allocated, or repeated.
  Status Free(std::span<const int32_t> ids);
  // True if `id` is in range and currently allocated. Used to validate ids from a peer.
  bool IsAllocated(int32_t id) const;

 private:
  KvBlockPool(const KvLayout& layout, int num_blocks, uint8_t* base);
  KvLayout layout_;
  int num_blocks_;
  size_t bytes_per_block_;
  uint8_t* base_;
  std::vector<int32_t> free_;       // stack of free ids (lowest id handed out first)
  std::vector<uint8_t> allocated_;  // per block: 1 if allocated
};

// Blocks needed to hold n tokens.
inline int BlocksForTokens(int n_tokens, int block_size) {
  return (n_tokens + block_size - 1) / block_size;
}

}  // namespace pw::engine
