#include "services/router/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/sampling_check.h"

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

template <typename Json>
std::string Dump(const Json& j) {
  // Invalid UTF-8 (never expected: texts come from the incremental decoder or validated input)
  // is replaced rather than thrown on.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
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

// json or ordered_json (chat inputs keep their key order).
template <typename Json>
const char* TypeName(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "object";
    case Json::value_t::array:
      return "array";
    case Json::value_t::string:
      return "string";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    default:
      return "value";
  }
}

template <typename Json>
ApiError WrongType(const std::string& field, const char* expected, const Json& got) {
  return Bad("'" + field + "' must be " + expected + ", got " + TypeName(got), field);
}

// Reads an optional sampling number in the API's range [lo, hi] into *out as the float32 the
// workers compute with (ToSamplingFloat: a value that float cannot carry is refused here, not
// on a worker). Returns an error or nullopt.
std::optional<ApiError> GetSamplingFloat(const json& body, const char* field, double lo, double hi,
                                         bool lo_open, float* out) {
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
  if (auto e = ToSamplingFloat(field, v, out)) return Bad(e->message, e->param);
  return std::nullopt;
}

using ojson = nlohmann::ordered_json;

// An optional string field of a message (absent or null: left out, as HF drops null keys).
std::optional<ApiError> CheckOptionalString(const ojson& m, const std::string& where,
                                            const char* key) {
  auto it = m.find(key);
  if (it == m.end() || it->is_null() || it->is_string()) return std::nullopt;
  return WrongType(where + "." + key, "a string", *it);
}

// `content`: a string, or a list of text parts (given to the template as the list, as HF does).
std::optional<ApiError> CheckContent(const ojson& m, const std::string& where,
                                     const std::string& role) {
  auto content = m.find("content");
  if (content == m.end() || content->is_null()) {
    // An assistant turn may be tool calls alone.
    if (role == "assistant") return std::nullopt;
    return Bad("'" + where + ".content' is required", where + ".content");
  }
  if (content->is_string()) return std::nullopt;
  if (!content->is_array()) {
    return WrongType(where + ".content", "a string or an array of text parts", *content);
  }
  for (size_t k = 0; k < content->size(); ++k) {
    const ojson& part = (*content)[k];
    const std::string pw = where + ".content[" + std::to_string(k) + "]";
    if (!part.is_object()) return WrongType(pw, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) {
      return Bad("'" + pw + ".type' must be a string (\"text\")", pw + ".type");
    }
    if (type->get<std::string>() != "text") {
      return Bad("'" + pw + "' is a '" + type->get<std::string>() +
                     "' part; this model takes text only (parts of type \"text\")",
                 pw + ".type");
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return Bad("'" + pw + ".text' must be a string", pw + ".text");
    }
  }
  return std::nullopt;
}

// `tool_calls`: [{"id", "type": "function", "function": {"name", "arguments"}}]. Arguments sent
// as a JSON string (as OpenAI clients send them) become the object, as vLLM does: templates
// write them with `| tojson` or iterate over them, which a string would break.
std::optional<ApiError> ParseToolCalls(ojson& m, const std::string& where) {
  auto calls = m.find("tool_calls");
  if (calls == m.end() || calls->is_null()) return std::nullopt;
  const std::string w = where + ".tool_calls";
  if (!calls->is_array()) return WrongType(w, "an array", *calls);
  for (size_t j = 0; j < calls->size(); ++j) {
    ojson& call = (*calls)[j];
    const std::string cw = w + "[" + std::to_string(j) + "]";
    if (!call.is_object()) return WrongType(cw, "an object", call);
    if (auto e = CheckOptionalString(call, cw, "id")) return e;
    if (auto t = call.find("type"); t != call.end() && !t->is_null() && *t != "function") {
      return Bad("'" + cw + ".type' must be \"function\"", cw + ".type");
    }
    auto fn = call.find("function");
    if (fn == call.end() || !fn->is_object()) {
      return Bad("'" + cw + ".function' must be an object with 'name' and 'arguments'",
                 cw + ".function");
    }
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) {
      return Bad("'" + cw + ".function.name' must be a string", cw + ".function.name");
    }
    const std::string aw = cw + ".function.arguments";
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null() || (args->is_string() && args->get_ref<const std::string&>().empty())) {
      (*fn)["arguments"] = ojson::object();  // as vLLM: no arguments
    } else if (args->is_string()) {
      ojson parsed = ojson::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_object()) {
        return Bad("'" + aw + "' must be a JSON object (or a string holding one), got " +
                       Dump(*args),
                   aw);
      }
      *args = std::move(parsed);
    } else if (!args->is_object()) {
      return WrongType(aw, "an object or a string holding a JSON object", *args);
    }
  }
  return std::nullopt;
}

// `tools`: [{"type": "function", "function": {"name", "description", "parameters"}}].
std::optional<ApiError> CheckTools(const ojson& tools) {
  if (!tools.is_array()) return WrongType("tools", "an array", tools);
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string w = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return WrongType(w, "an object", t);
    auto type = t.find("type");
    if (type == t.end() || *type != "function") {
      return Bad("'" + w + ".type' must be \"function\"", w + ".type");
    }
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) {
      return Bad("'" + w + ".function' must be an object", w + ".function");
    }
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) {
      return Bad("'" + w + ".function.name' must be a string", w + ".function.name");
    }
    if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null() && !p->is_object()) {
      return WrongType(w + ".function.parameters", "an object (a JSON schema)", *p);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseChatPrompt(const ojson& body, const ApiLimits& limits,
                                        ChatPrompt* out) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return Bad("'messages' is required", "messages");
  if (!it->is_array()) return WrongType("messages", "an array", *it);
  if (it->empty()) return Bad("'messages' must not be empty", "messages");
  if (it->size() > limits.max_messages) {
    return Bad("'messages' has more than " + std::to_string(limits.max_messages) + " entries",
               "messages");
  }
  out->messages = *it;
  for (size_t i = 0; i < out->messages.size(); ++i) {
    ojson& m = out->messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return WrongType(where, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string() ||
        role->get_ref<const std::string&>().empty()) {
      return Bad("'" + where + ".role' must be a non-empty string", where + ".role");
    }
    // The roles of the OpenAI API and of the templates that take tool results (Llama 3.1's
    // ipython), given as sent, as HF and vLLM do ("developer" too: templates that know it,
    // such as gpt-oss's, treat it apart from "system"). Anything else is most likely a typo.
    static constexpr std::string_view kRoles[] = {"system", "developer", "user", "assistant",
                                                  "tool",   "function",  "ipython"};
    if (std::find(std::begin(kRoles), std::end(kRoles), role->get_ref<const std::string&>()) ==
        std::end(kRoles)) {
      return Bad("'" + where + ".role' must be one of system, developer, user, assistant, tool, "
                 "function, ipython; got '" + role->get<std::string>() + "'",
                 where + ".role");
    }
    if (auto e = CheckContent(m, where, role->get<std::string>())) return e;
    for (const char* key : {"tool_call_id", "name", "reasoning_content"}) {
      if (auto e = CheckOptionalString(m, where, key)) return e;
    }
    if (auto e = ParseToolCalls(m, where)) return e;
  }
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (auto e = CheckTools(*t)) return e;
    out->tools = *t;
  }
  if (auto t = body.find("tool_choice"); t != body.end() && !t->is_null()) {
    // Only choices that leave the output free: nothing here constrains it to a call.
    if (!(t->is_string() && (*t == "auto" || *t == "none"))) {
      return Bad("'tool_choice' must be \"auto\" or \"none\": this server does not constrain "
                 "the output to a tool call, got " + Dump(*t),
                 "tool_choice", "unsupported_parameter");
    }
  }
  for (const char* flag : {"add_generation_prompt", "continue_final_message"}) {
    auto f = body.find(flag);
    if (f != body.end() && !f->is_null() && !f->is_boolean()) {
      return WrongType(flag, "a boolean", *f);
    }
  }
  auto flag = [&](const char* key, bool dflt) {
    auto f = body.find(key);
    return f == body.end() || f->is_null() ? dflt : f->get<bool>();
  };
  out->add_generation_prompt = flag("add_generation_prompt", true);
  out->continue_final_message = flag("continue_final_message", false);
  if (out->add_generation_prompt && out->continue_final_message) {
    // HF raises the same: the prompt cannot both open a new turn and continue the last one.
    return Bad("'continue_final_message' continues the last message, so it needs "
               "'add_generation_prompt': false",
               "continue_final_message");
  }
  if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
    if (!k->is_object()) return WrongType("chat_template_kwargs", "an object", *k);
    out->kwargs = *k;
  }
  if (auto c = body.find("chat_template"); c != body.end() && !c->is_null()) {
    return Bad("'chat_template' is not accepted: the model's own template is used",
               "chat_template", "unsupported_parameter");
  }
  return std::nullopt;
}

namespace {

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
  const json* ids = &*it;
  std::string where = "prompt";
  if (first.is_array()) {
    // A batch of token lists (as evaluation harnesses send): one list only.
    if (it->size() != 1) {
      return Bad("'prompt' holds " + std::to_string(it->size()) +
                     " token lists; send one prompt per request",
                 "prompt");
    }
    ids = &first;
    where = "prompt[0]";
    if (ids->empty()) return Bad("'prompt' must not be empty", "prompt");
  }
  r->prompt_is_tokens = true;
  for (size_t i = 0; i < ids->size(); ++i) {
    const json& t = (*ids)[i];
    if (!t.is_number_integer()) {
      return WrongType(where + "[" + std::to_string(i) + "]", "an integer token id", t);
    }
    const bool in_range = t.is_number_unsigned()
                              ? t.get<uint64_t>() < static_cast<uint64_t>(limits.vocab_size)
                              : t.get<int64_t>() >= 0 && t.get<int64_t>() < limits.vocab_size;
    if (!in_range) {
      return Bad("'" + where + "[" + std::to_string(i) + "]' = " + t.dump() +
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
  auto it = body.end();
  if (endpoint == Endpoint::kChatCompletions) {
    // Completions-only options.
    it = body.find("echo");
    if (it != body.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>())) {
      return not_supported("echo");
    }
    it = body.find("best_of");
    if (it != body.end() && !it->is_null() &&
        !(it->is_number_integer() && it->get<int64_t>() == 1)) {
      return not_supported("best_of");
    }
  }
  it = body.find("suffix");
  if (it != body.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
    return not_supported("suffix");
  }
  it = body.find("tools");
  if (endpoint == Endpoint::kCompletions && it != body.end() && !it->is_null() &&
      !(it->is_array() && it->empty())) {
    return not_supported("tools");  // chat gives them to the template (ParseChatPrompt)
  }
  // Sampling options the workers' sampler does not implement: accepted only at the value that
  // changes nothing, so that a request is never served as if it had not asked.
  for (const auto& [field, neutral] : {std::pair<const char*, double>{"presence_penalty", 0.0},
                                       {"frequency_penalty", 0.0},
                                       {"repetition_penalty", 1.0},
                                       {"min_p", 0.0}}) {
    it = body.find(field);
    if (it != body.end() && !it->is_null() &&
        !(it->is_number() && it->get<double>() == neutral)) {
      return not_supported(field);
    }
  }
  it = body.find("logit_bias");
  if (it != body.end() && !it->is_null() && !(it->is_object() && it->empty())) {
    return not_supported("logit_bias");
  }
  it = body.find("response_format");
  if (it != body.end() && !it->is_null()) {
    auto type = it->is_object() ? it->find("type") : it->end();
    if (!it->is_object() || type == it->end() || !type->is_string() ||
        type->get<std::string>() != "text") {
      return not_supported("response_format");
    }
  }
  return std::nullopt;
}

// Reads an optional integer field in [lo, hi]; absent or null leaves *out.
std::optional<ApiError> GetInt(const json& body, const char* field, int64_t lo, int64_t hi,
                               int32_t* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return WrongType(field, "an integer", *it);
  // Non-negative integers parse as unsigned: compare those as unsigned.
  const bool out_of_range =
      it->is_number_unsigned()
          ? it->get<uint64_t>() > uint64_t(hi) || (lo > 0 && it->get<uint64_t>() < uint64_t(lo))
          : it->get<int64_t>() > hi || it->get<int64_t>() < lo;
  if (out_of_range) {
    return Bad("'" + std::string(field) + "' must be in [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "], got " + it->dump(),
               field);
  }
  *out = static_cast<int32_t>(it->get<int64_t>());
  return std::nullopt;
}

// logprobs / top_logprobs / echo / n / best_of.
std::optional<ApiError> ParseChoiceOptions(const json& body, Endpoint endpoint,
                                           const ApiLimits& limits, ApiRequest* r) {
  if (endpoint == Endpoint::kCompletions) {
    auto it = body.find("logprobs");
    if (it != body.end() && it->is_boolean() && !it->get<bool>()) {
      // false: off (some clients send it)
    } else if (auto e = GetInt(body, "logprobs", 0, limits.max_logprobs, &r->logprobs)) {
      return e;
    }
    if (auto ie = body.find("echo"); ie != body.end() && !ie->is_null()) {
      if (!ie->is_boolean()) return WrongType("echo", "a boolean", *ie);
      r->echo = ie->get<bool>();
    }
  } else {
    bool want = false;
    if (auto it = body.find("logprobs"); it != body.end() && !it->is_null()) {
      if (!it->is_boolean()) return WrongType("logprobs", "a boolean", *it);
      want = it->get<bool>();
    }
    int32_t top = -1;
    if (auto e = GetInt(body, "top_logprobs", 0, limits.max_logprobs, &top)) return e;
    if (top >= 0 && !want) {
      return Bad("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
    }
    if (want) r->logprobs = std::max(top, 0);
  }
  if (auto e = GetInt(body, "n", 1, limits.max_n, &r->n)) return e;
  r->best_of = r->n;
  if (endpoint == Endpoint::kCompletions) {
    if (auto e = GetInt(body, "best_of", 1, limits.max_n, &r->best_of)) return e;
    if (r->best_of < r->n) {
      return Bad("'best_of' (" + std::to_string(r->best_of) + ") must be at least 'n' (" +
                     std::to_string(r->n) + ")",
                 "best_of");
    }
  }
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
    // Parsed again keeping key order: templates iterate over objects in the order sent.
    const ojson ordered = ojson::parse(body_text, nullptr, /*allow_exceptions=*/false);
    if (auto e = ParseChatPrompt(ordered, limits, &r.chat)) return *e;
  } else {
    if (auto e = ParsePrompt(body, limits, &r)) return *e;
  }
  if (auto e = RejectUnsupported(body, endpoint)) return *e;
  if (auto e = ParseChoiceOptions(body, endpoint, limits, &r)) return *e;

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
    if (v == 0 && r.echo) {
      // echo with max_tokens 0: the prompt's log-likelihood only.
    } else if (v < 1) {
      return Bad(
          "'" + std::string(field) + "' must be at least 1 (0 only with 'echo'), got " + it->dump(),
          field);
    }
    if (v > limits.max_tokens_cap) {
      return Bad("'" + std::string(field) + "' = " + it->dump() + " exceeds the limit of " +
                     std::to_string(limits.max_tokens_cap),
                 field);
    }
    r.max_tokens = v;
  }

  r.temperature = limits.default_temperature;
  r.top_p = limits.default_top_p;
  r.top_k = limits.default_top_k;
  if (auto e = GetSamplingFloat(body, "temperature", 0.0, 2.0, false, &r.temperature)) return *e;
  if (auto e = GetSamplingFloat(body, "top_p", 0.0, 1.0, true, &r.top_p)) return *e;
  if (auto it = body.find("top_k"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return WrongType("top_k", "an integer", *it);
    int64_t v = it->get<int64_t>();
    if (v < -1 || v > limits.vocab_size) return Bad("'top_k' out of range: " + it->dump(), "top_k");
    r.top_k = v <= 0 ? 0 : static_cast<int32_t>(v);
  }
  // The workers' own check, on the values as they will arrive (common/sampling_check.h): what
  // passes here, a worker accepts.
  if (auto e = CheckSampling({r.temperature, r.top_p, r.top_k, r.logprobs})) {
    return Bad(e->message, e->param);
  }
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) return WrongType("seed", "an integer", *it);
    r.seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
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
    if (auto cu = it->find("continuous_usage_stats"); cu != it->end() && !cu->is_null()) {
      if (!cu->is_boolean()) {
        return WrongType("stream_options.continuous_usage_stats", "a boolean", *cu);
      }
      r.continuous_usage_stats = cu->get<bool>();
    }
  }
  if (r.stream && r.best_of > r.n) {
    return Bad("'best_of' greater than 'n' cannot be streamed", "best_of");
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

std::string TokenString(std::string_view bytes) {
  if (IsValidUtf8(bytes)) return std::string(bytes);
  static const char* kHex = "0123456789abcdef";
  std::string out = "bytes:";
  for (unsigned char c : bytes) {
    out += "\\x";
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

int64_t TextOffsetCounter::Next(std::string_view text_bytes) {
  int64_t offset = code_points_;
  if (!text_bytes.empty() && (static_cast<unsigned char>(text_bytes[0]) & 0xC0) == 0x80 &&
      code_points_ > 0) {
    offset = code_points_ - 1;  // begins inside the character before
  }
  for (unsigned char c : text_bytes) {
    if ((c & 0xC0) != 0x80) ++code_points_;
  }
  return offset;
}

json CompletionLogprobsJson(const std::vector<LogprobEntry>& entries) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  for (const LogprobEntry& e : entries) {
    const std::string tok = TokenString(e.bytes);
    tokens.push_back(tok);
    offsets.push_back(e.text_offset);
    if (!e.logprob) {
      token_lps.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    token_lps.push_back(*e.logprob);
    json top = json::object();
    for (const LogprobAlternative& a : e.top) {
      const std::string s = TokenString(a.bytes);
      if (!top.contains(s)) top[s] = a.logprob;  // two ids with one text: the likelier
    }
    if (!top.contains(tok)) top[tok] = *e.logprob;  // the chosen token is always listed
    tops.push_back(std::move(top));
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

namespace {
json BytesJson(std::string_view b) {
  json a = json::array();
  for (unsigned char c : b) a.push_back(static_cast<int>(c));
  return a;
}
}  // namespace

json ChatLogprobsJson(const std::vector<LogprobEntry>& entries, int32_t top_n) {
  json content = json::array();
  for (const LogprobEntry& e : entries) {
    json top = json::array();
    for (size_t i = 0; i < e.top.size() && static_cast<int32_t>(i) < top_n; ++i) {
      top.push_back({{"token", TokenString(e.top[i].bytes)},
                     {"logprob", e.top[i].logprob},
                     {"bytes", BytesJson(e.top[i].bytes)}});
    }
    content.push_back({{"token", TokenString(e.bytes)},
                       {"logprob", e.logprob ? json(*e.logprob) : json(nullptr)},
                       {"bytes", BytesJson(e.bytes)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

namespace {
json ChoiceLogprobs(const ResponseContext& ctx, const std::vector<LogprobEntry>& entries,
                    int32_t top_n) {
  return ctx.endpoint == Endpoint::kChatCompletions ? ChatLogprobsJson(entries, top_n)
                                                    : CompletionLogprobsJson(entries);
}
}  // namespace

std::string FullResponseJson(const ResponseContext& ctx, const std::vector<ChoiceResult>& choices,
                             const Usage& usage) {
  json j = Envelope(ctx, false);
  json list = json::array();
  for (const ChoiceResult& c : choices) {
    json choice = {
        {"index", c.index},
        {"logprobs", c.with_logprobs ? ChoiceLogprobs(ctx, c.logprobs, c.top_n) : json(nullptr)},
        {"finish_reason", FinishJson(c.finish_reason)}};
    if (ctx.endpoint == Endpoint::kChatCompletions) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    list.push_back(std::move(choice));
  }
  j["choices"] = std::move(list);
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string FullResponseJson(const ResponseContext& ctx, std::string_view text,
                             std::string_view finish_reason, const Usage& usage) {
  ChoiceResult c;
  c.text = std::string(text);
  c.finish_reason = std::string(finish_reason);
  return FullResponseJson(ctx, std::vector<ChoiceResult>{c}, usage);
}

namespace {
// A chunk's "usage": the running usage, or null (ResponseContext).
json ChunkUsage(const ResponseContext& ctx, const Usage* running) {
  return ctx.continuous_usage && running ? UsageJson(*running) : json(nullptr);
}
}  // namespace

std::string StreamRoleChunk(const ResponseContext& ctx, int32_t index, const Usage* running) {
  if (ctx.endpoint != Endpoint::kChatCompletions) return "";
  json j = Envelope(ctx, true);
  j["choices"] = json::array({{{"index", index},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  if (ctx.include_usage) j["usage"] = ChunkUsage(ctx, running);
  return SseData(j);
}

std::string StreamRoleChunk(const ResponseContext& ctx) { return StreamRoleChunk(ctx, 0); }

std::string StreamChoiceChunk(const ResponseContext& ctx, int32_t index, std::string_view text,
                              std::string_view finish_reason,
                              const std::vector<LogprobEntry>* logprobs, int32_t top_n,
                              const Usage* running) {
  json j = Envelope(ctx, true);
  json choice = {{"index", index},
                 {"logprobs", logprobs ? ChoiceLogprobs(ctx, *logprobs, top_n) : json(nullptr)},
                 {"finish_reason", FinishJson(finish_reason)}};
  if (ctx.endpoint == Endpoint::kChatCompletions) {
    choice["delta"] = text.empty() ? json::object() : json{{"content", text}};
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  if (ctx.include_usage) j["usage"] = ChunkUsage(ctx, running);
  return SseData(j);
}

std::string StreamTextChunk(const ResponseContext& ctx, std::string_view text,
                            std::string_view finish_reason) {
  return StreamChoiceChunk(ctx, 0, text, finish_reason, nullptr);
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
