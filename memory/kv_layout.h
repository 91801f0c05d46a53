// The shape and element type of one KV block, and the version of that layout (carried in the
// registration, so peers refuse a mismatch). The engine's KV block pool (memory/kv_blocks.h)
// lays its pages out from it; the router and the broker check a worker's registration against
// it without linking the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace pw::memory {

inline constexpr uint32_t kKvLayoutVersion = 2;  // 2: one page per (block, layer), fp32|bf16

enum class KvDtype : uint8_t { kF32 = 0, kBf16 = 1 };
const char* KvDtypeName(KvDtype d);
// "fp32" | "f32" or "bf16".
Result<KvDtype> ParseKvDtype(const std::string& name);

// Shape of the KV data of one block.
struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;  // tokens per block
  KvDtype dtype = KvDtype::kF32;

  size_t element_bytes() const { return dtype == KvDtype::kF32 ? 4 : 2; }
  // Elements of K (or of V) for one layer in one block: num_kv_heads * block_size * head_dim.
  size_t elements_per_layer_kv() const {
    return static_cast<size_t>(num_kv_heads) * block_size * head_dim;
  }
  // Bytes one layer of one block uses in its page (K then V).
  size_t bytes_per_layer() const { return 2 * elements_per_layer_kv() * element_bytes(); }
  // Bytes of KV data in one block (all layers), excluding page rounding.
  size_t bytes_per_block() const { return static_cast<size_t>(num_layers) * bytes_per_layer(); }
  // The smallest page that holds one layer of one block.
  size_t min_page_bytes() const { return (bytes_per_layer() + 63) / 64 * 64; }
  bool operator==(const KvLayout&) const = default;
};

}  // namespace pw::memory
