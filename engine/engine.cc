#include "engine/engine.h"

#include <algorithm>
#include <string>

#include "engine/models/model.h"
#include "engine/runner.h"

namespace pw::engine {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
  }
  return "unknown";
}

struct Engine::Sequence {
  SeqId id = 0;
  std::vector<int32_t> tokens;  // prompt + generated
  int num_prompt = 0;
  int num_generated = 0;
  int num_cached = 0;           // tokens whose KV is in `blocks`
  std::vector<int32_t> blocks;  // block table
  SamplingParams params;
  FinishReason pending_finish = FinishReason::kNone;  // finished on arrival (prefilled add)

  bool decoding() const {
    return num_generated > 0 && static_cast<size_t>(num_cached) + 1 == tokens.size();
  }
};

namespace {
constexpr SeqId kEvalSeqId = ~SeqId{0};
}

Engine::Engine(EngineOptions options) : options_(options) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::Create(const std::string& model_dir,
                                               const EngineOptions& options) {
  if (options.num_kv_blocks < 1 || options.block_size < 1 || options.num_threads < 1 ||
      options.max_batch_tokens < 1 || options.max_context < 0) {
    return InvalidArgument(
        "engine options: num_kv_blocks, block_size, num_threads and max_batch_tokens must be >= 1 "
        "and max_context >= 0");
  }
  std::unique_ptr<Engine> e(new Engine(options));
  PW_ASSIGN_OR_RETURN(e->model_,
                      Model::Load(model_dir, options.copy_weights ? FileLoad::kCopy : FileLoad::kMap));
  if (options.dense_int8) PW_RETURN_IF_ERROR(e->model_->QuantizeDenseInt8());
  const ModelConfig& c = e->model_->config();
  if (e->options_.max_context == 0) {
    e->options_.max_context =
        c.max_position_embeddings > 0 ? static_cast<int>(c.max_position_embeddings) : 4096;
  }
  KvLayout layout;
  layout.num_layers = static_cast<int>(c.num_layers);
  layout.num_kv_heads = static_cast<int>(c.num_kv_heads);
  layout.head_dim = static_cast<int>(c.head_dim);
  layout.block_size = options.block_size;
  layout.dtype = options.kv_dtype;
  if (options.kv_pages != nullptr) {
    PW_ASSIGN_OR_RETURN(e->pool_, KvBlockPool::CreateOn(layout, options.kv_pages, options.num_kv_blocks));
  } else {
    PW_ASSIGN_OR_RETURN(e->pool_, KvBlockPool::Create(layout, options.num_kv_blocks));
  }
  for (int64_t id : c.eos_token_ids) e->eos_ids_.push_back(static_cast<int32_t>(id));
  e->runner_ = std::make_unique<Runner>(*e->model_, e->pool_.get(), options.num_threads);
  return e;
}

KvBlockPool& Engine::kv_pool() { return *pool_; }
const KvBlockPool& Engine::kv_pool() const { return *pool_; }
int Engine::vocab_size() const { return static_cast<int>(model_->config().vocab_size); }
int Engine::max_context() const { return options_.max_context; }
const Model& Engine::model() const { return *model_; }
void Engine::SetMoeHooks(const MoeHooks& hooks) { runner_->SetHooks(hooks); }

const std::vector<int32_t>& Engine::eos_token_ids() const { return eos_ids_; }

bool Engine::HasWork() const { return !seqs_.empty(); }
int Engine::num_sequences() const { return static_cast<int>(seqs_.size()); }

std::vector<SequenceInfo> Engine::Sequences() const {
  std::vector<SequenceInfo> out;
  for (const auto& s : seqs_) {
    out.push_back({s->id, s->num_prompt, s->num_generated, s->num_cached,
                   static_cast<int>(s->blocks.size()), !s->decoding()});
  }
  return out;
}

Status Engine::CheckNewSequence(SeqId id, const std::vector<int32_t>& prompt,
                                const SamplingParams& params, size_t num_generated,
                                bool eval) const {
  for (const auto& s : seqs_) {
    if (s->id == id) return InvalidArgument("sequence " + std::to_string(id) + " already exists");
  }
  if (prompt.empty()) return InvalidArgument("sequence " + std::to_string(id) + ": empty prompt");
  const int vocab = vocab_size();
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      return InvalidArgument("sequence " + std::to_string(id) + ": token id " +
                             std::to_string(prompt[i]) + " at position " + std::to_string(i) +
                             " outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  PW_RETURN_IF_ERROR(ValidateSamplingParams(params, vocab));
  if (num_generated >= static_cast<size_t>(params.max_tokens)) {
    return InvalidArgument("sequence " + std::to_string(id) + ": " + std::to_string(num_generated) +
                           " tokens already generated, max_tokens is " +
                           std::to_string(params.max_tokens));
  }
  // A served sequence needs room for at least one more token; an evaluation pass does not.
  const size_t limit = static_cast<size_t>(options_.max_context) + (eval ? 1 : 0);
  if (prompt.size() + num_generated >= limit) {
    return OutOfRange("sequence " + std::to_string(id) + ": " +
                      std::to_string(prompt.size() + num_generated) +
                      " tokens do not fit the context of " + std::to_string(options_.max_context));
  }
  const int need = BlocksForTokens(static_cast<int>(prompt.size() + num_generated) + (eval ? 0 : 1),
                                   options_.block_size);
  if (need > pool_->num_blocks()) {
    return OutOfRange("sequence " + std::to_string(id) + ": needs " + std::to_string(need) +
                      " KV blocks, the pool has " + std::to_string(pool_->num_blocks()));
  }
  return Status::Ok();
}

Status Engine::AddSequence(SeqId id, std::vector<int32_t> prompt, const SamplingParams& params,
                           std::vector<int32_t> generated) {
  PW_RETURN_IF_ERROR(CheckNewSequence(id, prompt, params, generated.size()));
  for (size_t i = 0; i < generated.size(); ++i) {
    if (generated[i] < 0 || generated[i] >= vocab_size()) {
      return InvalidArgument("sequence " + std::to_string(id) + ": generated token " +
                             std::to_string(generated[i]) + " outside the vocabulary");
    }
  }
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->num_prompt = static_cast<int>(prompt.size());
  s->num_generated = static_cast<int>(generated.size());
  s->tokens = std::move(prompt);
  s->tokens.insert(s->tokens.end(), generated.begin(), generated.end());
  s->params = params;
  seqs_.push_back(std::move(s));
  return Status::Ok();
}

Status Engine::AddPrefilledSequence(SeqId id, std::vector<int32_t> prompt,
                                    std::vector<int32_t> block_ids, int32_t first_token,
                                    const SamplingParams& params, int num_generated_before,
                                    int num_uncached) {
  if (num_generated_before < 0 || static_cast<size_t>(num_generated_before) >= prompt.size()) {
    return InvalidArgument("sequence " + std::to_string(id) + ": num_generated_before " +
                           std::to_string(num_generated_before) + " must be in [0, prompt size)");
  }
  if (num_uncached < 0 || static_cast<size_t>(num_uncached) > prompt.size()) {
    return InvalidArgument("sequence " + std::to_string(id) + ": num_uncached " +
                           std::to_string(num_uncached) + " must be in [0, prompt size]");
  }
  // `prompt` already holds the tokens generated before: they count once toward the context.
  PW_RETURN_IF_ERROR(CheckNewSequence(id, prompt, params, 0));
  if (num_generated_before >= params.max_tokens) {
    return InvalidArgument("sequence " + std::to_string(id) + ": " +
                           std::to_string(num_generated_before) +
                           " tokens already generated, max_tokens is " +
                           std::to_string(params.max_tokens));
  }
  if (first_token < 0 || first_token >= vocab_size()) {
    return InvalidArgument("sequence " + std::to_string(id) + ": first token " +
                           std::to_string(first_token) + " outside the vocabulary");
  }
  const int cached = static_cast<int>(prompt.size()) - num_uncached;
  const int need = BlocksForTokens(cached, options_.block_size);
  if (static_cast<int>(block_ids.size()) < need) {
    return InvalidArgument("sequence " + std::to_string(id) + ": " +
                           std::to_string(block_ids.size()) + " KV blocks for " +
                           std::to_string(cached) + " prompt tokens, need " +
                           std::to_string(need));
  }
  for (size_t i = 0; i < block_ids.size(); ++i) {
    if (!pool_->IsAllocated(block_ids[i])) {
      return InvalidArgument("sequence " + std::to_string(id) + ": KV block " +
                             std::to_string(block_ids[i]) + " is not an allocated block");
    }
    for (size_t j = 0; j < i; ++j) {
      if (block_ids[j] == block_ids[i]) {
        return InvalidArgument("sequence " + std::to_string(id) + ": KV block " +
                               std::to_string(block_ids[i]) + " listed twice");
      }
    }
    for (const auto& s : seqs_) {
      if (std::find(s->blocks.begin(), s->blocks.end(), block_ids[i]) != s->blocks.end()) {
        return InvalidArgument("sequence " + std::to_string(id) + ": KV block " +
                               std::to_string(block_ids[i]) + " belongs to sequence " +
                               std::to_string(s->id));
      }
    }
  }
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->num_prompt = static_cast<int>(prompt.size()) - num_generated_before;
  s->num_cached = cached;  // the rest is computed as a prompt chunk (decoding() is false)
  s->tokens = std::move(prompt);
  s->tokens.push_back(first_token);
  s->num_generated = num_generated_before + 1;
  s->blocks = std::move(block_ids);
  s->params = params;
  if (IsStop(*s, first_token)) {
    s->pending_finish = FinishReason::kStop;
  } else if (s->num_generated >= params.max_tokens ||
             s->tokens.size() >= static_cast<size_t>(options_.max_context)) {
    s->pending_finish = FinishReason::kLength;
  }
  seqs_.push_back(std::move(s));
  return Status::Ok();
}

Status Engine::RemoveSequence(SeqId id) {
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (seqs_[i]->id == id) {
      PW_RETURN_IF_ERROR(pool_->Free(seqs_[i]->blocks));
      seqs_.erase(seqs_.begin() + static_cast<std::ptrdiff_t>(i));
      return Status::Ok();
    }
  }
  return NotFound("sequence " + std::to_string(id) + " is not in the engine");
}

bool Engine::IsStop(const Sequence& s, int32_t token) const {
  const auto& stops = s.params.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) return true;
  if (!s.params.ignore_eos) {
    for (int32_t e : eos_ids_) {
      if (e == token) return true;
    }
  }
  return false;
}

Result<StepResult> Engine::Step() {
  StepResult result;
  const int bs = options_.block_size;
  struct Planned {
    Sequence* seq;
    int n;
    int new_blocks;
  };
  std::vector<Planned> plan;
  int budget = options_.max_batch_tokens;
  int decode_blocks = 0;
  std::vector<SeqId> starved;
  // Sequences finished on arrival are reported without running.
  std::vector<Sequence*> finished_now;
  for (auto& sp : seqs_) {
    Sequence* s = sp.get();
    if (s->pending_finish != FinishReason::kNone) {
      finished_now.push_back(s);
      continue;
    }
    if (!s->decoding()) continue;
    const int nb = BlocksForTokens(s->num_cached + 1, bs) - static_cast<int>(s->blocks.size());
    plan.push_back({s, 1, std::max(0, nb)});
    decode_blocks += std::max(0, nb);
    if (nb > 0) starved.push_back(s->id);
    --budget;
  }
  if (decode_blocks > pool_->num_free()) {
    std::string ids;
    for (SeqId id : starved) {
      if (!ids.empty()) ids += ',';
      ids += std::to_string(id);
    }
    return ResourceExhausted("KV pool: decode needs " + std::to_string(decode_blocks) +
                             " new blocks (sequences " + ids + "), " +
                             std::to_string(pool_->num_free()) + " free");
  }
  int free_after = pool_->num_free() - decode_blocks;
  bool prefill_waiting = false;
  for (auto& sp : seqs_) {
    Sequence* s = sp.get();
    if (s->pending_finish != FinishReason::kNone || s->decoding()) continue;
    prefill_waiting = true;
    if (budget <= 0) break;
    const int remaining = static_cast<int>(s->tokens.size()) - s->num_cached;
    int n = std::min(remaining, budget);
    // Shrink the chunk to what the free blocks can hold.
    const int capacity = (static_cast<int>(s->blocks.size()) + free_after) * bs - s->num_cached;
    n = std::min(n, capacity);
    if (n <= 0) break;
    const int nb =
        std::max(0, BlocksForTokens(s->num_cached + n, bs) - static_cast<int>(s->blocks.size()));
    plan.push_back({s, n, nb});
    free_after -= nb;
    budget -= n;
  }
  if (plan.empty() && finished_now.empty() && prefill_waiting) {
    return ResourceExhausted("KV pool: no free block for the next prompt chunk (" +
                             std::to_string(pool_->num_free()) + " free)");
  }

  // Allocate (cannot fail: counted above) and build the batch.
  std::vector<ForwardItem> items;
  bool pure_decode = true;
  for (Planned& p : plan) {
    if (p.new_blocks > 0) {
      auto got = pool_->Allocate(p.new_blocks);
      PW_CHECK(got.ok());
      p.seq->blocks.insert(p.seq->blocks.end(), got->begin(), got->end());
    }
    ForwardItem it;
    it.seq_id = p.seq->id;
    it.tokens = p.seq->tokens.data() + p.seq->num_cached;
    it.n = p.n;
    it.start_pos = p.seq->num_cached;
    it.blocks = p.seq->blocks.data();
    const bool samples = static_cast<size_t>(p.seq->num_cached + p.n) == p.seq->tokens.size();
    it.logits = samples ? LogitsWanted::kLast : LogitsWanted::kNone;
    if (!p.seq->decoding()) pure_decode = false;
    items.push_back(it);
  }
  std::vector<float> logits;
  if (!items.empty()) PW_RETURN_IF_ERROR(runner_->Forward(items, pure_decode, &logits));

  const size_t V = static_cast<size_t>(vocab_size());
  size_t row = 0;
  std::vector<SeqId> done;
  for (Sequence* s : finished_now) {
    SequenceUpdate u;
    u.id = s->id;
    u.finished = true;
    u.reason = s->pending_finish;
    result.updates.push_back(std::move(u));
    done.push_back(s->id);
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence* s = plan[i].seq;
    const bool was_decode = s->decoding();
    s->num_cached += plan[i].n;
    if (was_decode) {
      result.num_decode_tokens++;
    } else {
      result.num_prefill_tokens += plan[i].n;
    }
    SequenceUpdate u;
    u.id = s->id;
    if (items[i].logits == LogitsWanted::kLast) {
      const int32_t tok = SampleToken(logits.data() + row * V, static_cast<int>(V), s->params,
                                      static_cast<uint64_t>(s->num_generated), &sample_scratch_);
      if (options_.return_logits) {
        u.logits.assign(logits.begin() + static_cast<std::ptrdiff_t>(row * V),
                        logits.begin() + static_cast<std::ptrdiff_t>((row + 1) * V));
      }
      if (s->params.logprobs >= 0) {
        u.logprobs.push_back(
            ComputeLogprobs(logits.data() + row * V, static_cast<int>(V), tok, s->params.logprobs));
      }
      ++row;
      s->tokens.push_back(tok);
      s->num_generated++;
      u.new_tokens.push_back(tok);
      if (IsStop(*s, tok)) {
        u.reason = FinishReason::kStop;
      } else if (s->num_generated >= s->params.max_tokens ||
                 s->tokens.size() >= static_cast<size_t>(options_.max_context)) {
        u.reason = FinishReason::kLength;
      }
      if (u.reason != FinishReason::kNone) {
        u.finished = true;
        done.push_back(s->id);
      }
    }
    result.updates.push_back(std::move(u));
  }
  for (SeqId id : done) PW_CHECK(RemoveSequence(id).ok());
  return result;
}

Status Engine::CheckPrefill(const PrefillJob& job) const {
  const size_t n = job.prompt.size();
  if (job.num_generated_before < 0 || static_cast<size_t>(job.num_generated_before) >= n) {
    return InvalidArgument("prefill: num_generated_before must be in [0, prompt size)");
  }
  if (job.num_computed < 0 || static_cast<size_t>(job.num_computed) > n) {
    return InvalidArgument("prefill: num_computed outside [0, prompt size]");
  }
  if (job.prompt_logprobs < -1 || job.prompt_logprobs > kMaxLogprobs) {
    return InvalidArgument("prefill: prompt_logprobs must be in [-1, " +
                           std::to_string(kMaxLogprobs) + "]");
  }
  const std::vector<int32_t> ids(job.prompt.begin(), job.prompt.end());
  PW_RETURN_IF_ERROR(CheckNewSequence(kEvalSeqId, ids, job.params, 0, /*eval=*/true));
  const int need = BlocksForTokens(static_cast<int>(n), options_.block_size);
  if (static_cast<int>(job.block_ids.size()) < need) {
    return InvalidArgument("prefill: " + std::to_string(job.block_ids.size()) + " KV blocks for " +
                           std::to_string(n) + " tokens, need " + std::to_string(need));
  }
  for (int32_t b : job.block_ids) {
    if (!pool_->IsAllocated(b)) {
      return InvalidArgument("prefill: KV block " + std::to_string(b) + " is not allocated");
    }
  }
  return Status::Ok();
}

Result<int> Engine::PrefillPass(std::span<PrefillJob> jobs) {
  std::vector<ForwardItem> items;
  int budget = options_.max_batch_tokens;
  for (PrefillJob& job : jobs) {
    if (budget <= 0) break;
    if (job.done()) continue;
    PW_RETURN_IF_ERROR(CheckPrefill(job));
    const int n = static_cast<int>(job.prompt.size());
    ForwardItem it;
    it.seq_id = kEvalSeqId - 1 - items.size();
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
    items.push_back(it);
  }
  if (items.empty()) return 0;
  std::vector<float> logits;
  PW_RETURN_IF_ERROR(runner_->Forward(items, false, &logits));
  const size_t V = static_cast<size_t>(vocab_size());
  int ran = 0;
  size_t k = 0;
  size_t row = 0;  // first logits row of items[k]
  for (PrefillJob& job : jobs) {
    if (k == items.size()) break;
    if (job.done()) continue;
    const ForwardItem& it = items[k];
    if (it.logits == LogitsWanted::kAll) {
      // Row r predicts prompt position start_pos + r + 1 (the last row of the prompt predicts
      // the first generated token and is sampled below).
      for (int r = 0; r < it.n; ++r) {
        const size_t next = static_cast<size_t>(it.start_pos + r + 1);
        if (next >= job.prompt.size()) break;
        job.result.prompt_logprobs.push_back(ComputeLogprobs(logits.data() + (row + r) * V,
                                                             static_cast<int>(V), job.prompt[next],
                                                             job.prompt_logprobs));
      }
    }
    const size_t rows = it.logits == LogitsWanted::kAll    ? static_cast<size_t>(it.n)
                        : it.logits == LogitsWanted::kLast ? 1
                                                           : 0;
    job.num_computed += it.n;
    ran += it.n;
    if (job.done()) {
      const float* last_row = logits.data() + (row + rows - 1) * V;
      job.result.last_logits.assign(last_row, last_row + V);
      job.result.first_token =
          SampleToken(last_row, static_cast<int>(V), job.params,
                      static_cast<uint64_t>(job.num_generated_before), &sample_scratch_);
      if (job.params.logprobs >= 0) {
        job.result.first_logprobs = ComputeLogprobs(last_row, static_cast<int>(V),
                                                    job.result.first_token, job.params.logprobs);
      }
    }
    row += rows;
    ++k;
  }
  return ran;
}

Status Engine::PrefillBatch(std::span<PrefillJob> jobs) {
  while (true) {
    PW_ASSIGN_OR_RETURN(int ran, PrefillPass(jobs));
    if (ran == 0) break;
  }
  for (const PrefillJob& job : jobs) {
    if (!job.done()) return Internal("prefill: a job did not finish");
  }
  return Status::Ok();
}

Result<PrefillResult> Engine::Prefill(std::span<const int32_t> prompt,
                                      std::span<const int32_t> block_ids,
                                      const SamplingParams& params, int num_generated_before) {
  PrefillJob job;
  job.prompt = prompt;
  job.block_ids = block_ids;
  job.params = params;
  job.num_generated_before = num_generated_before;
  PW_RETURN_IF_ERROR(CheckPrefill(job));
  PW_RETURN_IF_ERROR(PrefillBatch({&job, 1}));
  return std::move(job.result);
}

Result<std::vector<float>> Engine::ForwardLogits(std::span<const int32_t> ids) {
  const std::vector<int32_t> v(ids.begin(), ids.end());
  SamplingParams greedy;
  PW_RETURN_IF_ERROR(CheckNewSequence(kEvalSeqId, v, greedy, 0, /*eval=*/true));
  PW_ASSIGN_OR_RETURN(
      std::vector<int32_t> blocks,
      pool_->Allocate(BlocksForTokens(static_cast<int>(ids.size()), options_.block_size)));
  std::vector<float> logits;
  logits.reserve(ids.size() * static_cast<size_t>(vocab_size()));
  Status st;
  const int n = static_cast<int>(ids.size());
  for (int start = 0; start < n && st.ok(); start += options_.max_batch_tokens) {
    ForwardItem it;
    it.seq_id = kEvalSeqId;
    it.tokens = ids.data() + start;
    it.n = std::min(options_.max_batch_tokens, n - start);
    it.start_pos = start;
    it.blocks = blocks.data();
    it.logits = LogitsWanted::kAll;
    st = runner_->Forward({&it, 1}, false, &logits);
  }
  PW_CHECK(pool_->Free(blocks).ok());
  if (!st.ok()) return st;
  return logits;
}

}  // namespace pw::engine
