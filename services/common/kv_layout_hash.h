// The hash two KV block pools must share to exchange blocks: Register.kvLayout.layoutHash
// (services/proto/cluster.capnp). Workers send it; the router and the broker compute it from the
// model they serve to check a registration (registration_check.h).
#pragma once

#include <cstdint>
#include <string>

#include "memory/kv_layout.h"

namespace pw::service {

// FNV-1a 64 of the KvLayout (kKvLayoutVersion, dtype, layers, KV heads, head size,
// block tokens) and the model dimensions that change what a block means (model_type, hidden
// size, vocabulary).
uint64_t KvLayoutHash(const memory::KvLayout& layout, int64_t hidden_size, int64_t vocab_size,
                      const std::string& model_type);

}  // namespace pw::service
