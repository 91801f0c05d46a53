#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <string>

namespace pw::engine {

using memory::BlocksForTokens;

Scheduler::Scheduler(SchedulerOptions options, std::unique_ptr<memory::KvBlockPool> blocks)
    : options_(options),
      blocks_(std::move(blocks)),
      leased_(static_cast<size_t>(blocks_->num_blocks()), 0) {
  for (const memory::KvLayerSpec& s : blocks_->specs()) {
    if (s.kind == memory::KvKind::kSlidingWindow && (window_ == 0 || s.window < window_)) {
      window_ = s.window;
    }
  }
}

void Scheduler::ReleaseBehindWindow() {
  if (window_ == 0) return;
  const int bs = blocks_->layout().block_size;
  for (auto& sp : seqs_) {
    Sequence* s = sp.get();
    const int first_read = s->num_cached - window_ + 1;
    const int behind =
        std::min(first_read > 0 ? first_read / bs : 0, static_cast<int>(s->blocks.size()));
    for (; s->window_released < behind; ++s->window_released) {
      PW_CHECK(blocks_->ReleaseWindowPages(s->blocks[static_cast<size_t>(s->window_released)]).ok());
    }
  }
}

Sequence* Scheduler::Find(SeqId id) const {
  for (const auto& s : seqs_) {
    if (s->id == id) return s.get();
  }
  return nullptr;
}

Status Scheduler::Remove(SeqId id) {
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (seqs_[i]->id == id) {
      PW_RETURN_IF_ERROR(blocks_->Free(seqs_[i]->blocks));
      seqs_.erase(seqs_.begin() + static_cast<std::ptrdiff_t>(i));
      return Status::Ok();
    }
  }
  return NotFound("sequence " + std::to_string(id) + " is not in the engine");
}

Status Scheduler::PlanDecode(ScheduledBatch* b, std::vector<int>* new_blocks) {
  const int bs = blocks_->layout().block_size;
  int decode_blocks = 0;
  std::string starved;
  for (auto& sp : seqs_) {
    Sequence* s = sp.get();
    if (s->pending_finish != FinishReason::kNone) {
      b->finished_on_arrival.push_back(s);
      continue;
    }
    if (!s->decoding()) continue;
    const int nb = BlocksForTokens(s->num_cached + 1, bs) - static_cast<int>(s->blocks.size());
    b->scheduled.push_back({s, 1, /*decode=*/true, /*samples=*/true});
    new_blocks->push_back(std::max(0, nb));
    decode_blocks += std::max(0, nb);
    if (nb > 0) starved += (starved.empty() ? "" : ",") + std::to_string(s->id);
  }
  if (decode_blocks > blocks_->num_free()) {
    return ResourceExhausted("KV pool: decode needs " + std::to_string(decode_blocks) +
                             " new blocks (sequences " + starved + "), " +
                             std::to_string(blocks_->num_free()) + " free");
  }
  return Status::Ok();
}

bool Scheduler::PlanPrefill(int budget, int free_blocks, ScheduledBatch* b,
                            std::vector<int>* new_blocks) {
  const int bs = blocks_->layout().block_size;
  bool waiting = false;
  for (auto& sp : seqs_) {
    Sequence* s = sp.get();
    if (s->pending_finish != FinishReason::kNone || s->decoding()) continue;
    waiting = true;
    if (budget <= 0) break;
    const int remaining = static_cast<int>(s->tokens.size()) - s->num_cached;
    // The chunk: what the budget allows, shrunk to what the free blocks can hold.
    const int capacity = (static_cast<int>(s->blocks.size()) + free_blocks) * bs - s->num_cached;
    const int n = std::min({remaining, budget, capacity});
    if (n <= 0) break;
    const int nb =
        std::max(0, BlocksForTokens(s->num_cached + n, bs) - static_cast<int>(s->blocks.size()));
    const bool samples = static_cast<size_t>(s->num_cached + n) == s->tokens.size();
    b->scheduled.push_back({s, n, /*decode=*/false, samples});
    new_blocks->push_back(nb);
    free_blocks -= nb;
    budget -= n;
  }
  return waiting;
}

Result<ScheduledBatch> Scheduler::Schedule() {
  ScheduledBatch b;
  std::vector<int> new_blocks;  // [scheduled]
  ReleaseBehindWindow();
  PW_RETURN_IF_ERROR(PlanDecode(&b, &new_blocks));
  int decode_blocks = 0;
  for (int nb : new_blocks) decode_blocks += nb;
  const int budget = options_.max_batch_tokens - static_cast<int>(b.scheduled.size());
  const bool prefill_waiting =
      PlanPrefill(budget, blocks_->num_free() - decode_blocks, &b, &new_blocks);
  if (b.scheduled.empty() && b.finished_on_arrival.empty() && prefill_waiting) {
    return ResourceExhausted("KV pool: no free block for the next prompt chunk (" +
                             std::to_string(blocks_->num_free()) + " free)");
  }
  // Allocate (cannot fail: counted above) and lay out the runner's items.
  for (size_t i = 0; i < b.scheduled.size(); ++i) {
    Sequence* s = b.scheduled[i].seq;
    if (new_blocks[i] > 0) {
      auto got = blocks_->Allocate(new_blocks[i]);
      PW_CHECK(got.ok());
      s->blocks.insert(s->blocks.end(), got->begin(), got->end());
    }
    ForwardItem it;
    it.seq_id = s->id;
    it.tokens = s->tokens.data() + s->num_cached;
    it.n = b.scheduled[i].n;
    it.start_pos = s->num_cached;
    it.blocks = s->blocks.data();
    it.logits = b.scheduled[i].samples ? LogitsWanted::kLast : LogitsWanted::kNone;
    if (!b.scheduled[i].decode) b.pure_decode = false;
    b.items.push_back(it);
  }
  return b;
}

PrefillPassPlan Scheduler::ComposePrefillPass(std::span<PrefillJob> jobs,
                                              SeqId first_seq_id) const {
  PrefillPassPlan plan;
  int budget = options_.max_batch_tokens;
  for (size_t j = 0; j < jobs.size() && budget > 0; ++j) {
    const PrefillJob& job = jobs[j];
    if (job.done()) continue;
    const int n = static_cast<int>(job.prompt.size());
    ForwardItem it;
    it.seq_id = first_seq_id - plan.items.size();
    it.tokens = job.prompt.data() + job.num_computed;
    it.n = std::min(budget, n - job.num_computed);
    it.start_pos = job.num_computed;
    it.blocks = job.block_ids.data();
    const bool last = job.num_computed + it.n == n;
    // Prompt log-probabilities need every position's logits.
    it.logits = job.prompt_logprobs >= 0 ? LogitsWanted::kAll
                : last                   ? LogitsWanted::kLast
                                         : LogitsWanted::kNone;
    budget -= it.n;
    plan.items.push_back(it);
    plan.job_index.push_back(j);
  }
  return plan;
}

Result<std::vector<int32_t>> Scheduler::Lease(int n) {
  PW_ASSIGN_OR_RETURN(std::vector<int32_t> ids, blocks_->Allocate(n));
  for (int32_t id : ids) leased_[static_cast<size_t>(id)] = 1;
  return ids;
}

bool Scheduler::IsLeased(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < leased_.size() && leased_[static_cast<size_t>(id)];
}

Status Scheduler::Return(std::span<const int32_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!IsLeased(ids[i])) {
      return InvalidArgument("KV pool: block " + std::to_string(ids[i]) + " is not leased");
    }
    for (size_t j = 0; j < i; ++j) {
      if (ids[j] == ids[i]) {
        return InvalidArgument("KV pool: block " + std::to_string(ids[i]) + " returned twice");
      }
    }
  }
  PW_RETURN_IF_ERROR(blocks_->Free(ids));
  for (int32_t id : ids) leased_[static_cast<size_t>(id)] = 0;
  return Status::Ok();
}

void Scheduler::Adopt(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    PW_CHECK(IsLeased(id));
    leased_[static_cast<size_t>(id)] = 0;
  }
}

}  // namespace pw::engine
