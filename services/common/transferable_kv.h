// Whether a peer of the control protocol can exchange a worker's KV blocks: the transfer
// (KvReady, the prefill worker's page puts, the decode worker's reservations) moves the pages
// of the blocks KvLayout describes. Full-attention and sliding-window layers take one page of a
// block each, as since protocol 1.0. A hybrid's linear-attention layer keeps a recurrent state
// per sequence in ceil(state bytes / page bytes) pages of the sequence's first block
// (memory/kv_spec.h); since protocol 1.3 KvLayout.pagesPerBlock and the reserved page lists
// carry those pages, and the prefill worker writes the state into them with the block's
// attention KV (docs/architecture.md, "Recurrent state in the KV transfer"). A peer of an
// earlier protocol would move the attention pages alone and decode from a state of zeros, so it
// is refused, naming both versions.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "memory/kv_blocks.h"
#include "memory/kv_spec.h"

namespace pw::service {

// Ok unless a layer of `pool` keeps an MLA latent (deepseek_v3): the transfer does not move
// latent pages yet, so the workers refuse such a pool at start (kUnsupported naming `model`,
// the layer and the kind) instead of serving a stream decoded from unwritten pages.
Status CheckTransferableKv(const memory::KvBlockPool& pool, const std::string& model);

// The control protocol's minor version since which the KV transfer carries a recurrent state.
inline constexpr uint16_t kRecurrentStateMinor = 3;

// True if a layer of `specs` keeps a recurrent state.
bool HasRecurrentState(std::span<const memory::KvLayerSpec> specs);

// Ok, or kUnsupported when `specs` (the served model's KV: memory::ModelKvSpecs) hold a
// recurrent state and `peer`, speaking protocol 1.`peer_minor`, predates kRecurrentStateMinor;
// the message names the peer, both versions, `model` and the first such layer.
Status CheckPeerCarriesKv(std::span<const memory::KvLayerSpec> specs, const std::string& model,
                          const std::string& peer, uint16_t peer_minor);

}  // namespace pw::service
