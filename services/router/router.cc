#include "services/router/router.h"

#include <algorithm>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>

#include "common/logging.h"

namespace pw::router {

namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

ApiError ServerError(int status, std::string message, std::string code) {
  ApiError e;
  e.http_status = status;
  e.message = std::move(message);
  e.type = status >= 500 ? "server_error" : "invalid_request_error";
  e.code = std::move(code);
  return e;
}

std::string RandomHex(int digits) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < digits; ++i) s.push_back(kHex[rng() & 15]);
  return s;
}

}  // namespace

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

Router::Router(RouterOptions options, const TextCodec* codec, GenerationBackend* backend,
               std::shared_ptr<RouterMetrics> metrics)
    : options_(std::move(options)), codec_(codec), backend_(backend), metrics_(std::move(metrics)) {
  limits_.model_name = options_.model_name;
  limits_.max_tokens_cap = options_.context_length;
  limits_.vocab_size = codec_->vocab_size();
  backend_->SetEvents(this);
}

Router::~Router() = default;

void Router::Reply(HttpExchange& ex, const std::string& endpoint, int status, std::string body,
                   HttpHeaders headers, std::string content_type) {
  metrics_->CountRequest(endpoint, status);
  ex.Respond({status, std::move(content_type), std::move(headers), std::move(body)});
}

void Router::ReplyError(HttpExchange& ex, const std::string& endpoint, const ApiError& e,
                        HttpHeaders headers) {
  Reply(ex, endpoint, e.http_status, ErrorJson(e), std::move(headers));
}

void Router::Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
  std::string_view path = request.Path();
  const bool is_get = request.method == "GET";
  auto method_not_allowed = [&](const std::string& endpoint, const char* allowed) {
    ApiError e;
    e.http_status = 405;
    e.message =
        "method " + request.method + " is not allowed on " + std::string(path) + "; use " + allowed;
    e.code = "method_not_allowed";
    ReplyError(*exchange, endpoint, e, {{"Allow", allowed}});
  };
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    Endpoint ep = path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChatCompletions;
    std::string label = ep == Endpoint::kCompletions ? "completions" : "chat_completions";
    if (request.method != "POST") return method_not_allowed(label, "POST");
    HandleGenerate(std::move(request), std::move(exchange), ep);
    return;
  }
  if (path == "/v1/models") {
    if (!is_get) return method_not_allowed("models", "GET");
    Reply(*exchange, "models", 200, ModelsJson(options_.model_name, 0, "pagedweight"));
    return;
  }
  if (path == "/health") {
    if (!is_get) return method_not_allowed("health", "GET");
    BackendLoad load = backend_->Load();
    nlohmann::json j = {{"decode_workers", load.decode_workers},
                        {"prefill_workers", load.prefill_workers},
                        {"running", running_},
                        {"waiting", waiting_count_}};
    int status = 200;
    if (draining_) {
      j["status"] = "draining";
      status = 503;
    } else if (load.capacity <= 0) {
      // Which role has no live (reachable, not draining) worker: requests wait for it.
      nlohmann::json missing = nlohmann::json::array();
      if (load.prefill_workers == 0) missing.push_back("prefill");
      if (load.decode_workers == 0) missing.push_back("decode");
      j["status"] = "no_workers";
      j["missing"] = missing;
      status = 503;
    } else {
      j["status"] = "ok";
    }
    Reply(*exchange, "health", status, j.dump());
    return;
  }
  if (path == "/metrics") {
    if (!is_get) return method_not_allowed("metrics", "GET");
    UpdateGauges();
    // Counted before serializing so the scrape includes itself.
    metrics_->CountRequest("metrics", 200);
    exchange->Respond({200, "text/plain; version=0.0.4; charset=utf-8", {}, metrics_->Serialize()});
    return;
  }
  ApiError e;
  e.http_status = 404;
  e.message = "no route for " + request.method + " " + std::string(path);
  e.code = "not_found";
  ReplyError(*exchange, "other", e);
}

void Router::HandleGenerate(HttpRequest request, std::shared_ptr<HttpExchange> exchange,
                            Endpoint ep) {
  const std::string label = ep == Endpoint::kCompletions ? "completions" : "chat_completions";
  if (draining_) {
    metrics_->rejected.Add({{"reason", "draining"}}).Increment();
    ReplyError(
        *exchange, label,
        ServerError(503, "the server is shutting down and takes no new requests", "draining"));
    return;
  }
  auto parsed = ParseApiRequest(request.body, ep, limits_);
  if (auto* e = std::get_if<ApiError>(&parsed)) {
    ReplyError(*exchange, label, *e);
    return;
  }
  ApiRequest& api = std::get<ApiRequest>(parsed);

  // Tokenize.
  std::vector<int32_t> prompt;
  if (ep == Endpoint::kChatCompletions) {
    auto text = codec_->RenderChat(api.messages);
    if (!text.ok()) {
      ApiError e;
      e.message = "cannot apply the chat template: " + text.status().message();
      e.param = "messages";
      ReplyError(*exchange, label, e);
      return;
    }
    auto ids = codec_->Encode(*text);
    if (!ids.ok()) {
      ApiError e;
      e.message = "cannot tokenize messages: " + ids.status().message();
      e.param = "messages";
      ReplyError(*exchange, label, e);
      return;
    }
    prompt = std::move(*ids);
  } else if (api.prompt_is_tokens) {
    prompt = std::move(api.prompt_tokens);
  } else {
    auto ids = codec_->Encode(api.prompt_text);
    if (!ids.ok()) {
      ApiError e;
      e.message = "cannot tokenize prompt: " + ids.status().message();
      e.param = "prompt";
      ReplyError(*exchange, label, e);
      return;
    }
    prompt = std::move(*ids);
  }
  const int64_t ctx = options_.context_length;
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const char* prompt_param = ep == Endpoint::kCompletions ? "prompt" : "messages";
  if (n_prompt == 0) {
    ApiError e;
    e.message = "the prompt is empty after tokenization";
    e.param = prompt_param;
    ReplyError(*exchange, label, e);
    return;
  }
  if (n_prompt >= ctx) {
    ApiError e;
    e.message = "This model's maximum context length is " + std::to_string(ctx) +
                " tokens; the prompt has " + std::to_string(n_prompt) +
                " tokens, leaving no room to generate";
    e.param = prompt_param;
    e.code = "context_length_exceeded";
    ReplyError(*exchange, label, e);
    return;
  }
  int64_t max_tokens;
  if (api.max_tokens) {
    max_tokens = *api.max_tokens;
    if (n_prompt + max_tokens > ctx) {
      ApiError e;
      e.message = "This model's maximum context length is " + std::to_string(ctx) +
                  " tokens; you requested " + std::to_string(n_prompt + max_tokens) + " tokens (" +
                  std::to_string(n_prompt) + " in the prompt, " + std::to_string(max_tokens) +
                  " in the completion)";
      e.param = "max_tokens";
      e.code = "context_length_exceeded";
      ReplyError(*exchange, label, e);
      return;
    }
  } else {
    max_tokens = std::min(options_.default_max_tokens, ctx - n_prompt);
  }

  // Admission.
  if (waiting_count_ >= options_.max_waiting) {
    metrics_->rejected.Add({{"reason", "queue_full"}}).Increment();
    ApiError e = ServerError(429,
                             "the server is at capacity (" + std::to_string(waiting_count_) +
                                 " requests waiting); retry later",
                             "queue_full");
    e.type = "rate_limit_error";
    ReplyError(*exchange, label, e,
               {{"Retry-After", std::to_string(options_.retry_after_seconds)}});
    return;
  }

  auto r = std::make_unique<InFlight>();
  r->id = next_id_++;
  r->endpoint_label = label;
  r->exchange = exchange;
  r->ctx.endpoint = ep;
  r->ctx.id = (ep == Endpoint::kCompletions ? "cmpl-" : "chatcmpl-") + RandomHex(24);
  r->ctx.created = static_cast<int64_t>(std::time(nullptr));
  r->ctx.model = options_.model_name;
  r->ctx.include_usage = api.stream && api.include_usage;
  r->request.id = r->id;
  r->request.prompt = std::move(prompt);
  r->request.sampling.temperature = static_cast<float>(api.temperature);
  r->request.sampling.top_p = static_cast<float>(api.top_p);
  r->request.sampling.top_k = api.top_k;
  r->request.sampling.has_seed = api.seed.has_value();
  r->request.sampling.seed = api.seed.value_or(0);
  r->request.sampling.max_tokens = static_cast<int32_t>(max_tokens);
  if (api.ignore_eos) {
    r->request.sampling.ignore_eos = true;
  } else {
    r->request.sampling.stop_token_ids = codec_->stop_token_ids(ep);
  }
  r->decoder = codec_->NewDecoder();
  r->stop = StopMatcher(api.stop);
  r->admitted = Clock::now();
  const uint64_t id = r->id;
  metrics_->prompt_tokens.Increment(static_cast<double>(n_prompt));

  r->stream = api.stream;
  if (api.stream) {
    exchange->BeginStream(200, "text/event-stream",
                          {{"Cache-Control", "no-cache"}, {"X-Request-Id", r->ctx.id}});
    exchange->StreamWrite(StreamRoleChunk(r->ctx));
  }
  exchange->SetOnDisconnect([this, id] {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    metrics_->CountRequest(it->second->endpoint_label, 499);  // client closed the request
    Remove(id, /*cancel=*/true);
    AfterEvent();
  });
  r->timer_id = server_->PostAfter(options_.request_timeout, [this, id] {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    it->second->timer_id = 0;
    Fail(id, ServerError(504,
                         "the request did not finish within " +
                             std::to_string(options_.request_timeout.count()) + " ms",
                         "timeout"));
    AfterEvent();
  });
  requests_.emplace(id, std::move(r));
  waiting_.push_back(id);
  ++waiting_count_;
  AfterEvent();
}

void Router::Pump() {
  BackendLoad load = backend_->Load();
  while (waiting_count_ > 0 && running_ < load.capacity) {
    uint64_t id = waiting_.front();
    waiting_.pop_front();
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second->submitted) continue;  // removed while waiting
    InFlight& r = *it->second;
    --waiting_count_;
    metrics_->queue_time.Observe(Seconds(Clock::now() - r.admitted));
    r.submitted = true;
    ++running_;
    Status s = backend_->Submit(r.request);
    if (!s.ok()) {
      PW_LOG(WARNING) << "router: submit of request " << id << " failed: " << s.ToString();
      Fail(id, ServerError(503, "no worker could take the request: " + s.message(), "no_workers"));
    }
  }
  // Requests left waiting: look again shortly (capacity grows when a worker registers or a
  // request ends; both also pump directly).
  if (waiting_count_ > 0 && !tick_scheduled_ && server_ != nullptr) {
    tick_scheduled_ = true;
    server_->PostAfter(std::chrono::milliseconds(20), [this] {
      tick_scheduled_ = false;
      Pump();
    });
  }
  while (!waiting_.empty() && requests_.find(waiting_.front()) == requests_.end()) {
    waiting_.pop_front();
  }
  UpdateGauges();
}

void Router::OnTokens(uint64_t id, uint32_t start_index, std::vector<int32_t> tokens) {
  server_->Post([this, id, start_index, tokens = std::move(tokens)]() mutable {
    DeliverTokens(id, start_index, std::move(tokens));
    AfterEvent();
  });
}

void Router::OnFinished(uint64_t id, FinishReason reason, Status error) {
  server_->Post([this, id, reason, error = std::move(error)]() mutable {
    DeliverFinished(id, reason, std::move(error));
    AfterEvent();
  });
}

void Router::AfterEvent() {
  Pump();
  CheckDrained();
}

void Router::DeliverTokens(uint64_t id, uint32_t start_index, std::vector<int32_t> tokens) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;  // finished, cancelled or timed out meanwhile
  InFlight& r = *it->second;
  const auto& eos = r.request.sampling.stop_token_ids;
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint64_t index = uint64_t(start_index) + i;
    if (index < r.tokens_received) continue;  // already delivered (failover replay)
    if (index > r.tokens_received) {
      Fail(id, ServerError(500,
                           "token stream gap: expected token " + std::to_string(r.tokens_received) +
                               ", got " + std::to_string(index),
                           "internal_error"));
      return;
    }
    const int32_t tok = tokens[i];
    ++r.tokens_received;
    metrics_->generation_tokens.Increment();
    auto now = Clock::now();
    if (r.tokens_received == 1) {
      metrics_->ttft.Observe(Seconds(now - r.admitted));
    } else {
      metrics_->itl.Observe(Seconds(now - r.last_token));
    }
    r.last_token = now;
    if (std::find(eos.begin(), eos.end(), tok) != eos.end()) {
      Complete(id, "stop");  // the end-of-sequence token itself is not text
      return;
    }
    Emit(r, r.stop.Push(r.decoder->Push(tok)));
    if (r.stop.stopped()) {
      Complete(id, "stop");
      return;
    }
    if (static_cast<int32_t>(r.tokens_received) >= r.request.sampling.max_tokens) {
      Complete(id, "length");
      return;
    }
  }
}

void Router::DeliverFinished(uint64_t id, FinishReason reason, Status error) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  switch (reason) {
    case FinishReason::kStop:
      Complete(id, "stop");
      break;
    case FinishReason::kLength:
      Complete(id, "length");
      break;
    case FinishReason::kCancelled:
      Fail(id, ServerError(503, "the request was cancelled by a worker: " + error.message(),
                           "cancelled"));
      break;
    case FinishReason::kError:
      Fail(id,
           ServerError(error.code() == StatusCode::kUnavailable ? 503 : 500,
                       "generation failed: " + error.message(),
                       error.code() == StatusCode::kUnavailable ? "no_workers" : "internal_error"));
      break;
  }
}

void Router::Emit(InFlight& r, std::string_view text) {
  if (text.empty()) return;
  if (r.stream) {  // streams began at admission; others collect the text
    r.exchange->StreamWrite(StreamTextChunk(r.ctx, text, ""));
  } else {
    r.text.append(text);
  }
}

void Router::Complete(uint64_t id, std::string_view finish_reason) {
  std::unique_ptr<InFlight> r = Remove(id, /*cancel=*/true);
  if (!r) return;
  if (!r->stop.stopped()) {
    std::string tail = r->stop.Push(r->decoder->Flush());
    tail += r->stop.Flush();
    Emit(*r, tail);
  }
  Usage usage{static_cast<int64_t>(r->request.prompt.size()), r->tokens_received};
  metrics_->e2e.Observe(Seconds(Clock::now() - r->admitted));
  metrics_->CountSuccess(std::string(finish_reason), usage.prompt_tokens, usage.completion_tokens);
  if (r->stream) {
    metrics_->CountRequest(r->endpoint_label, 200);
    r->exchange->StreamWrite(StreamTextChunk(r->ctx, "", finish_reason));
    if (r->ctx.include_usage) r->exchange->StreamWrite(StreamUsageChunk(r->ctx, usage));
    r->exchange->StreamWrite(std::string(kSseDone));
    r->exchange->EndStream();
  } else {
    Reply(*r->exchange, r->endpoint_label, 200,
          FullResponseJson(r->ctx, r->text, finish_reason, usage));
  }
}

void Router::Fail(uint64_t id, const ApiError& e) {
  std::unique_ptr<InFlight> r = Remove(id, /*cancel=*/true);
  if (!r) return;
  if (r->stream) {
    metrics_->CountRequest(r->endpoint_label, e.http_status);
    r->exchange->StreamWrite(StreamErrorChunk(e));
    r->exchange->StreamWrite(std::string(kSseDone));
    r->exchange->EndStream();
  } else {
    ReplyError(*r->exchange, r->endpoint_label, e);
  }
}

std::unique_ptr<Router::InFlight> Router::Remove(uint64_t id, bool cancel) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return nullptr;
  std::unique_ptr<InFlight> r = std::move(it->second);
  requests_.erase(it);
  if (r->submitted) {
    --running_;
    if (cancel) backend_->Cancel(id);
  } else {
    --waiting_count_;
  }
  if (r->timer_id != 0 && server_ != nullptr) server_->CancelTimer(r->timer_id);
  r->exchange->SetOnDisconnect(nullptr);
  UpdateGauges();
  return r;
}

void Router::BeginDrain(std::function<void()> on_drained) {
  draining_ = true;
  on_drained_ = std::move(on_drained);
  PW_LOG(INFO) << "router: draining, " << requests_.size() << " requests in flight";
  CheckDrained();
}

void Router::CheckDrained() {
  if (draining_ && requests_.empty() && on_drained_) {
    auto cb = std::move(on_drained_);
    on_drained_ = nullptr;
    cb();
  }
}

void Router::UpdateGauges() {
  metrics_->running.Set(running_);
  metrics_->waiting.Set(static_cast<double>(waiting_count_));
  BackendLoad load = backend_->Load();
  metrics_->free_kv_blocks.Set(static_cast<double>(load.free_kv_blocks));
  metrics_->used_kv_blocks.Set(static_cast<double>(load.used_kv_blocks));
  metrics_->decode_workers.Set(load.decode_workers);
  if (load.requests_replaced > replaced_seen_) {
    metrics_->requests_replaced.Increment(
        static_cast<double>(load.requests_replaced - replaced_seen_));
    replaced_seen_ = load.requests_replaced;
  }
}

}  // namespace pw::router
