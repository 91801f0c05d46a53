// The hash two KV block pools must share to exchange blocks: Register.kvLayout.layoutHash
// (services/proto/cluster.capnp). Workers send it; the router and the broker compute it from the
// model they serve to check a registration (registration_check.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "memory/kv_layout.h"
#include "memory/kv_spec.h"

namespace pw::service {

// FNV-1a 64 of the KvLayout (kKvLayoutVersion, dtype, layers, KV heads, head size,
// block tokens), the model dimensions that change what a block means (model_type, hidden
// size, vocabulary) and, for a hybrid, which layers keep a recurrent state of how many bytes,
// for an MLA model which layers keep a latent of how many values a token (`specs`, one per
// layer: memory::ModelKvSpecs), and which attention layers have their own kv heads and head
// size (gemma4's full layers): two hybrids alike in all else but their states, two MLA models
// but their kv_lora_rank or RoPE key, two gemma4 models but their full layers' shape, never
// exchange blocks. A pool without a recurrent state hashes as before there were any (peers of
// protocol 1.2 and earlier compute the same), one without a latent as before protocol 1.4, one
// without a layer of its own shape as before protocol 1.5.
uint64_t KvLayoutHash(const memory::KvLayout& layout, std::span<const memory::KvLayerSpec> specs,
                      int64_t hidden_size, int64_t vocab_size, const std::string& model_type);

}  // namespace pw::service
