// Router: the OpenAI-compatible front end. Parses and validates requests, tokenizes, admits
// (bounded queue, 429 with Retry-After when full), hands requests to a GenerationBackend,
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
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "services/router/backend.h"
#include "services/router/http_server.h"
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
  int retry_after_seconds = 1;          // Retry-After of a 429
  std::chrono::milliseconds request_timeout{300000};  // admission -> end; then cancelled
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
  void OnTokens(uint64_t id, uint32_t start_index, std::vector<int32_t> tokens) override;
  void OnFinished(uint64_t id, FinishReason reason, Status error) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct InFlight {
    uint64_t id = 0;
    std::string endpoint_label;
    std::shared_ptr<HttpExchange> exchange;
    ResponseContext ctx;
    GenerationRequest request;
    std::unique_ptr<TextDecoder> decoder;
    StopMatcher stop{{}};
    bool stream = false;           // SSE response (begun at admission)
    std::string text;              // non-stream: the response text so far
    uint32_t tokens_received = 0;  // output tokens received (index of the next one)
    bool submitted = false;        // at the backend (running) vs waiting
    uint64_t timer_id = 0;
    Clock::time_point admitted;
    Clock::time_point last_token;
  };

  void HandleGenerate(HttpRequest request, std::shared_ptr<HttpExchange> exchange, Endpoint ep);
  void Reply(HttpExchange& ex, const std::string& endpoint, int status, std::string body,
             HttpHeaders headers = {}, std::string content_type = "application/json");
  void ReplyError(HttpExchange& ex, const std::string& endpoint, const ApiError& e,
                  HttpHeaders headers = {});
  // Submits waiting requests while the backend has capacity.
  void Pump();
  void DeliverTokens(uint64_t id, uint32_t start_index, std::vector<int32_t> tokens);
  void DeliverFinished(uint64_t id, FinishReason reason, Status error);
  // Sends text (stream: a chunk; otherwise appends).
  void Emit(InFlight& r, std::string_view text);
  // Ends the request: final chunk/usage/[DONE] or the full response; removes it.
  void Complete(uint64_t id, std::string_view finish_reason);
  // Ends the request with an error (status for a response not yet started).
  void Fail(uint64_t id, const ApiError& e);
  // Removes the request and releases its accounting; cancels at the backend when `cancel`.
  std::unique_ptr<InFlight> Remove(uint64_t id, bool cancel);
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
  std::unordered_map<uint64_t, std::unique_ptr<InFlight>> requests_;
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
