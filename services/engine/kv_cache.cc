#include "services/engine/kv_cache.h"

#include <cstdlib>
#include <string>

namespace pw::engine {

Result<std::unique_ptr<KvBlockPool>> KvBlockPool::Create(const KvLayout& layout, int num_blocks) {
  if (layout.num_layers <= 0 || layout.num_kv_heads <= 0 || layout.head_dim <= 0 ||
      layout.block_size <= 0 || num_blocks <= 0) {
    return InvalidArgument(
        "KV pool: layers, kv heads, head_dim, block_size and num_blocks must be "
        "positive (got layers=" +
        std::to_string(layout.num_layers) + " kv_heads=" + std::to_string(layout.num_kv_heads) +
        " head_dim=" + std::to_string(layout.head_dim) + " block_size=" +
        std::to_string(layout.block_size) + " num_blocks=" + std::to_string(num_blocks) + ")");
  }
  const size_t bytes = layout.bytes_per_block() * static_cast<size_t>(num_blocks);
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) {
    return ResourceExhausted("KV pool: cannot allocate " + std::to_string(bytes) + " bytes for " +
                             std::to_string(num_blocks) + " blocks");
  }
  return std::unique_ptr<KvBlockPool>(
      new KvBlockPool(layout, num_blocks, static_cast<uint8_t*>(p)));
}

KvBlockPool::KvBlockPool(const KvLayout& layout, int num_blocks, uint8_t* base)
    : layout_(layout),
      num_blocks_(num_blocks),
      bytes_per_block_(layout.bytes_per_block()),
      base_(base),
      allocated_(static_cast<size_t>(num_blocks), 0) {
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
}

KvBlockPool::~KvBlockPool() { std::free(base_); }

uint8_t* KvBlockPool::BlockAddress(int32_t id) {
  PW_CHECK(id >= 0 && id < num_blocks_);
  return base_ + static_cast<size_t>(id) * bytes_per_block_;
}

float* KvBlockPool::Slab(int32_t block, int layer, int kv, int kv_head) {
  PW_CHECK(block >= 0 && block < num_blocks_);
  const size_t off = ((static_cast<size_t>(layer) * 2 + kv) * layout_.num_kv_heads + kv_head) *
                     layout_.block_size * layout_.head_dim;
  return reinterpret_cast<float*>(base_ + static_cast<size_t>(block) * bytes_per_block_) + off;
}

const float* KvBlockPool::Slab(int32_t block, int layer, int kv, int kv_head) const {
  return const_cast<KvBlockPool*>(this)->Slab(block, layer, kv, kv_head);
}

Result<std::vector<int32_t>> KvBlockPool::Allocate(int n) {
  if (n < 0) return InvalidArgument("KV pool: cannot allocate " + std::to_string(n) + " blocks");
  if (n > num_free()) {
    return ResourceExhausted("KV pool: " + std::to_string(n) + " blocks requested, " +
                             std::to_string(num_free()) + " of " + std::to_string(num_blocks_) +
                             " free");
  }
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    out[i] = free_.back();
    free_.pop_back();
    allocated_[static_cast<size_t>(out[i])] = 1;
  }
  return out;
}

Status KvBlockPool::Free(std::span<const int32_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (!IsAllocated(id)) {
      return InvalidArgument("KV pool: block " + std::to_string(id) +
                             " is out of range or not allocated");
    }
    for (size_t j = 0; j < i; ++j) {
      if (ids[j] == id)
        return InvalidArgument("KV pool: block " + std::to_string(id) + " freed twice");
    }
  }
  for (int32_t id : ids) {
    allocated_[static_cast<size_t>(id)] = 0;
    free_.push_back(id);
  }
  return Status::Ok();
}

bool KvBlockPool::IsAllocated(int32_t id) const {
  return id >= 0 && id < num_blocks_ && allocated_[static_cast<size_t>(id)] != 0;
}

}  // namespace pw::engine
