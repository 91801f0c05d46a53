// Whether a peer of the control protocol can exchange a worker's KV blocks: the transfer
// (KvReady, the prefill worker's page puts, the decode worker's reservations) moves the pages
// of the blocks KvLayout describes. Full-attention and sliding-window layers take one page of a
// block each, as since protocol 1.0. A hybrid's linear-attention layer keeps a recurrent state
// per sequence in ceil(state bytes / page bytes) pages of the sequence's first block
// (memory/kv_spec.h); since protocol 1.3 KvLayout.pagesPerBlock and the reserved page lists
// carry those pages, and the prefill worker writes the state into them with the block's
// attention KV (docs/architecture.md, "Recurrent state in the KV transfer"). An MLA model's
// (deepseek_v3) latent layer takes one page of a block too, holding block_size rows of its
// latent (memory/kv_blocks.h); since protocol 1.4 KvLayout.layerBytes is those rows' bytes and
// the layout hash names each latent's width (docs/architecture.md, "Latent KV in the
// transfer"). Since protocol 1.5 an attention layer may have its own kv heads and head size
// (gemma4's full layers: memory::KvLayerSpec's own shape): the layout hash names each such
// layer's shape, KvLayout.layerBytes is the widest layer's bytes (every page holds it) and
// blockBytes the sum of the layers', and each layer's page carries its own bytes (docs/
// architecture.md, "Layers of their own KV width"). A peer of an earlier protocol would move or
// check the pages by another size, so it is refused for such a model, naming both versions.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "memory/kv_blocks.h"
#include "memory/kv_spec.h"

namespace pw::service {

// KvLayout.layerBytes of a pool of `layout` and `specs` (memory::ModelKvSpecs): the bytes the
// widest per-token layer of a block takes in its page (memory::LayerBlockBytes): K and V of a
// full-attention or sliding-window layer (its own shape where it has one), block_size latent
// rows of a latent layer. A pool of recurrent states only counts layout.bytes_per_layer(), as
// before protocol 1.4. Pages are at least this large; each layer moves its own bytes.
uint64_t KvLayerBytes(const memory::KvLayout& layout, std::span<const memory::KvLayerSpec> specs);

// The control protocol's minor version since which the KV transfer carries a recurrent state.
inline constexpr uint16_t kRecurrentStateMinor = 3;
// The control protocol's minor version since which the KV transfer carries a latent (MLA) layer.
inline constexpr uint16_t kLatentKvMinor = 4;
// The control protocol's minor version since which the KV transfer carries attention layers of
// their own kv heads or head size (memory::HasOwnShape).
inline constexpr uint16_t kLayerShapeMinor = 5;

// True if a layer of `specs` keeps a recurrent state.
bool HasRecurrentState(std::span<const memory::KvLayerSpec> specs);

// Ok, or kUnsupported when `specs` (the served model's KV: memory::ModelKvSpecs) hold a
// recurrent state and `peer`, speaking protocol 1.`peer_minor`, predates kRecurrentStateMinor,
// a latent and the peer predates kLatentKvMinor, or an attention layer of its own shape and the
// peer predates kLayerShapeMinor; the message names the peer, both versions,
// `model` and the first such layer.
Status CheckPeerCarriesKv(std::span<const memory::KvLayerSpec> specs, const std::string& model,
                          const std::string& peer, uint16_t peer_minor);

}  // namespace pw::service
