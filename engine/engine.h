// Engine: the in-process CPU inference engine the workers, CLIs and tests drive.
//
// One Engine owns a loaded model (bf16 weights, mmapped), a scheduler (engine/scheduler/: the
// sequences it is serving and the paged KV blocks, memory/kv_blocks.h) and a runner
// (engine/runner/: the device that executes a batch; the CPU runner today). It runs a
// continuous-batching loop one iteration at a time; each Step() is schedule, run, sample:
//
//   auto engine = Engine::Create("models/tiny-moe", {.num_kv_blocks = 1024});
//   engine->AddSequence(7, prompt_ids, params);
//   while (engine->HasWork()) {
//     auto step = engine->Step();           // one iteration
//     for (auto& u : step->updates) ...     // u.id, u.new_tokens, u.finished, u.reason
//   }
//
// Sequence life cycle. AddSequence queues a sequence in the PREFILL phase. Each Step() gives
// every DECODE-phase sequence one token and spends the remaining token budget
// (max_batch_tokens) on prompt chunks of PREFILL-phase sequences in arrival order (chunked
// prefill). When a sequence's last prompt chunk runs, its first token is sampled in that same
// step and it moves to DECODE. A sequence that finishes (stop token, max_tokens, context full)
// is reported once with finished = true, its KV blocks are freed and its id forgotten.
// RemoveSequence drops a sequence at any time (cancel, preemption) and frees its blocks.
// Sequences may be added and removed between any two steps.
//
// Disaggregated serving uses the lower-level calls:
//   - prefill worker: Prefill(prompt, block_ids, params) computes a prompt's KV into blocks
//     the caller leased (LeaseKvBlocks) and returns the last position's logits and the first
//     sampled token. The caller then copies the blocks to the decode worker (whole blocks,
//     layout in memory/kv_blocks.h) and returns them (ReturnKvBlocks).
//   - decode worker: leases blocks (LeaseKvBlocks), lets the prefill worker write them, then
//     AddPrefilledSequence(id, prompt, block_ids, first_token, params) hands them to the
//     engine, which decodes from that KV. If the request is cancelled before that, the caller
//     returns the leased blocks (ReturnKvBlocks).
//   The engine's scheduler is the one object that allocates and frees KV blocks; callers read
//   the pool through kv_pool() (const) and write leased pages only.
//   - preemption/recompute: RemoveSequence(id), later AddSequence(id, prompt, params,
//     generated) with the tokens already sent: the engine re-prefills prompt + generated and
//     continues, counting `generated` toward max_tokens and continuing the seeded random
//     stream where it stopped, so the output is identical to an uninterrupted run.
//   - failover (a decode worker lost): the prompt's KV from a prefill worker as usual, then
//     AddPrefilledSequence(..., num_generated_before, num_uncached) with the tokens already
//     sent: this engine computes their KV itself, with its own experts, as it would have had
//     it decoded them.
//
// Evaluation: ForwardLogits(ids) returns every position's logits of one sequence (teacher
// forcing), using temporary leased blocks.
//
// Threading: an Engine is driven by one thread at a time (not thread-safe). Internally it
// splits kernels over `num_threads` threads.
//
// Numerics: bf16 weights, fp32 activations, fp32 accumulation, fp32 KV. A sequence's logits do
// not depend on what else is in the batch beyond kernel summation order (~1e-6), so greedy
// tokens are the same alone, batched, chunked or disaggregated unless two candidates tie
// within that. Measured against HF transformers (fp32 from the same bf16 weights): max abs
// logit difference ~2e-6 on the random fixtures, ~2e-5 on the tiny model.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/experts/bf16_experts.h"
#include "engine/experts/moe.h"
#include "common/dense_format.h"
#include "engine/sampler/sampler.h"
#include "engine/scheduler/prefill_job.h"
#include "engine/scheduler/sequence.h"
#include "memory/kv_blocks.h"

namespace pw::engine {

class Model;
class Runner;
struct BlockTimes;
class Scheduler;

// The KV block vocabulary of the engine's callers (memory/kv_layout.h, memory/kv_blocks.h).
using memory::BlocksForTokens;
using memory::kKvLayoutVersion;
using memory::KvBlockPool;
using memory::KvDtype;
using memory::KvDtypeName;
using memory::KvLayout;
using memory::ParseKvDtype;

struct EngineOptions {
  // KV pool size in blocks, and tokens per block.
  int num_kv_blocks = 1024;
  int block_size = 16;
  // Threads computing kernels, including the calling thread.
  int num_threads = 2;
  // Most tokens one Step() (or one internal prefill chunk) runs: decode tokens plus prompt
  // chunk tokens. Decode sequences always get their token even beyond this budget.
  int max_batch_tokens = 256;
  // Longest sequence (prompt + generated) accepted; 0 = the model's ModelConfig::MaxContext()
  // (max_position_embeddings; x factor for dynamic NTK RoPE).
  int max_context = 0;
  // When true, Step() also returns the logits each new token was sampled from (tests,
  // logprobs). Costs a [vocab] copy per token.
  bool return_logits = false;
  // How the dense matrices read once per token (attention, lm_head, dense and shared MLPs) are
  // held (common/dense_format.h, Model::QuantizeDense): bf16 as the checkpoint (HF
  // parity), int8 copies with one scale per row (llama.cpp's q8_0), or any-precision codes at
  // 3..8 bits, multiplied against int8 activations; the lm_head's own format (kAsDense: the same).
  DenseFormat dense = DenseFormat::kBf16;
  DenseFormat lm_head = DenseFormat::kAsDense;
  // How the checkpoint's routed experts are held (engine/experts/bf16_experts.h): as they are,
  // packed losslessly (Model::PackExperts), or auto (packed where the packed product runs in
  // registers). Experts a hook's provider serves (a store, the broker) are that provider's.
  Bf16ExpertForm bf16_experts = Bf16ExpertForm::kPlain;
  // When true the checkpoint is read into the process's own memory at start instead of mapped
  // from the page cache (llama.cpp's --no-mmap): a copy per process, read once; decode read it
  // faster on an AMD Zen 4 host (docs/benchmarks.md, "Weights copied into the process").
  bool copy_weights = false;
  // KV elements: fp32 (exact parity with the reference) or bf16 (half the memory; attention
  // still accumulates in fp32).
  KvDtype kv_dtype = KvDtype::kF32;
  // When set, KV blocks take their pages from this pool (borrowed: a decode worker's page pool,
  // shared with its expert weights), num_kv_blocks being the most blocks at once; when null the
  // engine makes its own pool of num_kv_blocks blocks.
  memory::PagePool* kv_pages = nullptr;
};

// What one sequence did in one Step().
struct SequenceUpdate {
  SeqId id = 0;
  // Tokens generated this step: 0 (prompt chunk ran, more to come) or 1. A stop token is
  // included (callers rendering text skip it).
  std::vector<int32_t> new_tokens;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  // [vocab] logits the new token was sampled from; only with EngineOptions::return_logits.
  std::vector<float> logits;
  // One entry per new token when the sequence's params.logprobs >= 0 (engine/sampler/sampler.h).
  std::vector<TokenLogprobs> logprobs;
};

struct StepResult {
  // One entry per sequence that ran this step, in the engine's scheduling order.
  std::vector<SequenceUpdate> updates;
  int num_decode_tokens = 0;   // sequences that decoded one token
  int num_prefill_tokens = 0;  // prompt tokens processed (all chunks)
};

// Per-sequence view for schedulers and metrics.
struct SequenceInfo {
  SeqId id = 0;
  int num_prompt_tokens = 0;
  int num_generated = 0;
  int num_cached = 0;  // tokens whose KV is in the pool
  int num_blocks = 0;  // blocks the sequence holds
  bool prefilling = false;
};

class Engine {
 public:
  // Loads config.json and the safetensors weights of `model_dir` (errors name the file and the
  // tensor or field), allocates the KV pool. kInvalidArgument for bad options.
  static Result<std::unique_ptr<Engine>> Create(const std::string& model_dir,
                                                const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a sequence. `prompt` non-empty, every id in [0, vocab_size()); prompt + generated
  // shorter than max_context(); params valid (ValidateSamplingParams); generated.size() <
  // params.max_tokens. Errors: kInvalidArgument (bad ids/params, duplicate id), kOutOfRange
  // (too long). Nothing is allocated until Step() schedules it.
  Status AddSequence(SeqId id, std::vector<int32_t> prompt, const SamplingParams& params,
                     std::vector<int32_t> generated = {});

  // Adds a sequence whose prompt KV is already in `block_ids` (blocks leased with
  // LeaseKvBlocks, holding positions [0, prompt.size()) in table order) and whose first
  // generated token is `first_token` (its KV is computed by the next Step()). The lease ends
  // and the sequence holds the blocks (freed when it finishes or is removed) on success only.
  // Errors as AddSequence, plus kInvalidArgument when a block is not leased, is listed twice,
  // or there are fewer blocks than the prompt needs.
  // `num_generated_before`: how many trailing tokens of `prompt` were generated earlier (a
  // request re-prefilled after a failover or preemption with the tokens already sent); they
  // count toward max_tokens and the seeded random stream continues after them. Must be <
  // params.max_tokens.
  // `num_uncached`: how many trailing tokens of `prompt` have no KV in `block_ids` (a request
  // placed again after a failover: the tokens it had streamed). The next steps compute their
  // KV and first_token's with this engine's experts as one prompt chunk (or several, within
  // max_batch_tokens), then sample; `block_ids` need hold only the positions before them
  // (further blocks are allocated as the chunks run). With batch-invariant kernels a token's
  // KV and logits are the same in a chunk as in a decode step, so the sequence continues
  // exactly as if it had decoded those tokens here. In [0, prompt.size()].
  Status AddPrefilledSequence(SeqId id, std::vector<int32_t> prompt, std::vector<int32_t> block_ids,
                              int32_t first_token, const SamplingParams& params,
                              int num_generated_before = 0, int num_uncached = 0);

  // Drops a sequence and frees its blocks. kNotFound for an unknown (or finished) id.
  Status RemoveSequence(SeqId id);

  // Runs one iteration (see the header comment). Errors:
  //   kResourceExhausted: decode sequences need new KV blocks and the pool has too few (or a
  //     queued prompt cannot get any block while nothing else can run). Nothing ran; engine
  //     state is unchanged. The caller preempts (RemoveSequence) and calls Step() again.
  //   other codes (a weight provider or routing hook failed): the step did not complete;
  //     sequences in it are left as before the step.
  Result<StepResult> Step();

  // True while some sequence is queued or running.
  bool HasWork() const;
  int num_sequences() const;
  std::vector<SequenceInfo> Sequences() const;

  // Computes the KV of `prompt` into `block_ids` (leased blocks, at least
  // BlocksForTokens(prompt.size(), block_size) of them; their previous content is
  // overwritten) in chunks of max_batch_tokens, and samples the first token with `params`.
  // The blocks stay leased to the caller. `num_generated_before` as in AddPrefilledSequence:
  // the first token is sampled as the request's draw number num_generated_before.
  Result<PrefillResult> Prefill(std::span<const int32_t> prompt, std::span<const int32_t> block_ids,
                                const SamplingParams& params, int num_generated_before = 0);

  // Batched prefill of several prompts (the prefill worker's path). CheckPrefill validates a
  // job as Prefill does (ids, params, context, blocks leased and enough of them).
  // PrefillPass runs ONE forward pass over the chunks the scheduler composes
  // (Scheduler::ComposePrefillPass: up to max_batch_tokens, jobs in order), and samples the first
  // token of each job whose last position ran. It returns the prompt tokens it ran (0 when
  // every job is done). Every job it schedules is checked first; an invalid one fails the
  // pass before anything runs. A job's KV and logits equal those of Prefill on it alone up to
  // kernel summation order (~1e-6). PrefillBatch calls PrefillPass until all jobs are done.
  Status CheckPrefill(const PrefillJob& job) const;
  Result<int> PrefillPass(std::span<PrefillJob> jobs);
  Status PrefillBatch(std::span<PrefillJob> jobs);

  // Teacher-forced logits of every position of `ids`: [ids.size(), vocab_size()] row-major.
  // Uses temporary blocks (kResourceExhausted when the pool lacks them).
  Result<std::vector<float>> ForwardLogits(std::span<const int32_t> ids);

  // Seams for any-precision experts, residency, LYNX / miss policies and tracing (moe.h).
  // Pointers are borrowed and must outlive their use; null members select the defaults
  // (bf16 experts from the checkpoint, everything resident, router's choice, no recording).
  void SetMoeHooks(const MoeHooks& hooks);
  // Where the runner adds each layer block's wall time from now on (block_times.h; borrowed,
  // null to stop).
  void SetBlockTimes(BlockTimes* times);

  // KV blocks outside sequences (header comment): n free blocks leased to the caller, all or
  // nothing (kResourceExhausted when fewer are free; contents unspecified), and given back
  // (kInvalidArgument, nothing returned, when a block is not leased or is repeated).
  Result<std::vector<int32_t>> LeaseKvBlocks(int n);
  Status ReturnKvBlocks(std::span<const int32_t> block_ids);
  // Page `k` (< kv_pool().LayerPages(layer); more than one for a hybrid's recurrent state) of
  // layer `layer` of a leased block, for a caller that fills it (a KV copy from a peer); a
  // block that is not leased is a broken invariant (aborts).
  uint8_t* LeasedKvPage(int32_t block, int layer, int k = 0);
  // The KV blocks, read-only: layout, counts, page ids and contents.
  const KvBlockPool& kv_pool() const;
  // Another runner over this engine's model and KV blocks with its own threads (tools running
  // their own batches over leased blocks, tools/lockstep_perplexity.h).
  std::unique_ptr<Runner> NewRunner(int num_threads);
  int vocab_size() const;
  int max_context() const;
  const std::vector<int32_t>& eos_token_ids() const;
  const Model& model() const;
  const EngineOptions& options() const { return options_; }

 private:
  Engine(EngineOptions options);
  Status CheckNewSequence(SeqId id, const std::vector<int32_t>& prompt,
                          const SamplingParams& params, size_t num_generated,
                          bool eval = false) const;
  bool IsStop(const Sequence& s, int32_t token) const;
  // Samples a sequence's next token from its logits row into *u and appends it; sets u's
  // finish reason when it stops or reaches a limit.
  void SampleNext(Sequence* s, const float* row, SequenceUpdate* u);
  // A job's last prompt row ran: keeps its logits and samples its first token.
  void FinishPrefill(const float* last_row, PrefillJob* job);

  EngineOptions options_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Runner> runner_;
  std::vector<int32_t> eos_ids_;
  std::vector<std::pair<float, int32_t>> sample_scratch_;
};

}  // namespace pw::engine
