// GenerationBackend: where the router sends admitted requests (token ids in, token ids out).
//
// The cluster implementation (cluster_backend.h) speaks the control-plane protocol with prefill
// and decode workers; anything else that turns prompts into token streams can stand behind the
// same interface. The router never sees workers, KV leases or re-submissions: only a stream of
// tokens per request and one terminal event.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace pw::router {

// Sampling for one request (the router validated every field).
struct SamplingOptions {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 = off
  uint64_t seed = 0;         // used when has_seed; otherwise the backend picks one
  bool has_seed = false;
  int32_t max_tokens = 16;              // generated tokens, >= 1
  std::vector<int32_t> stop_token_ids;  // end-of-sequence ids: generation stops after one
  bool ignore_eos = false;              // also ignore the model's own end-of-sequence ids
  // -1: none; N >= 0: each generated token's log-probability with N alternatives.
  int32_t logprobs = -1;
  // -1: none; N >= 0: the prompt tokens' log-probabilities (OnPromptLogprobs) with N
  // alternatives.
  int32_t prompt_logprobs = -1;
};

// A token's log-probability (natural log of the model's own distribution: the raw logits'
// softmax, before temperature, top-k and top-p) and the most likely alternatives there.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

struct GenerationRequest {
  uint64_t id = 0;              // unique per router process, never 0
  std::vector<int32_t> prompt;  // token ids, non-empty, shorter than the context
  SamplingOptions sampling;
  // Non-zero: requests of one group have the same prompt (the candidates of one API request);
  // a backend may compute that prompt once for all of them.
  uint64_t share_group = 0;
};

enum class FinishReason {
  kStop,       // a stop token was generated (it is included in the tokens delivered)
  kLength,     // max_tokens or the context reached
  kCancelled,  // cancelled by the router
  kError,      // failed; the Status says why
};

const char* FinishReasonName(FinishReason r);

// Implemented by the router. Called from backend threads; implementations must be thread-safe
// and cheap (they hand the event to the router's own thread).
class GenerationEvents {
 public:
  virtual ~GenerationEvents() = default;
  // Tokens of request `id`, in order: `start_index` is the output index of tokens[0] (0 = the
  // first generated token). A backend never skips an index; it may repeat indices already
  // delivered after a failover (the receiver ignores indices it has). `logprobs`: one per
  // token when sampling.logprobs >= 0, else empty.
  virtual void OnTokens(uint64_t id, uint32_t start_index, std::vector<int32_t> tokens,
                        std::vector<TokenLogprob> logprobs) = 0;
  // sampling.prompt_logprobs >= 0: once, before the first OnTokens; entry i is prompt token
  // i + 1 given the tokens before it (the first prompt token has none).
  virtual void OnPromptLogprobs(uint64_t id, std::vector<TokenLogprob> logprobs) = 0;
  // The request ended; no more events for `id` follow. `error` is OK unless reason is kError.
  // kError with code kInvalidArgument: a worker refused the request's own values (placing it
  // again cannot help; the router answers 400); `param` names the request field ("" when not
  // known, and for every other ending).
  virtual void OnFinished(uint64_t id, FinishReason reason, Status error, std::string param) = 0;
};

// Load as the router's admission sees it.
struct BackendLoad {
  int32_t capacity = 0;         // requests the backend accepts at once now (0: no live workers)
  int32_t decode_workers = 0;   // live decode workers
  int32_t prefill_workers = 0;  // live prefill workers
  int64_t free_kv_blocks = 0;   // sum over live decode workers (last heartbeat)
  int64_t used_kv_blocks = 0;
  // KV admission (kv_admission.h): the most KV blocks the live decode workers can hold at once
  // (each with expert widths lowered as far as its planner may), summed and the largest one's
  // (a sequence lives on one worker), and tokens per block. 0: the backend does not say.
  int64_t kv_capacity_blocks = 0;
  int64_t kv_capacity_max_blocks = 0;
  int32_t kv_block_tokens = 0;
  // A live decode worker has registered and not yet said its capacity (its first heartbeat is
  // on its way): admission waits for it rather than count without it.
  bool kv_capacity_pending = false;
  uint64_t requests_replaced = 0;  // cumulative: placements made again after a worker failure
};

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  // Set once, before the first Submit.
  virtual void SetEvents(GenerationEvents* events) = 0;
  // Starts a request. Thread-safe. Errors (kUnavailable: no live workers) are returned here and
  // produce no events; after OK exactly one OnFinished follows (unless Cancel was called).
  virtual Status Submit(GenerationRequest request) = 0;
  // Stops request `id` on the workers and frees its KV. Thread-safe; unknown ids are ignored.
  // After Cancel no more events are delivered for `id`.
  virtual void Cancel(uint64_t id) = 0;
  // Thread-safe snapshot.
  virtual BackendLoad Load() const = 0;
  // The router's /live: "" while the backend's own loop comes round, else why not. Any thread.
  virtual std::string NotLive() const { return ""; }
};

}  // namespace pw::router
