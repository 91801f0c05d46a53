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

size_t LayerBlockBytes(const KvLayerSpec& spec, const KvLayout& layout) {
  switch (spec.kind) {
    case KvKind::kFullAttention:
    case KvKind::kSlidingWindow:
      if (!HasOwnShape(spec)) return layout.bytes_per_layer();
      return 2 * static_cast<size_t>(std::max(0, LayerKvHeads(spec, layout))) *
             static_cast<size_t>(std::max(0, layout.block_size)) *
             static_cast<size_t>(std::max(0, LayerHeadDim(spec, layout))) * layout.element_bytes();
    case KvKind::kLatent:
      return static_cast<size_t>(std::max(0, layout.block_size)) *
             static_cast<size_t>(std::max(0, spec.latent_dim)) * layout.element_bytes();
    case KvKind::kRecurrentState:
      return 0;
  }
  return 0;
}

size_t MinPageBytes(const KvLayout& layout, const std::vector<KvLayerSpec>& specs) {
  if (specs.empty()) return layout.min_page_bytes();
  size_t most = 0;
  bool per_token = false;
  for (const KvLayerSpec& s : specs) {
    if (s.kind == KvKind::kRecurrentState) continue;
    per_token = true;
    most = std::max(most, LayerBlockBytes(s, layout));
  }
  // A pool of recurrent states only keeps the full-attention page size its layout gives.
  if (!per_token) return layout.min_page_bytes();
  return (std::max<size_t>(most, 1) + 63) / 64 * 64;
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
  const bool attention = spec.kind == KvKind::kFullAttention || spec.kind == KvKind::kSlidingWindow;
  if (spec.num_kv_heads < 0 || spec.head_dim < 0 || (!attention && HasOwnShape(spec))) {
    return InvalidArgument("KV layer " + std::to_string(layer) + ": " + KvKindName(spec.kind) +
                           " with its own shape of " + std::to_string(spec.num_kv_heads) +
                           " kv heads x " + std::to_string(spec.head_dim) +
                           "; only attention layers take one, of sizes >= 0");
  }
  if (spec.kind == KvKind::kLatent && spec.latent_dim < 1) {
    return InvalidArgument("KV layer " + std::to_string(layer) + ": a latent of " +
                           std::to_string(spec.latent_dim) + " values; it must be >= 1");
  }
  const size_t need = LayerBlockBytes(spec, layout);
  if (page_bytes < need) {
    return InvalidArgument("KV pool: pages of " + std::to_string(page_bytes) +
                           " bytes cannot hold one layer of a KV block (" +
                           std::to_string(need) + " bytes, layer " + std::to_string(layer) +
                           ", " + KvKindName(spec.kind) + ")");
  }
  return 1;
}

std::vector<KvLayerSpec> ModelKvSpecs(const ModelConfig& c) {
  std::vector<KvLayerSpec> specs(static_cast<size_t>(std::max<int64_t>(0, c.num_layers)));
  for (size_t l = 0; l < specs.size(); ++l) {
    if (c.mla.enabled()) {
      // MLA (deepseek_v3) keeps one latent row per token: the KV latent and the RoPE key.
      specs[l] = {.kind = KvKind::kLatent, .latent_dim = static_cast<int>(c.mla.latent_dim())};
    } else if (c.linear_attention.IsLinear(static_cast<int64_t>(l))) {
      specs[l] = {.kind = KvKind::kRecurrentState, .state_bytes = c.linear_attention.state_bytes()};
    } else if (c.IsSlidingLayer(static_cast<int64_t>(l))) {
      specs[l] = {.kind = KvKind::kSlidingWindow, .window = static_cast<int>(c.sliding_window)};
    }
    const KvKind k = specs[l].kind;
    const int64_t heads = c.LayerKvHeads(static_cast<int64_t>(l)),
                  dim = c.LayerHeadDim(static_cast<int64_t>(l));
    if ((k == KvKind::kFullAttention || k == KvKind::kSlidingWindow) &&
        (heads != c.num_kv_heads || dim != c.head_dim)) {
      specs[l].num_kv_heads = static_cast<int>(heads);
      specs[l].head_dim = static_cast<int>(dim);
    }
  }
  return specs;
}

Result<std::vector<int>> BlockPageOffsets(std::span<const KvLayerSpec> specs, const KvLayout& layout,
                                          size_t page_bytes) {
  std::vector<int> first(specs.size() + 1, 0);
  for (size_t l = 0; l < specs.size(); ++l) {
    PW_ASSIGN_OR_RETURN(int n, PagesPerBlock(specs[l], layout, page_bytes, static_cast<int>(l)));
    first[l + 1] = first[l] + n;
  }
  return first;
}

}  // namespace pw::memory
