// KvAdmission: the router's admission by decode KV memory (docs/router.md, "Admission and the
// request table"): a queue of requests cannot outgrow what the decode pool can hold without
// the router noticing.
//
// A candidate (one backend request; a call with n or best_of has that many) needs, by the time
// it ends, the KV blocks of its prompt and of every token it may generate:
//   blocks = ceil((prompt + max_tokens) / block_tokens).
// The pool: `capacity` blocks, the most KV the live decode workers can hold at once with expert
// widths lowered as far as their planner may (Heartbeat.kvCapacityBlocks, summed), and
// `largest`, the largest one worker can (a sequence lives on one worker). Two sums are kept:
//   committed: blocks of candidates handed to the backend and not finished;
//   queued:    blocks of candidates waiting in the admission queue.
// A call of k candidates of b blocks each is, on arrival,
//   kTooLarge (400) when b > largest: it could never run, however long it waited;
//   kBusy (429, Retry-After) when candidates already wait and queued + k * b would exceed
//     queue_factor * capacity: it would wait behind more than that much work;
//   kQueue otherwise (an empty queue takes any call that can run at all, so a large call is
//     not refused for good; under load that never lets the queue empty, a call larger than
//     the bound keeps being refused until queue_factor is raised).
// A queued candidate may start (FIFO) when committed + b <= capacity, or when nothing is
// committed (capacity shrank below it: it runs alone rather than block the queue for good).
// capacity 0 (no decode worker reports one): admission by count only, every call is queued and
// every candidate may start.
#pragma once

#include <cstdint>

namespace pw::router {

class KvAdmission {
 public:
  enum class Verdict { kQueue, kBusy, kTooLarge };

  // queue_factor: how much work, in pools' worth of KV, may wait; > 0.
  explicit KvAdmission(double queue_factor) : queue_factor_(queue_factor) {}

  // KV blocks one candidate of `prompt` tokens generating up to `max_tokens` needs (0 when
  // block_tokens is 0: not known).
  static int64_t BlocksFor(int64_t prompt, int64_t max_tokens, int32_t block_tokens);

  // The pool as the backend reports it now.
  void SetPool(int64_t capacity, int64_t largest) {
    capacity_ = capacity;
    largest_ = largest;
  }
  int64_t capacity() const { return capacity_; }
  int64_t largest() const { return largest_; }
  int64_t committed() const { return committed_; }
  int64_t queued() const { return queued_; }
  // The most blocks that may wait (queue_factor * capacity).
  int64_t queue_bound() const;

  // A call of `candidates` candidates of `blocks` blocks each arrives (see the file comment).
  Verdict Arrive(int64_t candidates, int64_t blocks) const;
  // Bookkeeping: a candidate joins the queue, leaves it (started or removed), starts, ends.
  void Queue(int64_t blocks) { queued_ += blocks; }
  void Unqueue(int64_t blocks) { queued_ -= blocks; }
  bool CanStart(int64_t blocks) const;
  void Start(int64_t blocks) { committed_ += blocks; }
  void End(int64_t blocks) { committed_ -= blocks; }

 private:
  double queue_factor_;
  int64_t capacity_ = 0;
  int64_t largest_ = 0;
  int64_t committed_ = 0;
  int64_t queued_ = 0;
};

}  // namespace pw::router
