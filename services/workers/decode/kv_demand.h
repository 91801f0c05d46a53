// KvDemand: the KV a decode worker's requests will still need and do not hold yet, in blocks
// (pages_per_block pages each: one per attention layer, a hybrid's recurrent-state pages), so the broker's planner can lower expert widths before free
// pages run out rather than after (DESIGN.md 5.1, "KV demand queued").
//
//   running request: blocks to grow from its current length to prompt + 1 + max_tokens
//                    (capped by the context), plus one block of slack; a preempted one holds
//                    nothing, so it needs every block of that length;
//   lease (prefill writing its prompt, its blocks held): its growth from the blocks it holds
//                    to prompt + 1 + max_tokens, plus one block of slack (one block when
//                    max_tokens is not known);
//   waiting reservation (reserve_wait.h): every block of its prompt plus its growth.
// With a horizon of H tokens (> 0), every request counts only the growth of its next H
// tokens (its length capped at len + H, a lease's and a waiting reservation's max_tokens at
// H): the KV the requests can use before the planner's next decisions, not everything they
// will ever hold. Requests finish and release their KV while others grow, so the sum of every
// request's final length overstates what the pool must hold at once under a backlog; 0 (the
// default) counts the whole growth to max_tokens.
// Sliding-window layers (SetSlidingLayers; memory/kv_spec.h) give the pages of blocks behind
// a request's window back, so on them a request never holds more than window / block_size + 2
// blocks: their pages count the growth up to that cap only (a waiting reservation's prompt
// whole: its blocks are leased with every layer's page), the other layers' the whole growth.
// The worker keeps `reserve_pages()` (running + leases) free from raises, and reports
// `pages()` (all three) in Telemetry as kvDemandPages.
#pragma once

#include <cstdint>

namespace pw::workers {

class KvDemand {
 public:
  // block_size: tokens per block; pages_per_block: the pages one block takes (one per layer
  // unless a recurrent state takes more); max_context: the model's context (lengths are capped
  // there). horizon_tokens: see the file comment (0: to max_tokens).
  KvDemand(int block_size, int pages_per_block, int64_t max_context, int64_t horizon_tokens = 0);
  // `layers` of the layers (one page of a block each) keep only the last `window` tokens
  // (before any Add).
  void SetSlidingLayers(int layers, int window);

  // `len`: tokens whose KV the request has now (prompt + generated); `end`: its final length
  // before the cap (prompt + 1 + max_tokens left). holds_kv false: preempted, holds nothing.
  void AddRunning(int64_t len, int64_t end, bool holds_kv);
  // A lease holding `held_blocks` whose request will generate `max_tokens` (0: unknown).
  void AddLease(int64_t held_blocks, int64_t max_tokens);
  // A reservation that waits for pages: `prompt` tokens to be written, `max_tokens` to follow.
  void AddWaiting(int64_t prompt, int64_t max_tokens);

  int64_t running_blocks() const { return running_blocks_; }
  int64_t lease_blocks() const { return lease_blocks_; }
  int64_t waiting_blocks() const { return waiting_blocks_; }
  // Pages kept from raises: running growth and leases.
  int64_t reserve_pages() const {
    return (running_blocks_ + lease_blocks_) * full_layers() +
           (running_sliding_ + lease_sliding_) * sliding_layers_;
  }
  // Everything still needed, waiting reservations included.
  int64_t pages() const {
    return (running_blocks_ + lease_blocks_ + waiting_blocks_) * full_layers() +
           (running_sliding_ + lease_sliding_ + waiting_sliding_) * sliding_layers_;
  }

 private:
  int64_t Blocks(int64_t tokens) const;
  // Pages of a block that its requests hold for as long as they run.
  int64_t full_layers() const { return pages_per_block_ - sliding_layers_; }
  // Blocks a sliding layer still needs for a request holding `held` that will use `need`.
  int64_t SlidingGrowth(int64_t held, int64_t need) const;

  int block_size_;
  int pages_per_block_;
  int64_t max_context_;
  int64_t horizon_;
  int64_t running_blocks_ = 0, lease_blocks_ = 0, waiting_blocks_ = 0;
  int sliding_layers_ = 0;
  int64_t window_blocks_ = 0;  // most blocks a sliding layer holds for one request
  int64_t running_sliding_ = 0, lease_sliding_ = 0, waiting_sliding_ = 0;
};

}  // namespace pw::workers
