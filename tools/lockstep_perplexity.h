// Lockstep perplexity: the held-out text scored as B streams decoded side by side, one token
// per stream per step, teacher-forced, so a batch-level routing rule (LYNX) is evaluated as it
// runs in serving (pw-eval ppl --batch B).
//
// Rule: the ids are cut into windows of `ctx` tokens exactly as Perplexity does
// (engine/eval/perplexity.h: same predictions, same nll_sum definition). Windows are taken
// B at a time in text order; the B windows of a group run in lockstep: at step i every window
// with more than i + 1 tokens feeds its token i (position i) and its logits score token i + 1.
// Every forward pass is a pure-decode batch (one token per sequence), so the phase gate is
// open at every position. The batch is B except in the last group (fewer windows) and in the
// last steps of a group holding the text's shorter last window.
// Numerics: the same per-token computation as ForwardLogits up to kernel summation order.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "engine/engine.h"
#include "engine/experts/moe.h"
#include "engine/eval/perplexity.h"

namespace pw::eval {

struct LockstepOptions {
  int ctx = 512;      // window length, >= 2
  int batch = 1;      // B streams, >= 1
  int threads = 2;    // compute threads of the forward passes
  engine::MoeHooks hooks;  // seams of the passes (provider, routing hook, ...); borrowed
};

// Leases KV blocks from the engine (LeaseKvBlocks): batch * BlocksForTokens(ctx) must be free
// (kResourceExhausted otherwise). kInvalidArgument for ctx < 2, batch < 1 or < 2 ids.
Result<engine::PerplexityResult> LockstepPerplexity(engine::Engine& engine,
                                                    std::span<const int32_t> ids,
                                                    const LockstepOptions& options,
                                                    const engine::PerplexityProgress& progress = nullptr);

}  // namespace pw::eval
