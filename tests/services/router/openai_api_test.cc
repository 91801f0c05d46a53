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
  EXPECT_EQ(r.temperature, 0.5f);
  EXPECT_EQ(r.top_p, 0.9f);  // the float32 the workers compute with
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
  ApiRequest nested = Ok(R"({"model":"m","prompt":[[1,2]]})");  // a batch of one token list
  EXPECT_TRUE(nested.prompt_is_tokens);
  EXPECT_EQ(nested.prompt_tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(Err(R"({"model":"m","prompt":[[1,2],[3]]})").param, "prompt");
  EXPECT_EQ(Err(R"({"model":"m","prompt":[[]]})").param, "prompt");
  EXPECT_EQ(Err(R"({"model":"m","prompt":[[1,"a"]]})").param, "prompt[0][1]");
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
  // Given to the template as sent (roles, content parts and null content included).
  ASSERT_EQ(r.chat.messages.size(), 4u);
  EXPECT_EQ(r.chat.messages[0]["role"], "developer");
  EXPECT_EQ(r.chat.messages[1]["content"][1]["text"], "b");
  EXPECT_TRUE(r.chat.messages[2]["content"].is_null());
  EXPECT_TRUE(r.chat.add_generation_prompt);
  EXPECT_FALSE(r.chat.continue_final_message);
  EXPECT_EQ(r.max_tokens, 3);  // max_completion_tokens wins
  EXPECT_EQ(Err(R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
                Endpoint::kChatCompletions)
                .param,
            "messages[0].content[0].type");
  EXPECT_EQ(Err(R"({"model":"m","messages":[{"content":"x"}]})", Endpoint::kChatCompletions).param,
            "messages[0].role");
  // Empty text is the template's to render (the prompt is checked after tokenization).
  Ok(R"({"model":"m","messages":[{"role":"user","content":""}]})", Endpoint::kChatCompletions);
  // Tools, tool calls (string arguments parsed, as vLLM), template kwargs.
  ApiRequest t = Ok(R"({"model":"m","messages":[{"role":"user","content":"w?"},
      {"role":"assistant","tool_calls":[{"id":"1","type":"function",
       "function":{"name":"w","arguments":"{\"z\":1,\"a\":2}"}}]},
      {"role":"tool","tool_call_id":"1","content":"sun"}],
      "tools":[{"type":"function","function":{"name":"w","parameters":{"type":"object"}}}],
      "chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":true})",
                    Endpoint::kChatCompletions);
  EXPECT_EQ(t.chat.messages[1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"z":1,"a":2})");
  EXPECT_EQ(t.chat.tools[0]["function"]["name"], "w");
  EXPECT_EQ(t.chat.kwargs["enable_thinking"], false);
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","tools":[{"type":"function"}]})").param, "tools");
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
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","n":17})").param, "n");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","stop":""})").param, "stop");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","stop":{"a":1}})").param, "stop");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","echo":1})").param, "echo");
  EXPECT_EQ(
      Err(R"({"model":"m","prompt":"x","stream_options":{"include_usage":1},"stream":true})").param,
      "stream_options.include_usage");
  // Defaults are accepted.
  Ok(R"({"model":"m","prompt":"x","logprobs":null,"echo":false,"best_of":1,"n":null})");
}

// Sampling options the server does not implement are refused unless they ask for nothing, so a
// request is never served as if it had not asked.
TEST(OpenAiApi, UnimplementedSamplingOptionsAreRefusedUnlessNeutral) {
  for (const char* body : {R"({"model":"m","prompt":"x","presence_penalty":0.5})",
                           R"({"model":"m","prompt":"x","frequency_penalty":-1})",
                           R"({"model":"m","prompt":"x","repetition_penalty":1.1})",
                           R"({"model":"m","prompt":"x","min_p":0.05})",
                           R"({"model":"m","prompt":"x","min_p":"0"})",
                           R"({"model":"m","prompt":"x","logit_bias":{"50256":-100}})"}) {
    const ApiError e = Err(body);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.code, "unsupported_parameter") << body;
    EXPECT_FALSE(e.param.empty()) << body;
  }
  EXPECT_EQ(Err(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"1":5}})",
                Endpoint::kChatCompletions)
                .param,
            "logit_bias");
  Ok(R"({"model":"m","prompt":"x","presence_penalty":0,"frequency_penalty":0.0,)"
     R"("repetition_penalty":1,"min_p":0,"logit_bias":{}})");
  Ok(R"({"model":"m","prompt":"x","presence_penalty":null,"logit_bias":null})");
}

TEST(OpenAiApi, SamplingValuesAreCheckedAsTheWorkersFloat) {
  // 1e-320 is above 0 as a double and 0 as the float the workers compute with: refused here,
  // naming the field, not on a worker.
  ApiError e = Err(R"({"model":"m","prompt":"x","top_p":1e-320})");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.param, "top_p");
  EXPECT_NE(e.message.find("1e-320"), std::string::npos) << e.message;
  json j = json::parse(ErrorJson(e));
  EXPECT_EQ(j["error"]["param"], "top_p");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(j["error"].contains("code"));
  EXPECT_TRUE(j["error"].contains("message"));
  // Subnormal as a float: too few bits, and 1 / temperature overflows.
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","top_p":1e-40})").param, "top_p");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","temperature":1e-320})").param, "temperature");
  EXPECT_EQ(Err(R"({"model":"m","prompt":"x","temperature":1e-39})").param, "temperature");
  // Chat goes through the same check.
  EXPECT_EQ(Err(R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_p":5e-324})",
                Endpoint::kChatCompletions)
                .param,
            "top_p");
  // The smallest normal float and above are taken, as that float; and whatever is taken the
  // workers' own check accepts.
  for (const char* body : {R"({"model":"m","prompt":"x","temperature":1.2e-38,"top_p":1.2e-38})",
                           R"({"model":"m","prompt":"x","temperature":2,"top_p":1})",
                           R"({"model":"m","prompt":"x","temperature":0,"top_p":1e-30})",
                           R"({"model":"m","prompt":"x","temperature":-0.0,"top_k":-1})",
                           R"({"model":"m","prompt":"x","logprobs":20,"top_k":1000})"}) {
    ApiRequest r = Ok(body);
    EXPECT_FALSE(CheckSampling({r.temperature, r.top_p, r.top_k, r.logprobs}).has_value())
        << body;
  }
  EXPECT_EQ(Ok(R"({"model":"m","prompt":"x","top_p":1e-30})").top_p, 1e-30f);
}

TEST(OpenAiApi, LogprobsEchoNBestOf) {
  ApiRequest r = Ok(R"({"model":"m","prompt":"x","logprobs":5,"echo":true,"n":2,"best_of":3,
                        "max_tokens":0})");
  EXPECT_EQ(r.logprobs, 5);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 3);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_EQ(Ok(R"({"model":"m","prompt":"x","logprobs":0})").logprobs, 0);
  EXPECT_EQ(Ok(R"({"model":"m","prompt":"x","logprobs":20})").logprobs, 20);
  EXPECT_EQ(Ok(R"({"model":"m","prompt":"x","logprobs":false})").logprobs, -1);
  EXPECT_EQ(Ok(R"({"model":"m","prompt":"x"})").logprobs, -1);
  EXPECT_EQ(Ok(R"({"model":"m","prompt":"x","n":16})").best_of, 16);  // best_of defaults to n
  // Chat: logprobs is a boolean, top_logprobs the count.
  auto chat = [](const std::string& extra) {
    return R"({"model":"m","messages":[{"role":"user","content":"hi"}])" + extra + "}";
  };
  EXPECT_EQ(Ok(chat(R"(,"logprobs":true,"top_logprobs":3)"), Endpoint::kChatCompletions).logprobs,
            3);
  EXPECT_EQ(Ok(chat(R"(,"logprobs":true)"), Endpoint::kChatCompletions).logprobs, 0);
  EXPECT_EQ(Ok(chat(R"(,"logprobs":false)"), Endpoint::kChatCompletions).logprobs, -1);
  EXPECT_EQ(Ok(chat(R"(,"n":4)"), Endpoint::kChatCompletions).n, 4);
}

TEST(OpenAiApi, LogprobsEchoNBestOfBadValuesNameTheParam) {
  struct Case {
    std::string body;
    Endpoint ep;
    std::string param;
  };
  auto chat = [](const std::string& extra) {
    return R"({"model":"m","messages":[{"role":"user","content":"hi"}])" + extra + "}";
  };
  const Case cases[] = {
      {R"({"model":"m","prompt":"x","logprobs":-1})", Endpoint::kCompletions, "logprobs"},
      {R"({"model":"m","prompt":"x","logprobs":21})", Endpoint::kCompletions, "logprobs"},
      {R"({"model":"m","prompt":"x","logprobs":1.5})", Endpoint::kCompletions, "logprobs"},
      {R"({"model":"m","prompt":"x","logprobs":true})", Endpoint::kCompletions, "logprobs"},
      {R"({"model":"m","prompt":"x","logprobs":18446744073709551615})", Endpoint::kCompletions,
       "logprobs"},
      {R"({"model":"m","prompt":"x","n":0})", Endpoint::kCompletions, "n"},
      {R"({"model":"m","prompt":"x","n":-2})", Endpoint::kCompletions, "n"},
      {R"({"model":"m","prompt":"x","n":17})", Endpoint::kCompletions, "n"},
      {R"({"model":"m","prompt":"x","n":"2"})", Endpoint::kCompletions, "n"},
      {R"({"model":"m","prompt":"x","best_of":0})", Endpoint::kCompletions, "best_of"},
      {R"({"model":"m","prompt":"x","best_of":17})", Endpoint::kCompletions, "best_of"},
      {R"({"model":"m","prompt":"x","n":3,"best_of":2})", Endpoint::kCompletions, "best_of"},
      {R"({"model":"m","prompt":"x","best_of":2,"stream":true})", Endpoint::kCompletions,
       "best_of"},
      {R"({"model":"m","prompt":"x","max_tokens":0})", Endpoint::kCompletions, "max_tokens"},
      {R"({"model":"m","prompt":"x","echo":"yes"})", Endpoint::kCompletions, "echo"},
      {chat(R"(,"logprobs":1)"), Endpoint::kChatCompletions, "logprobs"},
      {chat(R"(,"top_logprobs":2)"), Endpoint::kChatCompletions, "top_logprobs"},
      {chat(R"(,"logprobs":true,"top_logprobs":-1)"), Endpoint::kChatCompletions, "top_logprobs"},
      {chat(R"(,"logprobs":true,"top_logprobs":21)"), Endpoint::kChatCompletions, "top_logprobs"},
      {chat(R"(,"n":0)"), Endpoint::kChatCompletions, "n"},
      {chat(R"(,"echo":true)"), Endpoint::kChatCompletions, "echo"},
      {chat(R"(,"best_of":2)"), Endpoint::kChatCompletions, "best_of"},
  };
  for (const Case& c : cases) {
    auto r = ParseApiRequest(c.body, c.ep, Limits());
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << c.body;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(OpenAiApi, TokenStringWritesSplitCharactersAsBytes) {
  EXPECT_EQ(TokenString("hello"), "hello");
  EXPECT_EQ(TokenString("\xc3\xa9"), "\xc3\xa9");  // é whole
  EXPECT_EQ(TokenString("\xe6\x97"), "bytes:\\xe6\\x97");
  EXPECT_EQ(TokenString("\xa5"), "bytes:\\xa5");
  EXPECT_EQ(TokenString(""), "");
}

TEST(OpenAiApi, TextOffsetsCountCodePointsAndSplitCharacters) {
  // "a" "日" split as \xe6 | \x97\xa5, then "b", then a special token adding no text, "é".
  TextOffsetCounter c;
  EXPECT_EQ(c.Next("a"), 0);
  EXPECT_EQ(c.Next("\xe6"), 1);      // begins the character at index 1
  EXPECT_EQ(c.Next("\x97\xa5"), 1);  // begins inside it: that character's index
  EXPECT_EQ(c.Next("b"), 2);
  EXPECT_EQ(c.Next(""), 3);
  EXPECT_EQ(c.Next("\xc3\xa9x"), 3);
  EXPECT_EQ(c.code_points(), 5);  // a 日 b é x
}

TEST(OpenAiApi, CompletionLogprobsLegacyShape) {
  std::vector<LogprobEntry> entries(3);
  entries[0].bytes = "The";  // first prompt token: nothing predicts it
  entries[0].text_offset = 0;
  entries[1].bytes = " cat";
  entries[1].logprob = -1.5f;
  entries[1].top = {{" dog", -0.5f}, {" cow", -1.0f}};
  entries[1].text_offset = 3;
  entries[2].bytes = "\xe6";
  entries[2].logprob = -2.0f;
  entries[2].top = {{"\xe6", -2.0f}};
  entries[2].text_offset = 7;
  json j = CompletionLogprobsJson(entries);
  EXPECT_EQ(j["tokens"], json({"The", " cat", "bytes:\\xe6"}));
  EXPECT_TRUE(j["token_logprobs"][0].is_null());
  EXPECT_DOUBLE_EQ(j["token_logprobs"][1].get<double>(), -1.5);
  EXPECT_TRUE(j["top_logprobs"][0].is_null());
  // The N most likely, and the chosen token (not among them) as well.
  EXPECT_EQ(j["top_logprobs"][1].size(), 3u);
  EXPECT_DOUBLE_EQ(j["top_logprobs"][1][" dog"].get<double>(), -0.5);
  EXPECT_DOUBLE_EQ(j["top_logprobs"][1][" cat"].get<double>(), -1.5);
  EXPECT_EQ(j["top_logprobs"][2].size(), 1u);
  EXPECT_EQ(j["text_offset"], json({0, 3, 7}));
}

TEST(OpenAiApi, ChatLogprobsShape) {
  std::vector<LogprobEntry> entries(1);
  entries[0].bytes = "Hi";
  entries[0].logprob = -0.25f;
  entries[0].top = {{"Hi", -0.25f}, {"Ho", -2.0f}, {"He", -3.0f}};
  json j = ChatLogprobsJson(entries, 2);
  EXPECT_TRUE(j["refusal"].is_null());
  ASSERT_EQ(j["content"].size(), 1u);
  const json& c = j["content"][0];
  EXPECT_EQ(c["token"], "Hi");
  EXPECT_DOUBLE_EQ(c["logprob"].get<double>(), -0.25);
  EXPECT_EQ(c["bytes"], json({72, 105}));
  ASSERT_EQ(c["top_logprobs"].size(), 2u);  // exactly top_logprobs entries
  EXPECT_EQ(c["top_logprobs"][1]["token"], "Ho");
  EXPECT_EQ(c["top_logprobs"][1]["bytes"], json({72, 111}));
}

TEST(OpenAiApi, FullResponseWithSeveralChoicesAndLogprobs) {
  ResponseContext ctx;
  ctx.id = "cmpl-1";
  ctx.model = "m";
  std::vector<ChoiceResult> choices(2);
  choices[0].index = 0;
  choices[0].text = "a";
  choices[0].finish_reason = "length";
  choices[0].with_logprobs = true;
  choices[0].logprobs.resize(1);
  choices[0].logprobs[0].bytes = "a";
  choices[0].logprobs[0].logprob = -1.f;
  choices[1].index = 1;
  choices[1].text = "b";
  choices[1].finish_reason = "stop";
  json j = json::parse(FullResponseJson(ctx, choices, Usage{3, 2}));
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"], json({"a"}));
  EXPECT_TRUE(j["choices"][1]["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
  ctx.endpoint = Endpoint::kChatCompletions;
  choices[0].top_n = 0;
  j = json::parse(FullResponseJson(ctx, choices, Usage{3, 2}));
  EXPECT_EQ(j["choices"][0]["message"]["content"], "a");
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0]["token"], "a");
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0]["top_logprobs"], json::array());
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
