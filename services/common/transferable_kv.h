// Whether the cluster can move a worker's KV blocks between processes: the transfer (KvReady,
// the prefill worker's page pushes, the decode worker's reservations) moves one page per layer
// and block, as KvLayout describes them (full attention, sliding window). A hybrid's pool (a linear-attention layer's recurrent
// state, several pages kept in a sequence's first block: memory/kv_spec.h) does not fit that
// yet, so a worker refuses to start with one rather than serve a decode that lost its state.
#pragma once

#include <string>

#include "common/status.h"
#include "memory/kv_blocks.h"

namespace pw::service {

// kUnsupported naming `model` and the first layer that is neither full attention nor a sliding
// window (gpt_oss: one page per layer and block, as full attention); OK otherwise.
Status CheckTransferableKv(const memory::KvBlockPool& pool, const std::string& model);

}  // namespace pw::service
