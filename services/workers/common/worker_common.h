// Pieces shared by the prefill and decode workers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "services/common/kv_layout_hash.h"
#include "memory/kv_blocks.h"
#include "engine/sampler/sampler.h"
#include "services/proto/codec.h"

namespace pw::workers {

// Hash that two workers' KV pools must share to exchange blocks (the router and the broker
// check a worker's against their model's).
using service::KvLayoutHash;

// Wire sampling parameters -> engine's. Does not validate (the engine does).
engine::SamplingParams FromWire(wire::SamplingParams::Reader s);

// Writes an engine TokenLogprobs into its wire form.
void ToWire(const engine::TokenLogprobs& lp, wire::TokenLogprob::Builder b);

// The worker id from the environment-independent default: "<role>-<pid>" when `id` is empty.
std::string DefaultWorkerId(const std::string& id, const char* role);

// A worker's compute threads: `threads`, or every core the process may run on when 0 (the
// default: on one machine the prefill and decode workers each size their pool to the whole
// machine and share the cores by demand, since an idle pool sleeps; docs/architecture.md,
// "One machine").
int WorkerThreads(int threads);

// The node a worker registers on: `node`, or this host's name when it is empty.
std::string DefaultNodeName(const std::string& node);

}  // namespace pw::workers
