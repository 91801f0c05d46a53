#include "services/router/openai_api.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace pw::router {

using nlohmann::json;

namespace {

ApiError Bad(std::string message, std::string param, std::string code = "") {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

std::string Dump(const json& j) {
  // Invalid UTF-8 (never expected: texts come from the incremental decoder or validated input)
  // is replaced rather than thrown on.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Deepest nesting of arrays/objects outside strings; stops early past `limit`.
int JsonDepth(std::string_view s, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

const char* TypeName(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "object";
    case json::value_t::array:
      return "array";
    case json::value_t::string:
      return "string";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    default:
      return "value";
  }
}

ApiError WrongType(const std::string& field, const char* expected, const json& got) {
  return Bad("'" + field + "' must be " + expected + ", got " + TypeName(got), field);
}

// Reads an optional number field in [lo, hi] into *out. Returns an error or nullopt.
std::optional<ApiError> GetNumber(const json& body, const char* field, double lo, double hi,
                                  bool lo_open, double* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return WrongType(field, "a number", *it);
  double v = it->get<double>();
  if (!std::isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo)) {
    return Bad("'" + std::string(field) + "' must be in " + (lo_open ? "(" : "[") +
                   std::to_string(lo).substr(0, 3) + ", " + std::to_string(hi).substr(0, 3) +
                   "], got " + it->dump(),
               field);
  }
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> ParseMessages(const json& body, const ApiLimits& limits,
                                      std::vector<ChatMessage>* out) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return Bad("'messages' is required", "messages");
  if (!it->is_array()) return WrongType("messages", "an array", *it);
  if (it->empty()) return Bad("'messages' must not be empty", "messages");
  if (it->size() > limits.max_messages) {
    return Bad("'messages' has more than " + std::to_string(limits.max_messages) + " entries",
               "messages");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return WrongType(where, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Bad("'" + where + ".role' must be a string", where + ".role");
    }
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant") {
      return Bad("'" + where + ".role' must be one of system, developer, user, assistant; got '" +
                     role->get<std::string>() + "'",
                 where + ".role");
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      if (msg.role != "assistant") {
        return Bad("'" + where + ".content' is required", where + ".content");
      }
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        std::string pw = where + ".content[" + std::to_string(k) + "]";
        auto type = part.is_object() ? part.find("type") : part.end();
        if (!part.is_object() || type == part.end() || !type->is_string() ||
            type->get<std::string>() != "text") {
          return Bad("'" + pw +
                         "' must be {\"type\": \"text\", \"text\": ...}; only text parts "
                         "are supported",
                     pw);
        }
        auto text = part.find("text");
        if (text == part.end() || !text->is_string()) {
          return Bad("'" + pw + ".text' must be a string", pw + ".text");
        }
        msg.content += text->get<std::string>();
      }
    } else {
      return WrongType(where + ".content", "a string or an array of text parts", *content);
    }
    out->push_back(std::move(msg));
  }
  bool any_text = false;
  for (const auto& m : *out) any_text |= !m.content.empty();
  if (!any_text) return Bad("every message in 'messages' is empty", "messages");
  return std::nullopt;
}

std::optional<ApiError> ParsePrompt(const json& body, const ApiLimits& limits, ApiRequest* r) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return Bad("'prompt' is required", "prompt");
  if (it->is_string()) {
    r->prompt_text = it->get<std::string>();
    if (r->prompt_text.empty()) return Bad("'prompt' must not be empty", "prompt");
    return std::nullopt;
  }
  if (!it->is_array()) return WrongType("prompt", "a string or an array", *it);
  if (it->empty()) return Bad("'prompt' must not be empty", "prompt");
  const json& first = (*it)[0];
  if (first.is_string()) {
    if (it->size() != 1) {
      return Bad(
          "'prompt' holds " + std::to_string(it->size()) + " prompts; send one prompt per request",
          "prompt");
    }
    r->prompt_text = first.get<std::string>();
    if (r->prompt_text.empty()) return Bad("'prompt' must not be empty", "prompt");
    return std::nullopt;
  }
  if (first.is_array()) {
    return Bad("'prompt' as a list of token lists is not supported; send one prompt per request",
               "prompt");
  }
  r->prompt_is_tokens = true;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    if (!t.is_number_integer()) {
      return WrongType("prompt[" + std::to_string(i) + "]", "an integer token id", t);
    }
    const bool in_range = t.is_number_unsigned()
                              ? t.get<uint64_t>() < static_cast<uint64_t>(limits.vocab_size)
                              : t.get<int64_t>() >= 0 && t.get<int64_t>() < limits.vocab_size;
    if (!in_range) {
      return Bad("'prompt[" + std::to_string(i) + "]' = " + t.dump() +
                     " is not a token id (vocabulary size " + std::to_string(limits.vocab_size) +
                     ")",
                 "prompt");
    }
    r->prompt_tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

// Options this server does not implement: accepted only at their default values.
std::optional<ApiError> RejectUnsupported(const json& body, Endpoint endpoint) {
  auto not_supported = [](const std::string& field) {
    return Bad("'" + field + "' is not supported by this server", field, "unsupported_parameter");
  };
  auto it = body.find("logprobs");
  if (it != body.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>())) {
    return not_supported("logprobs");
  }
  it = body.find("echo");
  if (it != body.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>())) {
    return not_supported("echo");
  }
  it = body.find("best_of");
  if (it != body.end() && !it->is_null() && !(it->is_number_integer() && it->get<int64_t>() == 1)) {
    return not_supported("best_of");
  }
  it = body.find("suffix");
  if (it != body.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
    return not_supported("suffix");
  }
  it = body.find("tools");
  if (it != body.end() && !it->is_null() && !(it->is_array() && it->empty())) {
    return not_supported("tools");
  }
  it = body.find("response_format");
  if (it != body.end() && !it->is_null()) {
    auto type = it->is_object() ? it->find("type") : it->end();
    if (!it->is_object() || type == it->end() || !type->is_string() ||
        type->get<std::string>() != "text") {
      return not_supported("response_format");
    }
  }
  (void)endpoint;
  return std::nullopt;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

ApiResult<ApiRequest> ParseApiRequest(std::string_view body_text, Endpoint endpoint,
                                      const ApiLimits& limits) {
  if (!IsValidUtf8(body_text)) {
    return Bad("request body is not valid UTF-8", "", "invalid_utf8");
  }
  if (JsonDepth(body_text, limits.max_json_depth) > limits.max_json_depth) {
    return Bad(
        "request body nests deeper than " + std::to_string(limits.max_json_depth) + " levels", "",
        "invalid_json");
  }
  json body = json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    // Re-parse with diagnostics only to get the position for the message.
    std::string detail;
    try {
      json discarded = json::parse(body_text);
      (void)discarded;
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number overflow
      detail = e.what();
    }
    return Bad("request body is not valid JSON" + (detail.empty() ? "" : ": " + detail), "",
               "invalid_json");
  }
  if (!body.is_object()) return Bad("request body must be a JSON object", "", "invalid_json");

  ApiRequest r;
  r.endpoint = endpoint;
  auto model = body.find("model");
  if (model == body.end() || model->is_null()) return Bad("'model' is required", "model");
  if (!model->is_string()) return WrongType("model", "a string", *model);
  r.model = model->get<std::string>();
  if (r.model != limits.model_name) {
    ApiError e = Bad("The model '" + r.model + "' does not exist; this server serves '" +
                         limits.model_name + "'",
                     "model", "model_not_found");
    e.http_status = 404;
    return e;
  }

  if (endpoint == Endpoint::kChatCompletions) {
    if (auto e = ParseMessages(body, limits, &r.messages)) return *e;
  } else {
    if (auto e = ParsePrompt(body, limits, &r)) return *e;
  }
  if (auto e = RejectUnsupported(body, endpoint)) return *e;

  // max_tokens (chat also accepts max_completion_tokens, which wins when both are given).
  for (const char* field : {"max_tokens", "max_completion_tokens"}) {
    if (endpoint == Endpoint::kCompletions && std::string_view(field) != "max_tokens") continue;
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_number_integer()) return WrongType(field, "an integer", *it);
    if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(limits.max_tokens_cap)) {
      return Bad("'" + std::string(field) + "' = " + it->dump() + " exceeds the limit of " +
                     std::to_string(limits.max_tokens_cap),
                 field);
    }
    int64_t v = it->get<int64_t>();
    if (v < 1)
      return Bad("'" + std::string(field) + "' must be at least 1, got " + it->dump(), field);
    if (v > limits.max_tokens_cap) {
      return Bad("'" + std::string(field) + "' = " + it->dump() + " exceeds the limit of " +
                     std::to_string(limits.max_tokens_cap),
                 field);
    }
    r.max_tokens = v;
  }

  if (auto e = GetNumber(body, "temperature", 0.0, 2.0, false, &r.temperature)) return *e;
  if (auto e = GetNumber(body, "top_p", 0.0, 1.0, true, &r.top_p)) return *e;
  if (auto it = body.find("top_k"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return WrongType("top_k", "an integer", *it);
    int64_t v = it->get<int64_t>();
    if (v < -1 || v > limits.vocab_size) return Bad("'top_k' out of range: " + it->dump(), "top_k");
    r.top_k = v <= 0 ? 0 : static_cast<int32_t>(v);
  }
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return WrongType("seed", "an integer", *it);
    r.seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
  }
  if (auto it = body.find("n"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return WrongType("n", "an integer", *it);
    if (it->get<int64_t>() != 1) return Bad("only 'n' = 1 is supported, got " + it->dump(), "n");
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (size_t i = 0; i < it->size(); ++i) {
        const json& s = (*it)[i];
        if (!s.is_string()) return WrongType("stop[" + std::to_string(i) + "]", "a string", s);
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings", *it);
    }
    if (r.stop.size() > limits.max_stop) {
      return Bad("'stop' holds more than " + std::to_string(limits.max_stop) + " sequences",
                 "stop");
    }
    for (const auto& s : r.stop) {
      if (s.empty()) return Bad("'stop' sequences must not be empty", "stop");
      if (s.size() > limits.max_stop_bytes) {
        return Bad(
            "'stop' sequences must be at most " + std::to_string(limits.max_stop_bytes) + " bytes",
            "stop");
      }
    }
  }
  if (auto it = body.find("ignore_eos"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return WrongType("ignore_eos", "a boolean", *it);
    r.ignore_eos = it->get<bool>();
  }
  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return WrongType("stream", "a boolean", *it);
    r.stream = it->get<bool>();
  }
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return WrongType("stream_options", "an object", *it);
    if (!r.stream) {
      return Bad("'stream_options' is only allowed when 'stream' is true", "stream_options");
    }
    if (auto iu = it->find("include_usage"); iu != it->end() && !iu->is_null()) {
      if (!iu->is_boolean()) {
        return WrongType("stream_options.include_usage", "a boolean", *iu);
      }
      r.include_usage = iu->get<bool>();
    }
  }
  return r;
}

std::string ErrorJson(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return Dump(json{{"error", err}});
}

std::string SseData(const json& j) { return "data: " + Dump(j) + "\n\n"; }

namespace {

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json Envelope(const ResponseContext& ctx, bool chunk) {
  const char* object;
  if (ctx.endpoint == Endpoint::kChatCompletions) {
    object = chunk ? "chat.completion.chunk" : "chat.completion";
  } else {
    object = "text_completion";
  }
  return {{"id", ctx.id},
          {"object", object},
          {"created", ctx.created},
          {"model", ctx.model},
          {"system_fingerprint", nullptr}};
}

json FinishJson(std::string_view finish_reason) {
  return finish_reason.empty() ? json(nullptr) : json(finish_reason);
}

}  // namespace

std::string FullResponseJson(const ResponseContext& ctx, std::string_view text,
                             std::string_view finish_reason, const Usage& usage) {
  json j = Envelope(ctx, false);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishJson(finish_reason)}};
  if (ctx.endpoint == Endpoint::kChatCompletions) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string StreamRoleChunk(const ResponseContext& ctx) {
  if (ctx.endpoint != Endpoint::kChatCompletions) return "";
  json j = Envelope(ctx, true);
  j["choices"] = json::array({{{"index", 0},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  if (ctx.include_usage) j["usage"] = nullptr;
  return SseData(j);
}

std::string StreamTextChunk(const ResponseContext& ctx, std::string_view text,
                            std::string_view finish_reason) {
  json j = Envelope(ctx, true);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishJson(finish_reason)}};
  if (ctx.endpoint == Endpoint::kChatCompletions) {
    choice["delta"] = text.empty() ? json::object() : json{{"content", text}};
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  if (ctx.include_usage) j["usage"] = nullptr;
  return SseData(j);
}

std::string StreamUsageChunk(const ResponseContext& ctx, const Usage& usage) {
  json j = Envelope(ctx, true);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return SseData(j);
}

std::string StreamErrorChunk(const ApiError& e) { return "data: " + ErrorJson(e) + "\n\n"; }

std::string ModelsJson(std::string_view model, int64_t created, std::string_view owned_by) {
  json m = {{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", owned_by}};
  return Dump(json{{"object", "list"}, {"data", json::array({m})}});
}

}  // namespace pw::router
