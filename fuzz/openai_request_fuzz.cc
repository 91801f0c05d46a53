// libFuzzer target: OpenAI request validation (ParseApiRequest) on arbitrary bodies. The first
// byte picks the endpoint. A rejection must name a reason and render as a valid JSON error
// object; an accepted request must satisfy the limits it was validated against.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/logging.h"
#include "common/sampling_check.h"
#include "common/status.h"
#include "services/router/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using pw::router::Endpoint;
  const Endpoint ep = (data[0] & 1) ? Endpoint::kChatCompletions : Endpoint::kCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  pw::router::ApiLimits limits;
  limits.model_name = "tiny-moe";
  limits.max_tokens_cap = 512;
  limits.vocab_size = 1000;
  auto r = pw::router::ParseApiRequest(body, ep, limits);
  if (auto* e = std::get_if<pw::router::ApiError>(&r)) {
    PW_CHECK(!e->message.empty());
    PW_CHECK(e->http_status >= 400 && e->http_status < 600);
    auto j = nlohmann::json::parse(pw::router::ErrorJson(*e), nullptr, false);
    PW_CHECK(!j.is_discarded() && j.contains("error"));
    return 0;
  }
  const auto& req = std::get<pw::router::ApiRequest>(r);
  PW_CHECK(req.endpoint == ep);
  PW_CHECK(req.model == limits.model_name);
  PW_CHECK(!req.max_tokens || (*req.max_tokens >= 0 && *req.max_tokens <= limits.max_tokens_cap));
  PW_CHECK(req.temperature >= 0 && req.temperature <= 2);
  PW_CHECK(req.top_p > 0 && req.top_p <= 1);
  // What the router admits, the workers accept (their check, on the floats they will get).
  PW_CHECK(!pw::CheckSampling({req.temperature, req.top_p, req.top_k, req.logprobs}));
  PW_CHECK(req.stop.size() <= limits.max_stop);
  for (const auto& s : req.stop) PW_CHECK(!s.empty() && s.size() <= limits.max_stop_bytes);
  if (ep == Endpoint::kChatCompletions) {
    const auto& messages = req.chat.messages;
    PW_CHECK(!messages.empty() && messages.size() <= limits.max_messages);
    for (const auto& m : messages) {
      PW_CHECK(m.is_object() && m["role"].is_string());
      if (m.contains("content") && m["content"].is_string()) {
        PW_CHECK(pw::router::IsValidUtf8(m["content"].get<std::string>()));
      }
    }
  } else if (req.prompt_is_tokens) {
    for (int32_t t : req.prompt_tokens) PW_CHECK(t >= 0 && t < limits.vocab_size);
  } else {
    PW_CHECK(pw::router::IsValidUtf8(req.prompt_text));
  }
  return 0;
}

std::vector<std::string> PwFuzzSeeds() {
  return {
      std::string("\x00") + R"({"model":"tiny-moe","prompt":"The sea","max_tokens":16})",
      std::string("\x00") +
          R"({"model":"tiny-moe","prompt":[1,2,3],"max_tokens":4,"temperature":0,"stop":["\n"],"seed":7,"stream":true,"stream_options":{"include_usage":true}})",
      std::string("\x01") +
          R"({"model":"tiny-moe","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"top_p":0.5,"top_k":4})",
      std::string("\x01") + R"({"model":"other","messages":[]})",
      // Found by libFuzzer: a number too large for a double made the error path throw.
      std::string("\x0a") + "8e4444\x03meg",
      std::string("\x00") + R"({"model":"tiny-moe","prompt":"x","max_tokens":1e400})",
      // Above 0 as a double, 0 (or subnormal) as the float the workers compute with.
      std::string("\x00") + R"({"model":"tiny-moe","prompt":"x","top_p":1e-320})",
      std::string("\x01") +
          R"({"model":"tiny-moe","messages":[{"role":"user","content":"x"}],"temperature":1e-39})",
  };
}
