// Request validation and response formats of the OpenAI API (no sockets).
#include "services/router/openai_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace pw::router {
namespace {

using json = nlohmann::json;

ApiLimits Limits() {
  ApiLimits l;
  l.model_name = "m";
  l.max_tokens_cap = 100;
  l.vocab_size = 1000;
  return l;
}

ApiRequest Ok(const std::string& body, Endpoint ep = Endpoint::kCompletions) {
  auto r = ParseApiRequest(body, ep, Limits());
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << " -> " << e->message;
    return {};
  }
  return std::get<ApiRequest>(r);
}

ApiError Err(const std::string& body, Endpoint ep = Endpoint::kCompletions) {
  auto r = ParseApiRequest(body, ep, Limits());
  if (!std::holds_alternative<ApiError>(r)) {
    ADD_FAILURE() << "accepted: " << body;
    return {};
  }
  return std::get<ApiError>(r);
}

TEST(OpenAiApi, ParsesEveryCompletionParameter) {
  ApiRequest r = Ok(R"({"model":"m","prompt":"hi","max_tokens":12,"temperature":0.5,"top_p":0.9,
                        "seed":-3,"stop":"END","n":1,"stream":true,
                        "stream_options":{"include_usage":true},"user":"x"})");
  EXPECT_EQ(r.prompt_text, "hi");
  EXPECT_FALSE(r.prompt_is_tokens);
  EXPECT_EQ(r.max_tokens, 12);
  EXPECT_DOUBLE_EQ(r.temperature, 0.5);
  EXPECT_DOUBLE_EQ(r.top_p, 0.9);
  ASSERT_TRUE(r.seed.has_value());
  EXPECT_EQ(*r.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiApi, PromptForms) {
  EXPECT_EQ(Ok(R"({"model":"m","prompt":["one"]})").prompt_text, "one");
  ApiRequest t = Ok(R"({"model":"m","prompt":[5,6,999]})");
  EXPECT_TRUE(t.prompt_is_tokens);
  EXPECT_EQ(t.prompt_tokens, (std::vector<int32_t>{5, 6, 999}));
  EXPECT_EQ(Err(R"({"model":"m","prompt":["a","b"]})").param, "prompt");
  EXPECT_EQ(Err(R"({"model":"m","prompt":[[1,2]]})").param, "prompt");
  EXPECT_EQ(Err(R"({"model":"m","prompt":[1,1000]})").param, "prompt");
  EXPECT_EQ(Err(R"({"model":"m","prompt":[1,-1]})").param, "prompt");
  EXPECT_EQ(Err(R"({"model":"m","prompt":[1,"a"]})").param, "prompt[1]");
  EXPECT_EQ(Err(R"({"model":"m","prompt":null})").param, "prompt");
}

TEST(OpenAiApi, ChatMessages) {
  ApiRequest r = Ok(R"({"model":"m","messages":[{"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null},{"role":"user","content":"c"}],
      "max_completion_tokens":3,"max_tokens":9})",
                    Endpoint::kChatCompletions);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.max_tokens, 3);  // max_completion_tokens wins
  EXPECT_EQ(Err(R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
                Endpoint::kChatCompletions)
                .param,
            "messages[0].content[0]");
  EXPECT_EQ(Err(R"({"model":"m","messages":[{"content":"x"}]})", Endpoint::kChatCompletions).param,
            "messages[0].role");
  EXPECT_EQ(
      Err(R"({"model":"m","messages":[{"role":"user","content":""}]})", Endpoint::kChatCompletions)
          .param,
      "messages");
}

TEST(OpenAiApi, Rejections) {
  EXPECT_EQ(Err("{").code, "invalid_json");
  EXPECT_EQ(Err("null").code, "invalid_json");
  EXPECT_EQ(Err(std::string(100, '[') + std::string(100, ']')).code, "invalid_json");
  EXPECT_EQ(Err("{\"model\":\"m\",\"prompt\":\"\xed\xa0\x80\"}").code, "invalid_utf8");
  ApiError unknown = Err(R"({"model":"other","prompt":"x"})");
  EXPECT_EQ(unknown.http_status, 404);
  EXPECT_EQ(unknown.code, "model_not_found");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","max_tokens":101})").param, "max_tokens");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","max_tokens":-5})").param, "max_tokens");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","max_tokens":1e3})").param, "max_tokens");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","temperature":-0.1})").param, "temperature");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","top_p":1.5})").param, "top_p");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","n":3})").param, "n");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","stop":""})").param, "stop");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","stop":{"a":1}})").param, "stop");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","logprobs":2})").code, "unsupported_parameter");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","echo":true})").param, "echo");
  EXPECT_EQ(
      Err(R"({"model":"m","prompt":"x","stream_options":{"include_usage":1},"stream":true})").param,
      "stream_options.include_usage");
  // Defaults of unsupported options are accepted.
  Ok(R"({"model":"m","prompt":"x","logprobs":null,"echo":false,"best_of":1,"n":null})");
}

TEST(OpenAiApi, Utf8Validator) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x8e\x89"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));      // overlong 3-byte
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\x80"));              // lone continuation
  EXPECT_FALSE(IsValidUtf8("a\xe2\x9c"));         // truncated at end
}

TEST(OpenAiApi, ErrorObjectShape) {
  ApiError e;
  e.message = "bad";
  e.param = "prompt";
  json j = json::parse(ErrorJson(e));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "prompt");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(OpenAiApi, ChatStreamChunks) {
  ResponseContext ctx{Endpoint::kChatCompletions, "chatcmpl-1", 1700000000, "m", true};
  std::string role = StreamRoleChunk(ctx);
  ASSERT_EQ(role.rfind("data: ", 0), 0u);
  ASSERT_EQ(role.substr(role.size() - 2), "\n\n");
  json r = json::parse(role.substr(6));
  EXPECT_EQ(r["object"], "chat.completion.chunk");
  EXPECT_EQ(r["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(r["usage"].is_null());
  json t = json::parse(StreamTextChunk(ctx, "h\xc3\xa9", "").substr(6));
  EXPECT_EQ(t["choices"][0]["delta"]["content"], "h\xc3\xa9");
  EXPECT_TRUE(t["choices"][0]["finish_reason"].is_null());
  json f = json::parse(StreamTextChunk(ctx, "", "stop").substr(6));
  EXPECT_TRUE(f["choices"][0]["delta"].empty());
  EXPECT_EQ(f["choices"][0]["finish_reason"], "stop");
  json u = json::parse(StreamUsageChunk(ctx, {5, 7}).substr(6));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 12);
  json full = json::parse(FullResponseJson(ctx, "hello", "length", {5, 1}));
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(full["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(full["usage"]["completion_tokens"], 1);
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
}

TEST(OpenAiApi, CompletionStreamChunkHasNoUsageFieldWithoutIncludeUsage) {
  ResponseContext ctx{Endpoint::kCompletions, "cmpl-1", 1, "m", false};
  EXPECT_EQ(StreamRoleChunk(ctx), "");
  json t = json::parse(StreamTextChunk(ctx, "x", "").substr(6));
  EXPECT_EQ(t["object"], "text_completion");
  EXPECT_EQ(t["choices"][0]["text"], "x");
  EXPECT_FALSE(t.contains("usage"));
}

}  // namespace
}  // namespace pw::router
