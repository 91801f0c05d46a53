// Router: the OpenAI-compatible front end. Parses and validates requests, tokenizes, admits
// (bounded queue, and by the decode KV a request will need, kv_admission.h; 429 with
// Retry-After beyond the bounds), hands requests to a GenerationBackend,
// detokenizes and streams results, applies stop sequences, timeouts, client-disconnect
// cancellation and drain on shutdown, and keeps the metrics.
//
// Threading: everything here runs on the HTTP server's io thread. Backend events arrive on
// backend threads and are posted to the io thread (GenerationEvents is implemented by posting).
// Shutdown order: stop the backend (no more events), then the server, then destroy the router.
//
// Routes:
//   POST /v1/completions, POST /v1/chat/completions   generation (stream or not)
//   GET  /v1/models                                   the served model
//   GET  /health                                      200 {"status":"ok"} when serving; 503 when
//                                                     draining or no decode worker is live
//   GET  /metrics                                     Prometheus text format
//   POST /tokenize, POST /detokenize, GET /tokenizer_info   the model's tokenizer (the endpoints
//                                                     vLLM offers; evaluation harnesses use them)
//
// Choices: a request with n > 1 or best_of > 1 becomes that many backend requests (one per
// candidate, candidate i seeded with seed + i when a seed is given), answered together; with
// best_of > n the n candidates with the highest mean token log-probability are returned.
//
// API keys: when RouterOptions::api_keys is not empty, every route except /health and
// /metrics (each unless protected) needs `Authorization: Bearer <key>` with one of the keys,
// compared in constant time; otherwise 401 with an OpenAI error object. Keys are never logged.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "services/router/backend.h"
#include "services/router/generation_defaults.h"
#include "services/router/http_server.h"
#include "services/router/kv_admission.h"
#include "services/router/metrics.h"
#include "services/router/openai_api.h"
#include "services/router/stop_matcher.h"
#include "services/router/text_codec.h"

namespace pw::router {

struct RouterOptions {
  std::string model_name = "tiny-moe";  // the id clients put in "model"
  int64_t context_length = 2048;        // prompt + generated tokens must fit
  int64_t default_max_tokens = 256;     // when the request gives none (capped by context)
  size_t max_waiting = 256;             // admission queue bound; full -> 429
  // Admission by decode KV (kv_admission.h): waiting candidates may need at most this many
  // times the KV the decode workers can hold (then 429).
  double max_queued_kv = 1.0;
  int retry_after_seconds = 1;          // Retry-After of a 429
  std::chrono::milliseconds request_timeout{300000};  // admission -> end; then cancelled
  std::vector<std::string> api_keys;                  // empty: no authentication
  bool protect_health = false;   // /health needs a key too (when api_keys is set)
  bool protect_metrics = false;  // /metrics needs a key too (when api_keys is set)
  // The checkpoint's generation_config.json (filled by the app): sampling defaults a request
  // overrides, and end-of-sequence ids that stop generation besides the tokenizer's.
  GenerationDefaults generation_defaults;
};

class Router final : public GenerationEvents {
 public:
  // `codec` and `backend` must outlive the router. Call SetServer() before serving.
  Router(RouterOptions options, const TextCodec* codec, GenerationBackend* backend,
         std::shared_ptr<RouterMetrics> metrics);
  ~Router() override;

  // The server whose io thread runs the router (for Post/PostAfter).
  void SetServer(HttpServer* server) { server_ = server; }
  // The HttpHandler (io thread).
  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange);
  // Starts draining (io thread): new generation requests get 503, /health reports draining;
  // `on_drained` runs on the io thread once no request is waiting or running.
  void BeginDrain(std::function<void()> on_drained);
  // Requests admitted and not finished (io thread).
  size_t in_flight() const { return requests_.size(); }

  // GenerationEvents (backend threads): posted to the io thread.
  void OnTokens(uint64_t id, uint32_t start_index, std::vector<int32_t> tokens,
                std::vector<TokenLogprob> logprobs) override;
  void OnPromptLogprobs(uint64_t id, std::vector<TokenLogprob> logprobs) override;
  void OnFinished(uint64_t id, FinishReason reason, Status error, std::string param) override;

 private:
  using Clock = std::chrono::steady_clock;
  // One HTTP generation request: its response and its candidates.
  struct Call {
    std::string endpoint_label;
    std::shared_ptr<HttpExchange> exchange;
    ResponseContext ctx;
    bool stream = false;  // SSE response (begun at admission)
    int32_t n = 1;
    int32_t best_of = 1;
    int32_t logprobs = -1;  // asked for by the client (-1: none)
    bool echo = false;
    bool discard_output = false;  // echo with max_tokens 0: the generated token is not shown
    std::string echo_text;        // the prompt's text (echo)
    std::vector<int32_t> prompt;
    std::vector<uint64_t> ids;          // backend request ids, one per candidate (0 once finished)
    std::vector<ChoiceResult> results;  // finished candidates (non-stream)
    std::vector<double> mean_logprob;   // per candidate (best_of)
    int32_t remaining = 0;              // candidates not finished
    int64_t completion_tokens = 0;
    uint64_t timer_id = 0;
    Clock::time_point admitted;
  };
  // One candidate: a backend request.
  struct InFlight {
    uint64_t id = 0;
    std::shared_ptr<Call> call;
    int32_t index = 0;  // candidate index
    GenerationRequest request;
    std::unique_ptr<TextDecoder> decoder;
    StopMatcher stop{{}};
    std::string text;              // non-stream: the choice's text so far
    uint32_t tokens_received = 0;  // output tokens received (index of the next one)
    bool submitted = false;        // at the backend (running) vs waiting
    int64_t kv_blocks = 0;         // KV blocks it needs by its end (kv_admission.h)
    Clock::time_point last_token;
    // Log-probabilities (when the client asked for them or best_of needs them).
    std::vector<LogprobEntry> logprobs;  // non-stream: all; stream: not yet sent
    TextOffsetCounter offsets;
    double sum_logprob = 0;
    int64_t scored_tokens = 0;
    bool prompt_sent = false;  // echo: the prompt (and its logprobs) is in the text
  };

  void HandleGenerate(HttpRequest request, std::shared_ptr<HttpExchange> exchange, Endpoint ep);
  void HandleTokenizer(const HttpRequest& request, HttpExchange& exchange, std::string_view path);
  void TokenizeMessages(const std::string& raw_body, HttpExchange& exchange);
  // True when the request may pass; otherwise the 401 was sent.
  bool Authorized(const HttpRequest& request, HttpExchange& exchange, const std::string& label);
  void Reply(HttpExchange& ex, const std::string& endpoint, int status, std::string body,
             HttpHeaders headers = {}, std::string content_type = "application/json");
  void ReplyError(HttpExchange& ex, const std::string& endpoint, const ApiError& e,
                  HttpHeaders headers = {});
  // Submits waiting requests while the backend has capacity.
  void Pump();
  void DeliverTokens(uint64_t id, uint32_t start_index, std::vector<int32_t> tokens,
                     std::vector<TokenLogprob> logprobs);
  void DeliverPromptLogprobs(uint64_t id, std::vector<TokenLogprob> logprobs);
  LogprobEntry Entry(const TokenLogprob& lp, std::string_view text_bytes, TextOffsetCounter* offs);
  // Echo: puts the prompt (text and, when asked, `prompt_lps`) first in the choice.
  void EmitPrompt(InFlight& r, const std::vector<TokenLogprob>* prompt_lps);
  void DeliverFinished(uint64_t id, FinishReason reason, Status error, std::string param);
  // Sends text (stream: a chunk; otherwise appends).
  // Sends (stream) or collects a piece of a choice's text. `token`: the piece is what one
  // generated token released; a stream then gets a chunk even when it is empty.
  void Emit(InFlight& r, std::string_view text, bool token = false);
  // A choice's usage so far (prompt tokens, tokens received), for continuous usage chunks.
  Usage RunningUsage(const InFlight& r) const;
  // Ends a candidate: its final chunk, or its result; the response when it was the last.
  void Complete(uint64_t id, std::string_view finish_reason);
  // Ends the whole call of candidate `id` with an error (status if the response not started).
  void Fail(uint64_t id, const ApiError& e);
  void FailCall(const std::shared_ptr<Call>& call, const ApiError& e);
  // Sends the response once every candidate finished.
  void FinishCall(const std::shared_ptr<Call>& call);
  // Removes the candidate and releases its accounting; cancels at the backend when `cancel`.
  std::unique_ptr<InFlight> Remove(uint64_t id, bool cancel);
  // Removes every candidate of `call` still in the table (cancelled at the backend).
  void RemoveCall(const std::shared_ptr<Call>& call);
  void CheckDrained();
  void UpdateGauges();
  // Runs Pump() and CheckDrained() after an event.
  void AfterEvent();

  RouterOptions options_;
  const TextCodec* codec_;
  GenerationBackend* backend_;
  std::shared_ptr<RouterMetrics> metrics_;
  HttpServer* server_ = nullptr;
  ApiLimits limits_;
  KvAdmission kv_;  // committed and queued KV of the candidates (io thread)
  std::unordered_map<uint64_t, std::unique_ptr<InFlight>> requests_;  // candidates
  std::deque<uint64_t> waiting_;  // ids in admission order (may hold ids already removed)
  size_t waiting_count_ = 0;
  int32_t running_ = 0;
  uint64_t next_id_ = 1;
  bool draining_ = false;
  bool tick_scheduled_ = false;
  uint64_t replaced_seen_ = 0;  // BackendLoad::requests_replaced already counted
  std::function<void()> on_drained_;
};

}  // namespace pw::router
