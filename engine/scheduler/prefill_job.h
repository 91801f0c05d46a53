// PrefillJob: one prompt whose KV is computed into blocks its caller leased (a prefill worker's
// request, a prompt prefilled before it moves to a decode worker), outside the scheduler's
// sequences. The scheduler cuts the jobs into chunks (Scheduler::ComposePrefillPass); the
// engine runs them and fills each job's result.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampler/sampler.h"

namespace pw::engine {

struct PrefillResult {
  std::vector<float> last_logits;  // [vocab] logits of the last prompt position
  int32_t first_token = -1;        // sampled from last_logits with the request's params
  // params.logprobs >= 0: first_token's log-probability and alternatives.
  TokenLogprobs first_logprobs;
  // PrefillJob::prompt_logprobs >= 0: entry i is prompt token i + 1 given tokens [0, i] (the
  // first prompt token has none), with that many alternatives.
  std::vector<TokenLogprobs> prompt_logprobs;
};

// One prompt of a batched prefill (Engine::PrefillPass / PrefillBatch). The spans are borrowed
// and must stay valid until the job is done; different jobs must use different blocks.
struct PrefillJob {
  std::span<const int32_t> prompt;
  std::span<const int32_t> block_ids;  // >= BlocksForTokens(prompt.size(), block_size) blocks
  SamplingParams params;
  int num_generated_before = 0;  // as in Engine::Prefill
  // -1: no prompt log-probabilities; N in [0, kMaxLogprobs]: PrefillResult::prompt_logprobs
  // with N alternatives each (every position's logits are then computed).
  int prompt_logprobs = -1;
  // Progress: prompt positions whose KV is in block_ids. PrefillPass advances it.
  int num_computed = 0;
  // Set by the pass that computes the last position.
  PrefillResult result;
  bool done() const { return num_computed == static_cast<int>(prompt.size()); }
};

}  // namespace pw::engine
