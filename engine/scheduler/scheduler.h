// Scheduler: the device-independent half of the engine's continuous batching. It keeps the
// sequences (arrival order), owns the KV blocks, and composes each step's batch; a Runner
// (engine/runner/runner.h) executes the batch and the engine samples from its logits.
//
// Batch composition (Schedule): every DECODE-phase sequence gets its one token (a new block
// when its last one is full); the remaining token budget (max_batch_tokens minus the decode
// tokens) goes to prompt chunks of PREFILL-phase sequences in arrival order, each chunk cut to
// what the budget and the free blocks allow (chunked prefill). Blocks are allocated when the
// batch is composed, so a batch that is returned always has its KV room.
//
// KV blocks: the scheduler is the one object that allocates and frees blocks of its
// memory::KvBlockPool. Sequences hold blocks from the step that first needs them until they
// finish or are removed. A caller that needs blocks outside a sequence (a prefill worker's
// prompt, a decode worker's reservation for a transfer, an evaluation pass) leases them
// (Lease) and gives them back (Return), or hands them to a new sequence (Adopt).
//
// Not thread-safe: the engine's driving thread only.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "engine/runner/batch.h"
#include "engine/scheduler/prefill_job.h"
#include "engine/scheduler/sequence.h"
#include "memory/kv_blocks.h"

namespace pw::engine {

struct SchedulerOptions {
  int max_batch_tokens = 256;  // decode tokens + prompt chunk tokens per step (decode always runs)
};

// One sequence's share of a scheduled batch.
struct ScheduledItem {
  Sequence* seq = nullptr;
  int n = 0;             // tokens it runs: 1 for decode, the chunk size for a prompt
  bool decode = false;   // a decode token (else a prompt chunk)
  bool samples = false;  // its last token is the sequence's last: the step samples a token
};

struct ScheduledBatch {
  std::vector<ScheduledItem> scheduled;  // decode sequences, then prompt chunks
  std::vector<ForwardItem> items;        // [scheduled.size()], what the runner reads
  bool pure_decode = true;
  // Sequences that arrived finished (AddPrefilledSequence of a stop token): reported without
  // running.
  std::vector<Sequence*> finished_on_arrival;
  Batch batch() const { return {items, pure_decode}; }
};

// One forward pass over leased prompts (ComposePrefillPass): items[i] runs the next chunk of
// jobs[job_index[i]].
struct PrefillPassPlan {
  std::vector<ForwardItem> items;
  std::vector<size_t> job_index;
};

class Scheduler {
 public:
  Scheduler(SchedulerOptions options, std::unique_ptr<memory::KvBlockPool> blocks);

  const memory::KvBlockPool& blocks() const { return *blocks_; }
  // The pool the runner writes K/V into (its pages only; never allocate or free through it).
  memory::KvBlockPool* runner_blocks() { return blocks_.get(); }

  // Sequences in arrival order.
  const std::vector<std::unique_ptr<Sequence>>& sequences() const { return seqs_; }
  Sequence* Find(SeqId id) const;
  void Add(std::unique_ptr<Sequence> s) { seqs_.push_back(std::move(s)); }
  // Drops a sequence and frees its blocks; kNotFound for an unknown id.
  Status Remove(SeqId id);

  // Composes the next batch (header comment) and allocates its blocks. kResourceExhausted
  // (nothing allocated, nothing changed) when the decode sequences need more new blocks than
  // are free, or when prompt chunks wait and none can get a block while nothing else runs.
  Result<ScheduledBatch> Schedule();

  // The next pass over jobs whose blocks the caller leased (prefill workers): it spends up to
  // max_batch_tokens on the next chunks of the unfinished jobs, in order (each continues at its
  // num_computed; a job whose remaining tokens exceed what is left of the budget gets a partial
  // chunk). A chunk wants every logits row when its job wants prompt log-probabilities, else the
  // last row when it ends the prompt. Items get sequence ids below `first_seq_id`, one each.
  // Allocates nothing and changes no job; empty when every job is done.
  PrefillPassPlan ComposePrefillPass(std::span<PrefillJob> jobs, SeqId first_seq_id) const;

  // Leases n free blocks to the caller, all or nothing (kResourceExhausted otherwise).
  Result<std::vector<int32_t>> Lease(int n);
  // Gives leased blocks back; kInvalidArgument (nothing freed) when one is not leased (a
  // sequence's block, a free one, out of range) or repeated.
  Status Return(std::span<const int32_t> ids);
  // True while `id` is leased (not yet returned nor adopted).
  bool IsLeased(int32_t id) const;
  // Leased blocks become a sequence's (the caller has checked IsLeased for each).
  void Adopt(std::span<const int32_t> ids);

 private:
  // Gives back the sliding-window pages of every sequence's blocks that lie wholly behind its
  // window: the next query of a sequence is at position num_cached and reads positions from
  // num_cached - window + 1 on, so a block ending before that is never read on those layers.
  void ReleaseBehindWindow();
  // The decode tokens of the next batch; *new_blocks: the blocks they need.
  Status PlanDecode(ScheduledBatch* b, std::vector<int>* new_blocks);
  // Prompt chunks within `budget` tokens and `free_blocks` blocks.
  bool PlanPrefill(int budget, int free_blocks, ScheduledBatch* b, std::vector<int>* new_blocks);

  SchedulerOptions options_;
  std::unique_ptr<memory::KvBlockPool> blocks_;
  std::vector<std::unique_ptr<Sequence>> seqs_;  // arrival order
  std::vector<uint8_t> leased_;                  // per block: 1 while leased
  int window_ = 0;  // the smallest sliding window of the pool's layers; 0: none
};

}  // namespace pw::engine
