// Batch: what a Runner executes in one forward pass (runner.h), as the scheduler composes it.
//
// A batch is a list of items, each a run of consecutive tokens of one sequence: a decode token
// (n = 1) or a prompt chunk. Every token attends to all positions [0, its own] of its sequence
// through the sequence's block table (block ids of the engine's memory::KvBlockPool): the KV
// of earlier positions must already be in the blocks; the items' own K/V are written there
// first (causal within the chunk). A hybrid's linear-attention layers instead continue the
// sequence's recurrent state, kept in its first block (blocks[0]): zero at start_pos 0, else
// the state after positions [0, start_pos), so an item's positions must follow the last ones
// run. Nothing here names a device: the CPU runner and a GPU runner read the same batch.
#pragma once

#include <cstdint>
#include <span>

namespace pw::engine {

// Which logits rows an item wants back: none (a prompt chunk with more to come), its last
// token's (it samples), or every token's (evaluation, prompt log-probabilities).
enum class LogitsWanted : uint8_t { kNone, kLast, kAll };

struct ForwardItem {
  uint64_t seq_id = 0;
  const int32_t* tokens = nullptr;  // [n] input token ids (validated by the caller)
  int n = 0;
  int start_pos = 0;                // absolute position of tokens[0]
  const int32_t* blocks = nullptr;  // block table, >= BlocksForTokens(start_pos + n) entries
  LogitsWanted logits = LogitsWanted::kNone;
};

struct Batch {
  std::span<const ForwardItem> items;  // borrowed for the call
  bool pure_decode = false;            // every item is a decode token (LYNX's phase gate)
};

}  // namespace pw::engine
