#include "engine/engine.h"

#include <algorithm>
#include <string>

#include "engine/models/model.h"
#include "engine/runner/cpu_runner.h"
#include "engine/scheduler/scheduler.h"

namespace pw::engine {

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
  PW_ASSIGN_OR_RETURN(
      e->model_, Model::Load(model_dir, options.copy_weights ? FileLoad::kCopy : FileLoad::kMap));
  PW_RETURN_IF_ERROR(e->model_->QuantizeDense(options.dense, options.lm_head, options.num_threads));
  if (PackBf16Experts(options.bf16_experts)) PW_RETURN_IF_ERROR(e->model_->PackExperts(options.num_threads));
  const ModelConfig& c = e->model_->config();
  if (e->options_.max_context == 0) {
    e->options_.max_context =
        c.max_position_embeddings > 0 ? static_cast<int>(c.MaxContext()) : 4096;
  }
  KvLayout layout;
  layout.num_layers = static_cast<int>(c.num_layers);
  layout.num_kv_heads = static_cast<int>(c.num_kv_heads);
  layout.head_dim = static_cast<int>(c.head_dim);
  layout.block_size = options.block_size;
  layout.dtype = options.kv_dtype;
  // A hybrid's linear-attention layers keep a recurrent state per sequence, in the pool;
  // sliding-window layers (gpt_oss) are their own KV kind: pages behind the window go back.
  std::vector<memory::KvLayerSpec> specs = memory::ModelKvSpecs(c);
  std::unique_ptr<KvBlockPool> blocks;
  if (options.kv_pages != nullptr) {
    PW_ASSIGN_OR_RETURN(blocks, KvBlockPool::CreateOn(layout, options.kv_pages,
                                                      options.num_kv_blocks, std::move(specs)));
  } else {
    PW_ASSIGN_OR_RETURN(blocks,
                        KvBlockPool::Create(layout, options.num_kv_blocks, std::move(specs)));
  }
  e->scheduler_ =
      std::make_unique<Scheduler>(SchedulerOptions{options.max_batch_tokens}, std::move(blocks));
  for (int64_t id : c.eos_token_ids) e->eos_ids_.push_back(static_cast<int32_t>(id));
  e->runner_ = e->NewRunner(options.num_threads);
  return e;
}

std::unique_ptr<Runner> Engine::NewRunner(int num_threads) {
  return std::make_unique<CpuRunner>(*model_, scheduler_->runner_blocks(), num_threads);
}

const KvBlockPool& Engine::kv_pool() const { return scheduler_->blocks(); }

Result<std::vector<int32_t>> Engine::LeaseKvBlocks(int n) { return scheduler_->Lease(n); }

Status Engine::ReturnKvBlocks(std::span<const int32_t> block_ids) {
  return scheduler_->Return(block_ids);
}

uint8_t* Engine::LeasedKvPage(int32_t block, int layer, int k) {
  PW_CHECK(scheduler_->IsLeased(block));
  return scheduler_->runner_blocks()->LayerPage(block, layer, k);
}
int Engine::vocab_size() const { return static_cast<int>(model_->config().vocab_size); }
int Engine::max_context() const { return options_.max_context; }
const Model& Engine::model() const { return *model_; }
void Engine::SetMoeHooks(const MoeHooks& hooks) { runner_->SetHooks(hooks); }
void Engine::SetBlockTimes(BlockTimes* times) { runner_->SetBlockTimes(times); }

const std::vector<int32_t>& Engine::eos_token_ids() const { return eos_ids_; }

bool Engine::HasWork() const { return !scheduler_->sequences().empty(); }
int Engine::num_sequences() const { return static_cast<int>(scheduler_->sequences().size()); }

std::vector<SequenceInfo> Engine::Sequences() const {
  std::vector<SequenceInfo> out;
  for (const auto& s : scheduler_->sequences()) {
    out.push_back({s->id, s->num_prompt, s->num_generated, s->num_cached,
                   static_cast<int>(s->blocks.size()), !s->decoding()});
  }
  return out;
}

Status Engine::CheckNewSequence(SeqId id, const std::vector<int32_t>& prompt,
                                const SamplingParams& params, size_t num_generated,
                                bool eval) const {
  if (scheduler_->Find(id) != nullptr) {
    return InvalidArgument("sequence " + std::to_string(id) + " already exists");
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
  if (need > kv_pool().num_blocks()) {
    return OutOfRange("sequence " + std::to_string(id) + ": needs " + std::to_string(need) +
                      " KV blocks, the pool has " + std::to_string(kv_pool().num_blocks()));
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
  scheduler_->Add(std::move(s));
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
    // A sequence's block, a free block or an unknown id is not leased.
    if (!scheduler_->IsLeased(block_ids[i])) {
      return InvalidArgument("sequence " + std::to_string(id) + ": KV block " +
                             std::to_string(block_ids[i]) + " is not a leased block");
    }
    for (size_t j = 0; j < i; ++j) {
      if (block_ids[j] == block_ids[i]) {
        return InvalidArgument("sequence " + std::to_string(id) + ": KV block " +
                               std::to_string(block_ids[i]) + " listed twice");
      }
    }
  }
  scheduler_->Adopt(block_ids);
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
  scheduler_->Add(std::move(s));
  return Status::Ok();
}

Status Engine::RemoveSequence(SeqId id) { return scheduler_->Remove(id); }

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
  PW_ASSIGN_OR_RETURN(ScheduledBatch sb, scheduler_->Schedule());
  std::vector<float> logits;
  if (!sb.items.empty()) PW_RETURN_IF_ERROR(runner_->Forward(sb.batch(), &logits));

  StepResult result;
  std::vector<SeqId> done;
  for (Sequence* s : sb.finished_on_arrival) {
    SequenceUpdate u;
    u.id = s->id;
    u.finished = true;
    u.reason = s->pending_finish;
    result.updates.push_back(std::move(u));
    done.push_back(s->id);
  }
  const size_t V = static_cast<size_t>(vocab_size());
  size_t row = 0;
  for (const ScheduledItem& item : sb.scheduled) {
    Sequence* s = item.seq;
    s->num_cached += item.n;
    if (item.decode) {
      result.num_decode_tokens++;
    } else {
      result.num_prefill_tokens += item.n;
    }
    SequenceUpdate u;
    u.id = s->id;
    if (item.samples) {
      SampleNext(s, logits.data() + row * V, &u);
      ++row;
      if (u.finished) done.push_back(s->id);
    }
    result.updates.push_back(std::move(u));
  }
  for (SeqId id : done) PW_CHECK(scheduler_->Remove(id).ok());
  return result;
}

void Engine::SampleNext(Sequence* s, const float* row, SequenceUpdate* u) {
  const int V = vocab_size();
  const int32_t tok =
      SampleToken(row, V, s->params, static_cast<uint64_t>(s->num_generated), &sample_scratch_);
  if (options_.return_logits) u->logits.assign(row, row + V);
  if (s->params.logprobs >= 0) {
    u->logprobs.push_back(ComputeLogprobs(row, V, tok, s->params.logprobs));
  }
  s->tokens.push_back(tok);
  s->num_generated++;
  u->new_tokens.push_back(tok);
  if (IsStop(*s, tok)) {
    u->reason = FinishReason::kStop;
  } else if (s->num_generated >= s->params.max_tokens ||
             s->tokens.size() >= static_cast<size_t>(options_.max_context)) {
    u->reason = FinishReason::kLength;
  }
  u->finished = u->reason != FinishReason::kNone;
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
    if (!scheduler_->IsLeased(b)) {
      return InvalidArgument("prefill: KV block " + std::to_string(b) + " is not leased");
    }
  }
  return Status::Ok();
}

Result<int> Engine::PrefillPass(std::span<PrefillJob> jobs) {
  const PrefillPassPlan plan = scheduler_->ComposePrefillPass(jobs, kEvalSeqId - 1);
  // Every job the pass schedules is checked before anything runs.
  for (size_t j : plan.job_index) PW_RETURN_IF_ERROR(CheckPrefill(jobs[j]));
  if (plan.items.empty()) return 0;
  std::vector<float> logits;
  PW_RETURN_IF_ERROR(runner_->Forward({plan.items, /*pure_decode=*/false}, &logits));
  const size_t V = static_cast<size_t>(vocab_size());
  int ran = 0;
  size_t row = 0;  // first logits row of the current item
  for (size_t k = 0; k < plan.items.size(); ++k) {
    const ForwardItem& it = plan.items[k];
    PrefillJob& job = jobs[plan.job_index[k]];
    const size_t rows = it.logits == LogitsWanted::kAll    ? static_cast<size_t>(it.n)
                        : it.logits == LogitsWanted::kLast ? 1
                                                           : 0;
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
    job.num_computed += it.n;
    ran += it.n;
    if (job.done()) FinishPrefill(logits.data() + (row + rows - 1) * V, &job);
    row += rows;
  }
  return ran;
}

void Engine::FinishPrefill(const float* last_row, PrefillJob* job) {
  const int V = vocab_size();
  job->result.last_logits.assign(last_row, last_row + V);
  job->result.first_token = SampleToken(last_row, V, job->params,
                                        static_cast<uint64_t>(job->num_generated_before),
                                        &sample_scratch_);
  if (job->params.logprobs >= 0) {
    job->result.first_logprobs =
        ComputeLogprobs(last_row, V, job->result.first_token, job->params.logprobs);
  }
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
      scheduler_->Lease(BlocksForTokens(static_cast<int>(ids.size()), options_.block_size)));
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
    st = runner_->Forward({{&it, 1}, /*pure_decode=*/false}, &logits);
  }
  PW_CHECK(scheduler_->Return(blocks).ok());
  if (!st.ok()) return st;
  return logits;
}

}  // namespace pw::engine
