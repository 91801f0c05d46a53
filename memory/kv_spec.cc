#include "memory/kv_spec.h"

#include <algorithm>
#include <string>

namespace pw::memory {

const char* KvKindName(KvKind k) {
  switch (k) {
    case KvKind::kFullAttention:
      return "full_attention";
    case KvKind::kSlidingWindow:
      return "sliding_window";
    case KvKind::kLatent:
      return "latent";
    case KvKind::kRecurrentState:
      return "recurrent_state";
  }
  return "unknown";
}

std::vector<KvLayerSpec> FullAttentionSpecs(const KvLayout& layout) {
  return std::vector<KvLayerSpec>(static_cast<size_t>(std::max(0, layout.num_layers)));
}

Result<int> PagesPerBlock(const KvLayerSpec& spec, const KvLayout& layout, size_t page_bytes,
                          int layer) {
  if (spec.kind == KvKind::kRecurrentState) {
    if (spec.state_bytes == 0 || page_bytes == 0) {
      return InvalidArgument("KV layer " + std::to_string(layer) +
                             ": a recurrent state of 0 bytes");
    }
    return static_cast<int>((spec.state_bytes + page_bytes - 1) / page_bytes);
  }
  if (spec.kind == KvKind::kSlidingWindow && spec.window < 1) {
    return InvalidArgument("KV layer " + std::to_string(layer) + ": sliding window of " +
                           std::to_string(spec.window) + " positions; it must be >= 1");
  }
  if (spec.kind != KvKind::kFullAttention && spec.kind != KvKind::kSlidingWindow) {
    return Unsupported("KV layer " + std::to_string(layer) + ": kind " + KvKindName(spec.kind) +
                       " is not served yet (full_attention, sliding_window and recurrent_state are)");
  }
  if (page_bytes < layout.bytes_per_layer()) {
    return InvalidArgument("KV pool: pages of " + std::to_string(page_bytes) +
                           " bytes cannot hold one layer of a KV block (" +
                           std::to_string(layout.bytes_per_layer()) + " bytes)");
  }
  return 1;
}

}  // namespace pw::memory
