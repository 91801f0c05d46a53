// The OpenAI-compatible request/response formats the router speaks: request parsing and
// validation (no I/O, no model), response bodies, SSE chunks and error objects.
//
// Formats follow the OpenAI API reference:
//   POST /v1/completions       -> object "text_completion" (stream chunks: the same object)
//   POST /v1/chat/completions  -> object "chat.completion" (stream: "chat.completion.chunk")
//   errors                     -> {"error":{"message","type","param","code"}}
//   SSE                        -> "data: {json}\n\n" per chunk, "data: [DONE]\n\n" last.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace pw::router {

enum class Endpoint { kCompletions, kChatCompletions };

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant"
  std::string content;  // text (array-of-parts content is joined)
};

// A request that passed validation. Prompt length against the context is checked later, after
// tokenization (the router knows the tokenizer and the context length).
struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // Completions: exactly one of prompt_text / prompt_tokens is set (prompt_is_tokens tells).
  std::string prompt_text;
  std::vector<int32_t> prompt_tokens;
  bool prompt_is_tokens = false;
  std::vector<ChatMessage> messages;  // chat only, non-empty
  std::optional<int64_t> max_tokens;  // absent: until end of sequence or end of context
  double temperature = 1.0;           // [0, 2]; 0 = greedy
  double top_p = 1.0;                 // (0, 1]
  int32_t top_k = 0;                  // 0 = off (extension, as vLLM accepts it)
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // up to ApiLimits::max_stop strings, each non-empty
  bool ignore_eos = false;        // extension (as vLLM): do not stop at end-of-sequence
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage (stream only)
};

// An error answered to the client: HTTP status plus the OpenAI error object's fields.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // offending field; empty -> null
  std::string code;   // machine-readable code; empty -> null
};

template <typename T>
using ApiResult = std::variant<T, ApiError>;

struct ApiLimits {
  std::string model_name;         // the one model served; any other -> 404 model_not_found
  int64_t max_tokens_cap = 4096;  // max_tokens above this -> 400 (the context length)
  int32_t vocab_size = 1 << 30;   // token-id prompts must be in [0, vocab_size)
  size_t max_stop = 4;            // OpenAI allows up to 4 stop sequences
  size_t max_stop_bytes = 256;
  size_t max_messages = 1024;
  int max_json_depth = 32;  // nesting deeper than this is refused before parsing
};

// Parses and validates a request body for `endpoint`. Every rejection names the field.
ApiResult<ApiRequest> ParseApiRequest(std::string_view body, Endpoint endpoint,
                                      const ApiLimits& limits);

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);

// {"error":{...}} for `e`.
std::string ErrorJson(const ApiError& e);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// Fields shared by every response object of one request.
struct ResponseContext {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  bool include_usage = false;  // stream: chunks carry "usage": null, then a usage chunk
};

// "data: <json>\n\n".
std::string SseData(const nlohmann::json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// A complete non-streaming response. finish_reason: "stop" | "length".
std::string FullResponseJson(const ResponseContext& ctx, std::string_view text,
                             std::string_view finish_reason, const Usage& usage);
// First chunk of a chat stream: delta {"role":"assistant","content":""}. Completions: none.
std::string StreamRoleChunk(const ResponseContext& ctx);
// A chunk carrying `text` (may be empty when finish_reason is set); finish_reason empty -> null.
std::string StreamTextChunk(const ResponseContext& ctx, std::string_view text,
                            std::string_view finish_reason);
// The usage chunk sent before [DONE] when include_usage: "choices": [] and "usage": {...}.
std::string StreamUsageChunk(const ResponseContext& ctx, const Usage& usage);
// An error inside a stream: "data: {"error":{...}}\n\n".
std::string StreamErrorChunk(const ApiError& e);

// GET /v1/models body.
std::string ModelsJson(std::string_view model, int64_t created, std::string_view owned_by);

}  // namespace pw::router
