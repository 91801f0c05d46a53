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
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/sampling_check.h"

namespace pw::router {

enum class Endpoint { kCompletions, kChatCompletions };

// A conversation for the chat template, as the client sent it (messages whole: content as a
// string or a list of text parts, tool_calls, tool_call_id, name, reasoning_content, ...; key
// order kept, as templates iterate over objects in the order sent). /v1/chat/completions and
// /tokenize with `messages` both take it from ParseChatPrompt, so both render the same prompt,
// the one HF's apply_chat_template renders for these inputs.
struct ChatPrompt {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // OpenAI / HF messages
  nlohmann::ordered_json tools;                                        // null: none
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();   // chat_template_kwargs
  bool add_generation_prompt = true;
  bool continue_final_message = false;
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
  ChatPrompt chat;                    // chat only (messages non-empty)
  std::optional<int64_t> max_tokens;  // absent: until end of sequence or end of context; 0 only
                                      // with echo (the prompt's log-likelihood, no generation)
  // temperature and top_p as the float32 the workers compute with (common/sampling_check.h).
  float temperature = 1.f;  // [0, 2]; 0 = greedy
  float top_p = 1.f;        // (0, 1]
  int32_t top_k = 0;                  // 0 = off (extension, as vLLM accepts it)
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // up to ApiLimits::max_stop strings, each non-empty
  bool ignore_eos = false;        // extension (as vLLM): do not stop at end-of-sequence
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage (stream only)
  // stream_options.continuous_usage_stats (vLLM's extension; stream only): with include_usage,
  // every chunk of a choice carries that choice's running usage.
  bool continuous_usage_stats = false;
  // Log-probabilities: -1 = off; N = each token's with N alternatives. Completions: `logprobs`
  // (integer); chat: `logprobs: true` with `top_logprobs` N (default 0).
  int32_t logprobs = -1;
  bool echo = false;    // completions: the prompt is prepended to the text (and its logprobs)
  int32_t n = 1;        // choices returned
  int32_t best_of = 1;  // completions: candidates generated (>= n); the n best are returned
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
  int max_json_depth = 32;    // nesting deeper than this is refused before parsing
  int32_t max_logprobs = kMaxSamplingLogprobs;  // logprobs / top_logprobs above this -> 400
  int32_t max_n = 16;         // n and best_of above this -> 400
  // What a request that leaves them out gets (the checkpoint's generation_config.json, or the
  // OpenAI defaults: router/generation_defaults.h).
  float default_temperature = 1.f;
  float default_top_p = 1.f;
  int32_t default_top_k = 0;
};

// Parses and validates a request body for `endpoint`. Every rejection names the field.
ApiResult<ApiRequest> ParseApiRequest(std::string_view body, Endpoint endpoint,
                                      const ApiLimits& limits);

// The chat template's inputs of a request body, as vLLM takes them: `messages` (each an object
// with a `role` of system, developer, user, assistant, tool, function or ipython, kept as sent; `content` a string, a list of text parts, or null/absent on an assistant
// turn; `tool_calls` with function name and arguments, a JSON string of arguments parsed into
// the object templates expect, as vLLM does; `tool_call_id`, `name`, `reasoning_content`
// strings), `tools` (function schemas), `tool_choice` (auto or none: nothing constrains the
// output to a call), `add_generation_prompt` (default true), `continue_final_message`,
// `chat_template_kwargs`; a request's own `chat_template` is refused. Non-text content parts
// (images, audio, files) are refused naming the part's type: the models served are text-only.
// Every rejection names the field.
std::optional<ApiError> ParseChatPrompt(const nlohmann::ordered_json& body,
                                        const ApiLimits& limits, ChatPrompt* out);

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
  // stream, with include_usage: chunks of a choice carry its running usage instead of null
  // (completion_tokens = that choice's tokens so far, each chunk of which is sent; vLLM's
  // continuous_usage_stats).
  bool continuous_usage = false;
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

// One token of a response's log-probabilities, in the terms a client sees.
struct LogprobAlternative {
  std::string bytes;  // the token's raw bytes
  float logprob = 0.f;
};
struct LogprobEntry {
  std::string bytes;                    // the token's raw bytes (may be part of a UTF-8 character)
  std::optional<float> logprob;         // none: the first prompt token (nothing predicts it)
  std::vector<LogprobAlternative> top;  // most likely first; empty with no logprob
  int64_t text_offset = 0;              // code points of the response text before the token (see
                                        // TextOffsetCounter)
};

// How a token's bytes are written as a string: the bytes themselves when they are valid UTF-8,
// else "bytes:" followed by \xNN for each byte (as OpenAI writes a token that splits a
// character).
std::string TokenString(std::string_view bytes);

// text_offset of successive tokens: the index, in Unicode code points of the response text,
// of the character holding the token's first byte (a token that begins inside a character
// split over tokens gets that character's index). Tokens that add no text (special tokens)
// get the current length and add nothing.
class TextOffsetCounter {
 public:
  // Offset of a token whose `text_bytes` (the bytes it adds to the text) come next.
  int64_t Next(std::string_view text_bytes);
  int64_t code_points() const { return code_points_; }

 private:
  int64_t code_points_ = 0;
};

// The legacy completions shape: {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
// top_logprobs maps token strings to log-probabilities (the N most likely and the chosen one).
nlohmann::json CompletionLogprobsJson(const std::vector<LogprobEntry>& entries);
// The chat shape: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}],
// "refusal": null}; top_logprobs holds exactly the N most likely.
nlohmann::json ChatLogprobsJson(const std::vector<LogprobEntry>& entries, int32_t top_n);

// One choice of a full response.
struct ChoiceResult {
  int32_t index = 0;
  std::string text;
  std::string finish_reason;   // "stop" | "length"
  bool with_logprobs = false;  // "logprobs" set (else null)
  int32_t top_n = 0;           // chat: alternatives per token
  std::vector<LogprobEntry> logprobs;
};
std::string FullResponseJson(const ResponseContext& ctx, const std::vector<ChoiceResult>& choices,
                             const Usage& usage);
// A stream chunk of choice `index` (text may be empty); `logprobs` null -> "logprobs": null.
// `running`: the choice's usage so far, sent when ctx.continuous_usage (null: "usage": null).
std::string StreamChoiceChunk(const ResponseContext& ctx, int32_t index, std::string_view text,
                              std::string_view finish_reason,
                              const std::vector<LogprobEntry>* logprobs, int32_t top_n = 0,
                              const Usage* running = nullptr);
// First chunk of choice `index` of a chat stream (role assistant). Completions: "".
std::string StreamRoleChunk(const ResponseContext& ctx, int32_t index,
                            const Usage* running = nullptr);

// GET /v1/models body.
std::string ModelsJson(std::string_view model, int64_t created, std::string_view owned_by);

}  // namespace pw::router
