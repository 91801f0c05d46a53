// Sequence: one request as the scheduler keeps it (prompt, generated tokens, KV progress and
// block table). Device-independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/sampler/sampler.h"

namespace pw::engine {

using SeqId = uint64_t;

enum class FinishReason : uint8_t {
  kNone = 0,    // still running
  kStop = 1,    // generated a stop token (stop_token_ids or, unless ignore_eos, an eos id)
  kLength = 2,  // reached max_tokens or the context limit
};
const char* FinishReasonName(FinishReason r);

struct Sequence {
  SeqId id = 0;
  std::vector<int32_t> tokens;  // prompt + generated
  int num_prompt = 0;
  int num_generated = 0;
  int num_cached = 0;           // tokens whose KV is in `blocks`
  std::vector<int32_t> blocks;  // block table (ids of the scheduler's KvBlockPool)
  // blocks[0, window_released) gave their sliding-window layers' pages back (Scheduler).
  int window_released = 0;
  SamplingParams params;
  FinishReason pending_finish = FinishReason::kNone;  // finished on arrival (prefilled add)

  // Every token but the last has its KV: the next step runs the last one and samples.
  bool decoding() const {
    return num_generated > 0 && static_cast<size_t>(num_cached) + 1 == tokens.size();
  }
};

}  // namespace pw::engine
