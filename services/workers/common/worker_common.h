// Pieces shared by the prefill and decode workers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/sampler.h"
#include "services/proto/codec.h"

namespace pw::workers {

// Hash that two workers' KV pools must share to exchange blocks: the engine's KvLayout plus
// the model dimensions that change what a block means.
uint64_t KvLayoutHash(const engine::KvLayout& layout, int64_t hidden_size, int64_t vocab_size,
                      const std::string& model_type);

// Wire sampling parameters -> engine's. Does not validate (the engine does).
engine::SamplingParams FromWire(wire::SamplingParams::Reader s);

// Writes an engine TokenLogprobs into its wire form.
void ToWire(const engine::TokenLogprobs& lp, wire::TokenLogprob::Builder b);

// The worker id from the environment-independent default: "<role>-<pid>" when `id` is empty.
std::string DefaultWorkerId(const std::string& id, const char* role);

}  // namespace pw::workers
