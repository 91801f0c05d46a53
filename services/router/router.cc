#include "services/router/router.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "common/logging.h"
#include "services/router/api_keys.h"

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
    : options_(std::move(options)),
      codec_(codec),
      backend_(backend),
      metrics_(std::move(metrics)),
      kv_(options_.max_queued_kv) {
  limits_.model_name = options_.model_name;
  limits_.max_tokens_cap = options_.context_length;
  limits_.vocab_size = codec_->vocab_size();
  limits_.default_temperature = options_.generation_defaults.temperature;
  limits_.default_top_p = options_.generation_defaults.top_p;
  limits_.default_top_k = options_.generation_defaults.top_k;
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

bool Router::Authorized(const HttpRequest& request, HttpExchange& exchange,
                        const std::string& label) {
  std::string_view auth = request.Header("Authorization");
  std::string_view token;
  bool bearer = false;
  if (auth.size() > 7) {
    std::string scheme(auth.substr(0, 7));
    std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (scheme == "bearer ") {
      bearer = true;
      token = auth.substr(7);
      while (!token.empty() && (token.front() == ' ' || token.front() == '\t')) {
        token.remove_prefix(1);
      }
      while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) {
        token.remove_suffix(1);
      }
    }
  }
  bool ok = false;
  if (bearer) {
    for (const std::string& key : options_.api_keys) ok |= ConstantTimeEquals(token, key);
  }
  if (ok) return true;
  metrics_->rejected.Add({{"reason", "unauthorized"}}).Increment();
  ApiError e;
  e.http_status = 401;
  // Neither message repeats what was presented.
  e.message =
      bearer ? "Incorrect API key provided" : "Missing API key: send 'Authorization: Bearer <key>'";
  e.code = "invalid_api_key";
  ReplyError(exchange, label, e, {{"WWW-Authenticate", "Bearer"}});
  return false;
}

void Router::Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
  std::string_view path = request.Path();
  const bool is_get = request.method == "GET";
  if (!options_.api_keys.empty()) {
    const bool open = ((path == "/health" || path == "/live") && !options_.protect_health) ||
                      (path == "/metrics" && !options_.protect_metrics);
    std::string label = path == "/v1/completions"        ? "completions"
                        : path == "/v1/chat/completions" ? "chat_completions"
                        : path == "/v1/models"           ? "models"
                        : path == "/health"              ? "health"
                        : path == "/live"                ? "live"
                        : path == "/metrics"             ? "metrics"
                        : path == "/tokenize" || path == "/detokenize" || path == "/tokenizer_info"
                            ? "tokenizer"
                            : "other";
    if (!open && !Authorized(request, *exchange, label)) return;
  }
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
  if (path == "/tokenize" || path == "/detokenize" || path == "/tokenizer_info") {
    const char* allowed = path == "/tokenizer_info" ? "GET" : "POST";
    if (request.method != allowed) return method_not_allowed("tokenizer", allowed);
    HandleTokenizer(request, *exchange, path);
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
  if (path == "/live") {
    // The livenessProbe: the backend's loop comes round (/health says whether workers serve).
    if (!is_get) return method_not_allowed("live", "GET");
    const std::string why = backend_->NotLive();
    Reply(*exchange, "live", why.empty() ? 200 : 503,
          nlohmann::json{{"status", why.empty() ? "live" : "not_live"}, {"reason", why}}.dump());
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
    auto text = codec_->RenderChatPrompt(api.chat);
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
  // echo with max_tokens 0: one token is computed (the prefill samples it) and not shown.
  const bool discard_output = max_tokens == 0;
  if (discard_output) max_tokens = 1;

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
  // Admission by the decode KV every candidate will need by its end (kv_admission.h).
  const BackendLoad load = backend_->Load();
  kv_.SetPool(load.kv_capacity_blocks, load.kv_capacity_max_blocks);
  const int64_t kv_blocks = KvAdmission::BlocksFor(n_prompt, max_tokens, load.kv_block_tokens);
  switch (kv_.Arrive(api.best_of, kv_blocks)) {
    case KvAdmission::Verdict::kTooLarge: {
      metrics_->rejected.Add({{"reason", "kv_capacity_exceeded"}}).Increment();
      ApiError e;
      e.message = "this request needs " + std::to_string(kv_blocks) + " KV blocks per sequence (" +
                  std::to_string(n_prompt) + " prompt tokens + " + std::to_string(max_tokens) +
                  " max_tokens, " + std::to_string(load.kv_block_tokens) +
                  " tokens a block); a decode worker holds at most " +
                  std::to_string(kv_.largest()) + ": lower max_tokens or shorten the prompt";
      e.param = "max_tokens";
      e.code = "kv_capacity_exceeded";
      ReplyError(*exchange, label, e);
      return;
    }
    case KvAdmission::Verdict::kBusy: {
      metrics_->rejected.Add({{"reason", "kv_queue_full"}}).Increment();
      ApiError e = ServerError(
          429,
          "the server's KV memory is committed: " + std::to_string(kv_.queued()) +
              " KV blocks of requests already wait (at most " + std::to_string(kv_.queue_bound()) +
              ") and this one needs " + std::to_string(api.best_of * kv_blocks) + "; retry later",
          "kv_queue_full");
      e.type = "rate_limit_error";
      ReplyError(*exchange, label, e,
                 {{"Retry-After", std::to_string(options_.retry_after_seconds)}});
      return;
    }
    case KvAdmission::Verdict::kQueue:
      break;
  }

  auto call = std::make_shared<Call>();
  call->endpoint_label = label;
  call->exchange = exchange;
  call->ctx.endpoint = ep;
  call->ctx.id = (ep == Endpoint::kCompletions ? "cmpl-" : "chatcmpl-") + RandomHex(24);
  call->ctx.created = static_cast<int64_t>(std::time(nullptr));
  call->ctx.model = options_.model_name;
  call->ctx.include_usage = api.stream && api.include_usage;
  call->ctx.continuous_usage = call->ctx.include_usage && api.continuous_usage_stats;
  call->stream = api.stream;
  call->n = api.n;
  call->best_of = api.best_of;
  call->logprobs = api.logprobs;
  call->echo = api.echo;
  call->discard_output = discard_output;
  call->admitted = Clock::now();
  if (api.echo) {
    auto text = codec_->Decode(prompt);
    call->echo_text = text.ok() ? std::move(*text) : std::string();
  }
  call->remaining = api.best_of;
  call->mean_logprob.assign(static_cast<size_t>(api.best_of), 0.0);
  // Candidates are scored by their tokens' log-probabilities when best_of > n.
  const bool scored = api.best_of > api.n;
  GenerationRequest base;
  base.prompt = std::move(prompt);
  base.sampling.temperature = static_cast<float>(api.temperature);
  base.sampling.top_p = static_cast<float>(api.top_p);
  base.sampling.top_k = api.top_k;
  base.sampling.max_tokens = static_cast<int32_t>(max_tokens);
  base.sampling.logprobs = api.logprobs >= 0 ? api.logprobs : (scored ? 0 : -1);
  base.sampling.prompt_logprobs = api.echo && api.logprobs >= 0 ? api.logprobs : -1;
  if (api.ignore_eos) {
    base.sampling.ignore_eos = true;
  } else {
    base.sampling.stop_token_ids = codec_->stop_token_ids(ep);
    for (int32_t id : options_.generation_defaults.eos_token_ids) {  // generation_config.json
      auto& ids = base.sampling.stop_token_ids;
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
  }
  metrics_->prompt_tokens.Increment(static_cast<double>(n_prompt));
  call->prompt = base.prompt;

  if (api.stream) {
    exchange->BeginStream(200, "text/event-stream",
                          {{"Cache-Control", "no-cache"}, {"X-Request-Id", call->ctx.id}});
  }
  std::weak_ptr<Call> weak = call;
  exchange->SetOnDisconnect([this, weak] {
    auto c = weak.lock();
    if (!c || c->remaining <= 0) return;
    metrics_->CountRequest(c->endpoint_label, 499);  // client closed the request
    c->remaining = 0;
    RemoveCall(c);
    if (c->timer_id != 0 && server_ != nullptr) server_->CancelTimer(c->timer_id);
    AfterEvent();
  });
  call->timer_id = server_->PostAfter(options_.request_timeout, [this, weak] {
    auto c = weak.lock();
    if (!c || c->remaining <= 0) return;
    c->timer_id = 0;
    FailCall(c, ServerError(504,
                            "the request did not finish within " +
                                std::to_string(options_.request_timeout.count()) + " ms",
                            "timeout"));
    AfterEvent();
  });
  for (int32_t i = 0; i < api.best_of; ++i) {
    auto r = std::make_unique<InFlight>();
    r->id = next_id_++;
    r->call = call;
    r->index = i;
    r->request = base;
    r->request.id = r->id;
    if (api.best_of > 1) r->request.share_group = call->ids.empty() ? r->id : call->ids.front();
    r->request.sampling.has_seed = api.seed.has_value();
    r->request.sampling.seed = api.seed.value_or(0) + static_cast<uint64_t>(i);
    r->decoder = codec_->NewDecoder();
    r->stop = StopMatcher(api.stop);
    r->kv_blocks = kv_blocks;
    kv_.Queue(kv_blocks);
    call->ids.push_back(r->id);
    if (api.stream) {
      const Usage none{static_cast<int64_t>(n_prompt), 0};
      exchange->StreamWrite(StreamRoleChunk(call->ctx, i, &none));
    }
    // Echo without log-probabilities: the prompt text is known now.
    if (api.echo && base.sampling.prompt_logprobs < 0) EmitPrompt(*r, nullptr);
    const uint64_t id = r->id;
    requests_.emplace(id, std::move(r));
    waiting_.push_back(id);
    ++waiting_count_;
  }
  AfterEvent();
}

// /tokenize with `messages`, as vLLM's: the chat template renders the conversation
// (add_generation_prompt defaults to true, continue_final_message to false; tools and
// chat_template_kwargs are passed on), then the prompt is tokenized without adding special
// tokens, which is HF's apply_chat_template(..., tokenize=True).
void Router::TokenizeMessages(const std::string& raw_body, HttpExchange& exchange) {
  using ojson = nlohmann::ordered_json;
  auto bad = [&](std::string message, std::string param) {
    ApiError e;
    e.message = std::move(message);
    e.param = std::move(param);
    ReplyError(exchange, "tokenizer", e);
  };
  // Parsed keeping key order: templates iterate over objects in the order sent.
  const ojson body = ojson::parse(raw_body, nullptr, /*allow_exceptions=*/false);
  if (body.contains("prompt")) return bad("give either 'prompt' or 'messages', not both", "prompt");
  if (auto it = body.find("add_special_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("'add_special_tokens' must be a boolean", "add_special_tokens");
    if (it->get<bool>()) {
      return bad("'add_special_tokens' with 'messages' is not supported: the chat template "
                 "writes the special tokens itself",
                 "add_special_tokens");
    }
  }
  // The same inputs, checked the same way, as a chat completion's: both render one prompt.
  ChatPrompt prompt;
  if (auto e = ParseChatPrompt(body, limits_, &prompt)) return ReplyError(exchange, "tokenizer", *e);
  auto text = codec_->RenderChatPrompt(prompt);
  if (!text.ok()) return bad("cannot apply the chat template: " + text.status().message(), "messages");
  auto ids = codec_->Encode(*text);
  if (!ids.ok()) return bad("cannot tokenize messages: " + ids.status().message(), "messages");
  nlohmann::json j = {
      {"count", ids->size()}, {"max_model_len", options_.context_length}, {"tokens", *ids}};
  Reply(exchange, "tokenizer", 200, j.dump());
}

void Router::HandleTokenizer(const HttpRequest& request, HttpExchange& exchange,
                             std::string_view path) {
  using nlohmann::json;
  auto bad = [&](std::string message, std::string param, std::string code = "") {
    ApiError e;
    e.message = std::move(message);
    e.param = std::move(param);
    e.code = std::move(code);
    ReplyError(exchange, "tokenizer", e);
  };
  if (path == "/tokenizer_info") {
    auto opt = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
    json j = {
        {"tokenizer_class", "PreTrainedTokenizerFast"}, {"bos_token", opt(codec_->bos_token())},
        {"eos_token", opt(codec_->eos_token())},        {"pad_token", nullptr},
        {"model_max_length", options_.context_length},  {"vocab_size", codec_->vocab_size()}};
    Reply(exchange, "tokenizer", 200, j.dump());
    return;
  }
  if (!IsValidUtf8(request.body)) return bad("request body is not valid UTF-8", "", "invalid_utf8");
  json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return bad("request body must be a JSON object", "", "invalid_json");
  }
  if (path == "/tokenize") {
    auto messages = body.find("messages");
    if (messages != body.end()) {  // as vLLM: the chat template's prompt, then its ids
      return TokenizeMessages(request.body, exchange);
    }
    auto it = body.find("prompt");
    if (it == body.end() || !it->is_string()) {
      return bad("'prompt' must be a string (or give 'messages')", "prompt");
    }
    auto ids = codec_->Encode(it->get<std::string>());
    if (!ids.ok()) return bad("cannot tokenize prompt: " + ids.status().message(), "prompt");
    json j = {{"count", ids->size()}, {"max_model_len", options_.context_length}, {"tokens", *ids}};
    Reply(exchange, "tokenizer", 200, j.dump());
    return;
  }
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) {
    return bad("'tokens' must be an array of token ids", "tokens");
  }
  std::vector<int32_t> ids;
  for (const json& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= codec_->vocab_size()) {
      return bad("'tokens' holds " + t.dump() + ", not a token id (vocabulary size " +
                     std::to_string(codec_->vocab_size()) + ")",
                 "tokens");
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  auto text = codec_->Decode(ids);
  if (!text.ok()) return bad("cannot detokenize: " + text.status().message(), "tokens");
  Reply(exchange, "tokenizer", 200,
        json{{"prompt", *text}}.dump(-1, ' ', false, json::error_handler_t::replace));
}

void Router::Pump() {
  BackendLoad load = backend_->Load();
  kv_.SetPool(load.kv_capacity_blocks, load.kv_capacity_max_blocks);
  // A decode worker's first heartbeat (its KV capacity) is due within an interval: wait for it.
  while (waiting_count_ > 0 && running_ < load.capacity && !load.kv_capacity_pending) {
    uint64_t id = waiting_.front();
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second->submitted) {  // removed while waiting
      waiting_.pop_front();
      continue;
    }
    InFlight& r = *it->second;
    if (r.kv_blocks == 0 && load.kv_block_tokens > 0) {  // came while no decode worker was known
      r.kv_blocks = KvAdmission::BlocksFor(static_cast<int64_t>(r.request.prompt.size()),
                                           r.request.sampling.max_tokens, load.kv_block_tokens);
      kv_.Queue(r.kv_blocks);
    }
    // In order: the oldest waits until its KV fits beside what runs, and so do the others.
    if (!kv_.CanStart(r.kv_blocks)) break;
    waiting_.pop_front();
    --waiting_count_;
    kv_.Unqueue(r.kv_blocks);
    kv_.Start(r.kv_blocks);
    metrics_->queue_time.Observe(Seconds(Clock::now() - r.call->admitted));
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

void Router::OnTokens(uint64_t id, uint32_t start_index, std::vector<int32_t> tokens,
                      std::vector<TokenLogprob> logprobs) {
  server_->Post([this, id, start_index, tokens = std::move(tokens),
                 logprobs = std::move(logprobs)]() mutable {
    DeliverTokens(id, start_index, std::move(tokens), std::move(logprobs));
    AfterEvent();
  });
}

void Router::OnPromptLogprobs(uint64_t id, std::vector<TokenLogprob> logprobs) {
  server_->Post([this, id, logprobs = std::move(logprobs)]() mutable {
    DeliverPromptLogprobs(id, std::move(logprobs));
    AfterEvent();
  });
}

void Router::OnFinished(uint64_t id, FinishReason reason, Status error, std::string param) {
  server_->Post([this, id, reason, error = std::move(error), param = std::move(param)]() mutable {
    DeliverFinished(id, reason, std::move(error), std::move(param));
    AfterEvent();
  });
}

void Router::AfterEvent() {
  Pump();
  CheckDrained();
}

LogprobEntry Router::Entry(const TokenLogprob& lp, std::string_view text_bytes,
                           TextOffsetCounter* offs) {
  LogprobEntry e;
  e.bytes = codec_->TokenBytes(lp.token);
  e.logprob = lp.logprob;
  e.top.reserve(lp.top.size());
  for (const auto& [tok, v] : lp.top) e.top.push_back({codec_->TokenBytes(tok), v});
  e.text_offset = offs->Next(text_bytes);
  return e;
}

void Router::EmitPrompt(InFlight& r, const std::vector<TokenLogprob>* prompt_lps) {
  Call& c = *r.call;
  r.prompt_sent = true;
  std::vector<LogprobEntry> entries;
  if (prompt_lps != nullptr) {
    const auto& prompt = r.request.prompt;
    for (size_t i = 0; i < prompt.size(); ++i) {
      const std::string bytes = codec_->TokenBytes(prompt[i]);  // echo text keeps specials
      if (i == 0) {
        LogprobEntry e;
        e.bytes = bytes;
        e.text_offset = r.offsets.Next(bytes);
        entries.push_back(std::move(e));
      } else {
        entries.push_back(Entry((*prompt_lps)[i - 1], bytes, &r.offsets));
      }
    }
  }
  if (c.stream) {
    const Usage running = RunningUsage(r);
    c.exchange->StreamWrite(StreamChoiceChunk(c.ctx, r.index, c.echo_text, "",
                                              prompt_lps ? &entries : nullptr, c.logprobs,
                                              &running));
  } else {
    r.text += c.echo_text;
    for (auto& e : entries) r.logprobs.push_back(std::move(e));
  }
}

void Router::DeliverPromptLogprobs(uint64_t id, std::vector<TokenLogprob> logprobs) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  InFlight& r = *it->second;
  if (r.prompt_sent || !r.call->echo) return;  // a replay after a failover
  if (logprobs.size() + 1 != r.request.prompt.size()) {
    Fail(id, ServerError(500,
                         "the backend sent " + std::to_string(logprobs.size()) +
                             " prompt log-probabilities for a prompt of " +
                             std::to_string(r.request.prompt.size()) + " tokens",
                         "internal_error"));
    return;
  }
  EmitPrompt(r, &logprobs);
}

void Router::DeliverTokens(uint64_t id, uint32_t start_index, std::vector<int32_t> tokens,
                           std::vector<TokenLogprob> logprobs) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;  // finished, cancelled or timed out meanwhile
  InFlight& r = *it->second;
  Call& call = *r.call;
  if (call.echo && !r.prompt_sent) {
    Fail(id, ServerError(500, "the backend sent tokens before the prompt's log-probabilities",
                         "internal_error"));
    return;
  }
  const bool with_lps = r.request.sampling.logprobs >= 0;
  if (with_lps && logprobs.size() != tokens.size()) {
    Fail(id, ServerError(500, "the backend sent tokens without their log-probabilities",
                         "internal_error"));
    return;
  }
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
      metrics_->ttft.Observe(Seconds(now - call.admitted));
    } else {
      metrics_->itl.Observe(Seconds(now - r.last_token));
    }
    r.last_token = now;
    if (call.discard_output) {  // echo with max_tokens 0
      Complete(id, "length");
      return;
    }
    if (with_lps) {
      r.sum_logprob += logprobs[i].logprob;
      ++r.scored_tokens;
    }
    if (std::find(eos.begin(), eos.end(), tok) != eos.end()) {
      Complete(id, "stop");  // the end-of-sequence token itself is not text
      return;
    }
    if (call.logprobs >= 0) {
      TokenLogprob lp = logprobs[i];
      lp.token = tok;
      const std::string bytes = codec_->IsSpecial(tok) ? std::string() : codec_->TokenBytes(tok);
      r.logprobs.push_back(Entry(lp, bytes, &r.offsets));
    }
    Emit(r, r.stop.Push(r.decoder->Push(tok)), /*token=*/true);
    PW_LOG(DEBUG) << "router: trace: request " << id << " token " << r.tokens_received - 1
                  << " emitted";
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

void Router::DeliverFinished(uint64_t id, FinishReason reason, Status error, std::string param) {
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
      if (error.code() == StatusCode::kInvalidArgument) {
        // A worker refused the request's own values: the client's error, as if this router had
        // refused them (docs/router.md, Failures).
        ApiError e;
        e.message = error.message();
        e.param = std::move(param);
        Fail(id, e);
        break;
      }
      Fail(id,
           ServerError(error.code() == StatusCode::kUnavailable ? 503 : 500,
                       "generation failed: " + error.message(),
                       error.code() == StatusCode::kUnavailable ? "no_workers" : "internal_error"));
      break;
  }
}

Usage Router::RunningUsage(const InFlight& r) const {
  return Usage{static_cast<int64_t>(r.request.prompt.size()),
               r.call->discard_output ? 0 : static_cast<int64_t>(r.tokens_received)};
}

void Router::Emit(InFlight& r, std::string_view text, bool token) {
  Call& c = *r.call;
  if (text.empty()) {
    // A token without text of its own (held back as part of a character or a possible stop
    // string, or none at all) still gets its chunk in a stream, as vLLM sends one: the client
    // sees every token arrive. Its log-probabilities wait for its text.
    if (token && c.stream) {
      const Usage running = RunningUsage(r);
      c.exchange->StreamWrite(
          StreamChoiceChunk(c.ctx, r.index, "", "", nullptr, c.logprobs, &running));
    }
    return;
  }
  if (c.stream) {  // streams began at admission; others collect the text
    const bool lps = c.logprobs >= 0;
    const Usage running = RunningUsage(r);
    c.exchange->StreamWrite(StreamChoiceChunk(c.ctx, r.index, text, "",
                                              lps ? &r.logprobs : nullptr, c.logprobs, &running));
    r.logprobs.clear();
  } else {
    r.text.append(text);
  }
}

void Router::Complete(uint64_t id, std::string_view finish_reason) {
  std::unique_ptr<InFlight> r = Remove(id, /*cancel=*/true);
  if (!r) return;
  std::shared_ptr<Call> call = r->call;
  if (!r->stop.stopped()) {
    std::string tail = r->stop.Push(r->decoder->Flush());
    tail += r->stop.Flush();
    Emit(*r, tail);
  }
  if (!call->discard_output) call->completion_tokens += r->tokens_received;
  call->mean_logprob[static_cast<size_t>(r->index)] =
      r->scored_tokens > 0 ? r->sum_logprob / static_cast<double>(r->scored_tokens)
                           : -std::numeric_limits<double>::infinity();
  call->ids[static_cast<size_t>(r->index)] = 0;
  if (call->stream) {
    const bool lps = call->logprobs >= 0 && !r->logprobs.empty();
    const Usage running = RunningUsage(*r);
    call->exchange->StreamWrite(StreamChoiceChunk(call->ctx, r->index, "", finish_reason,
                                                  lps ? &r->logprobs : nullptr, call->logprobs,
                                                  &running));
  } else {
    ChoiceResult c;
    c.index = r->index;
    c.text = std::move(r->text);
    c.finish_reason = std::string(finish_reason);
    c.with_logprobs = call->logprobs >= 0;
    c.top_n = std::max(call->logprobs, 0);
    c.logprobs = std::move(r->logprobs);
    call->results.push_back(std::move(c));
  }
  if (--call->remaining == 0) {
    metrics_->CountSuccess(std::string(finish_reason), static_cast<int64_t>(call->prompt.size()),
                           call->completion_tokens);
    FinishCall(call);
  }
}

void Router::FinishCall(const std::shared_ptr<Call>& call) {
  if (call->timer_id != 0 && server_ != nullptr) server_->CancelTimer(call->timer_id);
  call->timer_id = 0;
  call->exchange->SetOnDisconnect(nullptr);
  Usage usage{static_cast<int64_t>(call->prompt.size()), call->completion_tokens};
  metrics_->e2e.Observe(Seconds(Clock::now() - call->admitted));
  if (call->stream) {
    metrics_->CountRequest(call->endpoint_label, 200);
    if (call->ctx.include_usage) call->exchange->StreamWrite(StreamUsageChunk(call->ctx, usage));
    call->exchange->StreamWrite(std::string(kSseDone));
    call->exchange->EndStream();
    return;
  }
  auto& res = call->results;
  if (call->best_of > call->n) {
    // The n candidates with the highest mean token log-probability, best first.
    std::stable_sort(res.begin(), res.end(), [&](const ChoiceResult& a, const ChoiceResult& b) {
      const double la = call->mean_logprob[static_cast<size_t>(a.index)];
      const double lb = call->mean_logprob[static_cast<size_t>(b.index)];
      return la > lb || (la == lb && a.index < b.index);
    });
    res.resize(static_cast<size_t>(call->n));
    for (size_t i = 0; i < res.size(); ++i) res[i].index = static_cast<int32_t>(i);
  } else {
    std::sort(res.begin(), res.end(),
              [](const ChoiceResult& a, const ChoiceResult& b) { return a.index < b.index; });
  }
  Reply(*call->exchange, call->endpoint_label, 200, FullResponseJson(call->ctx, res, usage));
}

void Router::Fail(uint64_t id, const ApiError& e) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  std::shared_ptr<Call> call = it->second->call;  // outlives the candidates FailCall removes
  FailCall(call, e);
}

void Router::FailCall(const std::shared_ptr<Call>& call, const ApiError& e) {
  if (call->remaining <= 0) return;
  call->remaining = 0;
  RemoveCall(call);
  if (call->timer_id != 0 && server_ != nullptr) server_->CancelTimer(call->timer_id);
  call->timer_id = 0;
  call->exchange->SetOnDisconnect(nullptr);
  if (call->stream) {
    metrics_->CountRequest(call->endpoint_label, e.http_status);
    call->exchange->StreamWrite(StreamErrorChunk(e));
    call->exchange->StreamWrite(std::string(kSseDone));
    call->exchange->EndStream();
  } else {
    ReplyError(*call->exchange, call->endpoint_label, e);
  }
}

void Router::RemoveCall(const std::shared_ptr<Call>& call) {
  for (uint64_t& id : call->ids) {
    if (id != 0) Remove(id, /*cancel=*/true);
    id = 0;
  }
}

std::unique_ptr<Router::InFlight> Router::Remove(uint64_t id, bool cancel) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return nullptr;
  std::unique_ptr<InFlight> r = std::move(it->second);
  requests_.erase(it);
  if (r->submitted) {
    --running_;
    kv_.End(r->kv_blocks);
    if (cancel) backend_->Cancel(id);
  } else {
    --waiting_count_;
    kv_.Unqueue(r->kv_blocks);
  }
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
  metrics_->kv_admission.Add({{"state", "capacity"}}).Set(static_cast<double>(load.kv_capacity_blocks));
  metrics_->kv_admission.Add({{"state", "committed"}}).Set(static_cast<double>(kv_.committed()));
  metrics_->kv_admission.Add({{"state", "queued"}}).Set(static_cast<double>(kv_.queued()));
  if (load.requests_replaced > replaced_seen_) {
    metrics_->requests_replaced.Increment(
        static_cast<double>(load.requests_replaced - replaced_seen_));
    replaced_seen_ = load.requests_replaced;
  }
}

}  // namespace pw::router
