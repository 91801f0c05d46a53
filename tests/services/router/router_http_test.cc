// The router's HTTP front end end to end over loopback: OpenAI formats, SSE, validation and
// every bad input the router must refuse, admission (429), cancellation on disconnect, timeouts, drain,
// logprobs (both shapes, streamed and not, exact text offsets), echo, n and best_of, API keys and
// the tokenizer endpoints.
// The worker side is ScriptedTestBackend (router logic only); the tokenizer is the real one of
// the embedded model.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/text/tokenizer.h"
#include "services/router/chat_renderer.h"
#include "services/router/router.h"
#include "services/router/tokenizer_codec.h"
#include "tests/services/router/http_test_client.h"
#include "tests/services/router/scripted_backend.h"

namespace pw::router {
namespace {

using json = nlohmann::json;
using testing::ClientResponse;
using testing::GetRequest;
using testing::PostRequest;
using testing::ScriptedTestBackend;
using testing::TestConnection;

constexpr const char* kScriptText =
    "The quick brown fox jumps over the lazy dog. Caf\xc3\xa9 \xe2\x9c\x93 and \xf0\x9f\x8e\x89 "
    "then more words follow here";

template <typename F>
bool WaitFor(F cond, int timeout_ms = 5000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return cond();
}

int ThreadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Parses an SSE body into its data payloads; checks the framing on the way.
std::vector<std::string> SseEvents(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "event not terminated by a blank line";
    if (end == std::string::npos) break;
    std::string ev = body.substr(pos, end - pos);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    out.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

class RouterHttpTest : public ::testing::Test {
 protected:
  void SetUp() override { Build(RouterOptions{}, HttpServerOptions{}); }
  void TearDown() override { Teardown(); }

  void Build(RouterOptions ro, HttpServerOptions ho) {
    auto tok = Tokenizer::FromModelDir(PW_SOURCE_DIR "/models/tiny-moe");
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tokenizer_ = tok->get();
    auto chat = MakeChatRenderer(**tok, chat_template_dir_);
    codec_ = std::make_unique<TokenizerCodec>(std::move(*tok),
                                              chat.ok() ? std::move(*chat) : ChatRenderer());
    auto ids = codec_->Encode(kScriptText);
    ASSERT_TRUE(ids.ok());
    script_ = *ids;
    if (eos_after_ >= 0) {
      script_.resize(eos_after_);
      script_.push_back(*tokenizer_->eos_token_id());
    }
    backend_ = std::make_unique<ScriptedTestBackend>(script_, std::chrono::milliseconds(2));
    metrics_ = std::make_shared<RouterMetrics>(std::make_shared<prometheus::Registry>());
    ro.model_name = "tiny-moe";
    ro.context_length = context_length_;
    router_ = std::make_unique<Router>(ro, codec_.get(), backend_.get(), metrics_);
    ho.port = 0;
    if (ho.header_timeout == HttpServerOptions{}.header_timeout) {
      ho.header_timeout = std::chrono::milliseconds(400);
    }
    auto server = HttpServer::Create(ho, [this](HttpRequest r, std::shared_ptr<HttpExchange> e) {
      router_->Handle(std::move(r), std::move(e));
    });
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    router_->SetServer(server_.get());
    server_->Start();
  }

  void Teardown() {
    if (server_) server_->Stop();
    backend_.reset();
    server_.reset();
    router_.reset();
  }

  std::string Decode(size_t n) {
    std::vector<int32_t> ids(script_.begin(), script_.begin() + std::min(n, script_.size()));
    auto s = tokenizer_->Decode(ids, true);
    EXPECT_TRUE(s.ok());
    return *s;
  }

  ClientResponse Call(const std::string& raw) {
    TestConnection c(server_->port());
    EXPECT_TRUE(c.ok());
    EXPECT_TRUE(c.Send(raw));
    auto r = c.Read();
    EXPECT_TRUE(r.has_value()) << "no response to: " << raw.substr(0, 200);
    return r.value_or(ClientResponse{});
  }

  ClientResponse Post(const std::string& path, const std::string& body) {
    return Call(PostRequest(path, body));
  }

  // Checks an OpenAI error object and returns it.
  json ExpectError(const ClientResponse& r, int status, const std::string& param = "") {
    EXPECT_EQ(r.status, status) << r.body;
    json j = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("error")) << r.body;
    if (!j.is_object() || !j.contains("error")) return j;
    const json& e = j["error"];
    for (const char* k : {"message", "type", "param", "code"}) {
      EXPECT_TRUE(e.contains(k)) << "missing error." << k << ": " << r.body;
    }
    EXPECT_TRUE(e["message"].is_string());
    EXPECT_FALSE(e["message"].get<std::string>().empty());
    if (!param.empty()) EXPECT_EQ(e["param"], param) << r.body;
    return j;
  }

  void ExpectHealthy() {
    auto r = Call(GetRequest("/health"));
    EXPECT_EQ(r.status, 200) << r.body;
    auto c = Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","max_tokens":2})");
    EXPECT_EQ(c.status, 200) << c.body;
  }

  // Requests admitted and not finished, read on the io thread.
  size_t router_in_flight() {
    std::promise<size_t> p;
    auto f = p.get_future();
    server_->Post([&] { p.set_value(router_->in_flight()); });
    return f.get();
  }

  int eos_after_ = -1;
  int64_t context_length_ = 64;
  std::string chat_template_dir_;  // holds chat_template.jinja when set (else the model's own)
  Tokenizer* tokenizer_ = nullptr;
  std::unique_ptr<TokenizerCodec> codec_;
  std::vector<int32_t> script_;
  std::unique_ptr<ScriptedTestBackend> backend_;
  std::shared_ptr<RouterMetrics> metrics_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(RouterHttpTest, CompletionNonStreaming) {
  auto r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hello there","max_tokens":7})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "application/json");
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny-moe");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["text"], Decode(7));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["index"], 0);
  auto prompt_ids = codec_->Encode("Hello there");
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_ids->size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 7);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt_ids->size() + 7);
  auto sub = backend_->submitted();
  ASSERT_EQ(sub.size(), 1u);
  EXPECT_EQ(sub[0].prompt, *prompt_ids);
  EXPECT_EQ(sub[0].sampling.max_tokens, 7);
}

TEST_F(RouterHttpTest, CompletionStreamingSseFormat) {
  const size_t n = 20;  // covers the multi-byte characters of the script
  auto r = Post("/v1/completions",
                R"({"model":"tiny-moe","prompt":"Hello","max_tokens":20,"stream":true,
                    "stream_options":{"include_usage":true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "text/event-stream");
  EXPECT_EQ(r.headers["transfer-encoding"], "chunked");
  auto events = SseEvents(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text, id;
  int finish_chunks = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json j = json::parse(events[i]);
    if (id.empty()) id = j["id"];
    EXPECT_EQ(j["id"], id);
    EXPECT_EQ(j["object"], "text_completion");
    if (i + 2 == events.size()) {  // the usage chunk
      EXPECT_TRUE(j["choices"].empty());
      EXPECT_EQ(j["usage"]["completion_tokens"], n);
      continue;
    }
    EXPECT_TRUE(j["usage"].is_null());
    std::string piece = j["choices"][0]["text"];
    EXPECT_TRUE(IsValidUtf8(piece)) << "a chunk split a UTF-8 character";
    text += piece;
    if (!j["choices"][0]["finish_reason"].is_null()) {
      ++finish_chunks;
      EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    }
  }
  EXPECT_EQ(finish_chunks, 1);
  EXPECT_EQ(text, Decode(n));
}

// stream_options.continuous_usage_stats (vLLM's): every chunk of the choice carries its running
// usage, and every token gets a chunk of its own, also one whose text is held back (here by a
// stop string that matches "fox jumps" and then fails at " over"): completion_tokens rises by
// exactly one a chunk.
TEST_F(RouterHttpTest, ContinuousUsageStatsGiveEveryTokenAChunkWithItsRunningUsage) {
  const int n = 20;
  for (const bool chat : {false, true}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    auto r = chat ? Post("/v1/chat/completions",
                         R"({"model":"tiny-moe","messages":[{"role":"user","content":"Hi"}],
                             "max_tokens":20,"stream":true,"stop":["fox jumps!"],
                             "stream_options":{"include_usage":true,"continuous_usage_stats":true}})")
                  : Post("/v1/completions",
                         R"({"model":"tiny-moe","prompt":"Hello","max_tokens":20,"stream":true,
                             "stop":["fox jumps!"],
                             "stream_options":{"include_usage":true,"continuous_usage_stats":true}})");
    ASSERT_EQ(r.status, 200) << r.body;
    auto events = SseEvents(r.body);
    ASSERT_GE(events.size(), 3u);
    EXPECT_EQ(events.back(), "[DONE]");
    const json final_usage = json::parse(events[events.size() - 2]);
    ASSERT_TRUE(final_usage["choices"].empty());
    EXPECT_EQ(final_usage["usage"]["completion_tokens"], n);
    const int64_t prompt = final_usage["usage"]["prompt_tokens"];
    std::string text;
    int64_t last = 0;
    int token_chunks = 0, empty_token_chunks = 0;
    for (size_t i = 0; i + 2 < events.size(); ++i) {
      json j = json::parse(events[i]);
      ASSERT_TRUE(j["usage"].is_object()) << events[i];
      EXPECT_EQ(j["usage"]["prompt_tokens"], prompt);
      const int64_t ct = j["usage"]["completion_tokens"];
      EXPECT_EQ(j["usage"]["total_tokens"], prompt + ct);
      const json& c = j["choices"][0];
      const std::string piece =
          chat ? c["delta"].value("content", "") : c["text"].get<std::string>();
      text += piece;
      if (chat && i == 0) {  // the role chunk, before any token
        EXPECT_EQ(ct, 0);
        continue;
      }
      if (!c["finish_reason"].is_null()) {  // the finish chunk: no new token
        EXPECT_EQ(ct, last);
        continue;
      }
      EXPECT_EQ(ct, last + 1) << "a chunk per token";
      last = ct;
      ++token_chunks;
      if (piece.empty()) ++empty_token_chunks;
    }
    EXPECT_EQ(token_chunks, n);
    EXPECT_GT(empty_token_chunks, 0) << "the stop string holds \" fox jumps\" back";
    EXPECT_EQ(text, Decode(n));
  }
  auto bad = Post("/v1/completions",
                  R"({"model":"tiny-moe","prompt":"Hi","stream":true,
                      "stream_options":{"include_usage":true,"continuous_usage_stats":1}})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("stream_options.continuous_usage_stats"), std::string::npos) << bad.body;
}

TEST_F(RouterHttpTest, StopStringCutsTextAndCancels) {
  // "fox" is in the script: the text ends right before it and the backend is told to stop.
  auto r = Post("/v1/completions",
                R"({"model":"tiny-moe","prompt":"Hi","max_tokens":40,"stop":["zzz","fox"]})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  std::string full = Decode(40);
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, full.find("fox")));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  auto sub = backend_->submitted();
  ASSERT_EQ(sub.size(), 1u);
  EXPECT_TRUE(WaitFor([&] { return backend_->cancelled().count(sub[0].id) == 1; }));
}

TEST_F(RouterHttpTest, StopStringStreamingNeverLeaksThePrefix) {
  auto r =
      Post("/v1/completions",
           R"({"model":"tiny-moe","prompt":"Hi","max_tokens":40,"stop":"lazy dog","stream":true})");
  ASSERT_EQ(r.status, 200);
  auto events = SseEvents(r.body);
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    text += json::parse(events[i])["choices"][0]["text"].get<std::string>();
  }
  std::string full = Decode(40);
  EXPECT_EQ(text, full.substr(0, full.find("lazy dog")));
}

TEST_F(RouterHttpTest, EndOfSequenceTokenStopsWithoutText) {
  Teardown();
  eos_after_ = 3;  // the script emits end-of-sequence after three tokens
  Build(RouterOptions{}, HttpServerOptions{});
  auto r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","max_tokens":30})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], Decode(3));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
}

// generation_config.json's defaults (RouterOptions::generation_defaults): its sampling values
// for what a request leaves out, its eos ids as stop tokens besides the tokenizer's.
TEST_F(RouterHttpTest, GenerationConfigDefaultsAndEosIds) {
  const std::vector<int32_t> script = script_;
  ASSERT_GE(script.size(), 4u);
  ASSERT_EQ(std::find(script.begin(), script.begin() + 3, script[3]), script.begin() + 3);
  Teardown();
  RouterOptions ro;
  ro.generation_defaults.temperature = 0.6f;
  ro.generation_defaults.top_p = 0.95f;
  ro.generation_defaults.top_k = 20;
  ro.generation_defaults.eos_token_ids = {script[3], 7};  // the 4th scripted token ends it
  Build(ro, HttpServerOptions{});
  auto r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","max_tokens":30})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["text"], Decode(3));
  auto sub = backend_->submitted();
  ASSERT_EQ(sub.size(), 1u);
  EXPECT_FLOAT_EQ(sub[0].sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(sub[0].sampling.top_p, 0.95f);
  EXPECT_EQ(sub[0].sampling.top_k, 20);
  const auto& stops = sub[0].sampling.stop_token_ids;
  for (int32_t id : {script[3], 7, static_cast<int32_t>(*tokenizer_->eos_token_id())}) {
    EXPECT_NE(std::find(stops.begin(), stops.end(), id), stops.end()) << id;
  }
  // The request's own values win; ignore_eos drops every stop id.
  r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","max_tokens":5,
                                  "temperature":0.2,"top_p":0.5,"top_k":3,"ignore_eos":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["finish_reason"], "length");
  sub = backend_->submitted();
  ASSERT_EQ(sub.size(), 2u);
  EXPECT_FLOAT_EQ(sub[1].sampling.temperature, 0.2f);
  EXPECT_FLOAT_EQ(sub[1].sampling.top_p, 0.5f);
  EXPECT_EQ(sub[1].sampling.top_k, 3);
  EXPECT_TRUE(sub[1].sampling.stop_token_ids.empty());
  // temperature 0 in a request is greedy even when the checkpoint's default samples.
  r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","max_tokens":2,
                                  "temperature":0})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FLOAT_EQ(backend_->submitted()[2].sampling.temperature, 0.f);
}

TEST_F(RouterHttpTest, ModelsHealthMetricsAndRoutes) {
  auto m = Call(GetRequest("/v1/models"));
  ASSERT_EQ(m.status, 200);
  json j = json::parse(m.body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "tiny-moe");
  auto h = Call(GetRequest("/health"));
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(json::parse(h.body)["status"], "ok");
  ExpectError(Call(GetRequest("/nope")), 404);
  ExpectError(Call(GetRequest("/v1/completions")), 405);
  ASSERT_EQ(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","max_tokens":3})").status,
            200);
  auto met = Call(GetRequest("/metrics"));
  ASSERT_EQ(met.status, 200);
  for (const char* name :
       {"pagedweight_router_requests_total{",
        "pagedweight_router_time_to_first_token_seconds_bucket",
        "pagedweight_router_inter_token_latency_seconds_bucket",
        "pagedweight_router_e2e_request_latency_seconds_count",
        "pagedweight_router_num_requests_running", "pagedweight_router_num_requests_waiting"}) {
    EXPECT_NE(met.body.find(name), std::string::npos) << name;
  }
  EXPECT_NE(met.body.find("code=\"200\""), std::string::npos);
  EXPECT_NE(met.body.find("code=\"405\""), std::string::npos);
}

TEST_F(RouterHttpTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  TestConnection c(server_->port());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.Send(
        PostRequest("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","max_tokens":2})")));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->headers["connection"], "keep-alive");
  }
  // Two pipelined requests are answered in order.
  ASSERT_TRUE(c.Send(GetRequest("/health") + GetRequest("/v1/models")));
  auto a = c.Read(), b = c.Read();
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->body.find("status"), std::string::npos);
  EXPECT_NE(b->body.find("\"list\""), std::string::npos);
}

TEST_F(RouterHttpTest, ChatCompletionUsesTheChatTemplate) {
  auto r = Post("/v1/chat/completions",
                R"({"model":"tiny-moe","messages":[{"role":"system","content":"Be brief."},
                    {"role":"user","content":"Hello"}],"max_tokens":6})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], Decode(6));
  // The prompt sent to the backend is the ChatML rendering of the conversation.
  auto expected = codec_->Encode(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\n");
  ASSERT_TRUE(expected.ok());
  auto sub = backend_->submitted();
  ASSERT_EQ(sub.size(), 1u);
  EXPECT_EQ(sub[0].prompt, *expected);
  // Chat stops at end-of-turn as well as end-of-text.
  auto im_end = tokenizer_->TokenToId("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  EXPECT_NE(std::find(sub[0].sampling.stop_token_ids.begin(), sub[0].sampling.stop_token_ids.end(),
                      *im_end),
            sub[0].sampling.stop_token_ids.end());
}

TEST_F(RouterHttpTest, ChatStreamingFormat) {
  auto r = Post("/v1/chat/completions",
                R"({"model":"tiny-moe","messages":[{"role":"user","content":"Hi"}],
                    "max_tokens":5,"stream":true})");
  ASSERT_EQ(r.status, 200);
  auto events = SseEvents(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    json j = json::parse(events[i]);
    EXPECT_FALSE(j.contains("usage"));
    const json& d = j["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
  }
  json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(text, Decode(5));
}

TEST_F(RouterHttpTest, ExpectContinueIsAnswered) {
  TestConnection c(server_->port());
  const std::string body = R"({"model":"tiny-moe","prompt":"Hi","max_tokens":2})";
  ASSERT_TRUE(
      c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
             "Content-Length: " +
             std::to_string(body.size()) + "\r\n\r\n"));
  ASSERT_TRUE(c.WaitForData(3000)) << "no 100 Continue";
  ASSERT_TRUE(c.Send(body));
  auto r = c.Read();  // skips the 100 Continue
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200) << r->body;
}

// ---- Bad-input tests: each answered with the right 4xx, server healthy afterwards.

TEST_F(RouterHttpTest, MalformedJson) {
  ExpectError(Post("/v1/completions", R"({"model": "tiny-moe", "prompt": )"), 400);
  ExpectError(Post("/v1/completions", "[1,2,3]"), 400);
  ExpectError(Post("/v1/completions", ""), 400);
  ExpectError(Post("/v1/chat/completions", "{\"model\":\"tiny-moe\",,}"), 400);
  ExpectHealthy();
}

TEST_F(RouterHttpTest, DeeplyNestedJsonIsRefusedWithoutRecursion) {
  std::string deep(200000, '[');
  ExpectError(Post("/v1/completions", deep), 400);
  ExpectHealthy();
}

TEST_F(RouterHttpTest, WrongTypes) {
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":5})"), 400, "prompt");
  ExpectError(Post("/v1/completions", R"({"model":7,"prompt":"x"})"), 400, "model");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","max_tokens":"9"})"), 400,
              "max_tokens");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","max_tokens":2.5})"), 400,
              "max_tokens");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","temperature":"hot"})"),
              400, "temperature");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","stream":"yes"})"), 400,
              "stream");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","stop":[1]})"), 400,
              "stop[0]");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","seed":"s"})"), 400,
              "seed");
  ExpectError(Post("/v1/chat/completions", R"({"model":"tiny-moe","messages":"hi"})"), 400,
              "messages");
  ExpectError(Post("/v1/chat/completions",
                   R"({"model":"tiny-moe","messages":[{"role":"user","content":5}]})"),
              400, "messages[0].content");
  ExpectError(Post("/v1/chat/completions",
                   R"({"model":"tiny-moe","messages":[{"role":"wizard","content":"x"}]})"),
              400, "messages[0].role");
  ExpectHealthy();
}

TEST_F(RouterHttpTest, OutOfRangeValues) {
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","max_tokens":-1})"), 400,
              "max_tokens");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","max_tokens":0})"), 400,
              "max_tokens");
  ExpectError(
      Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","max_tokens":1000000000000})"),
      400, "max_tokens");
  ExpectError(Post("/v1/completions",
                   R"({"model":"tiny-moe","prompt":"x","max_tokens":99999999999999999999})"),
              400, "max_tokens");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","temperature":3})"), 400,
              "temperature");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","top_p":0})"), 400,
              "top_p");
  // Above 0 as a double, 0 as the float the workers compute with.
  json denormal = ExpectError(
      Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","top_p":1e-320})"), 400, "top_p");
  EXPECT_EQ(denormal["error"]["type"], "invalid_request_error");
  ExpectError(Post("/v1/chat/completions",
                   R"({"model":"tiny-moe","messages":[{"role":"user","content":"x"}],)"
                   R"("temperature":1e-320})"),
              400, "temperature");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","n":17})"), 400, "n");
  ExpectError(
      Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","stop":["a","b","c","d","e"]})"),
      400, "stop");
  ExpectError(Post("/v1/completions",
                   R"({"model":"tiny-moe","prompt":"x","stream_options":{"include_usage":true}})"),
              400, "stream_options");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":[1,2,999999]})"), 400,
              "prompt");
  ExpectHealthy();
}

TEST_F(RouterHttpTest, UnknownModel) {
  json j = ExpectError(Post("/v1/completions", R"({"model":"gpt-9","prompt":"x"})"), 404, "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  ExpectError(Post("/v1/completions", R"({"prompt":"x"})"), 400, "model");
  ExpectHealthy();
}

TEST_F(RouterHttpTest, InvalidUtf8) {
  std::string body = "{\"model\":\"tiny-moe\",\"prompt\":\"ab\xff\xfe cd\"}";
  json j = ExpectError(Post("/v1/completions", body), 400);
  EXPECT_EQ(j["error"]["code"], "invalid_utf8");
  // Overlong encoding and a lone surrogate escape.
  ExpectError(Post("/v1/completions", "{\"model\":\"tiny-moe\",\"prompt\":\"\xc0\xaf\"}"), 400);
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"\udc00"})"), 400);
  ExpectHealthy();
}

TEST_F(RouterHttpTest, EmptyPrompt) {
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":""})"), 400, "prompt");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":[]})"), 400, "prompt");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":[""]})"), 400, "prompt");
  ExpectError(Post("/v1/chat/completions", R"({"model":"tiny-moe","messages":[]})"), 400,
              "messages");
  ExpectHealthy();
}

TEST_F(RouterHttpTest, PromptOverTheContext) {
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "word" + std::to_string(i) + " ";
  json j = ExpectError(
      Post("/v1/completions", json{{"model", "tiny-moe"}, {"prompt", long_prompt}}.dump()), 400,
      "prompt");
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
  // Prompt fits, prompt + max_tokens does not (context 64).
  j = ExpectError(
      Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hello","max_tokens":64})"), 400,
      "max_tokens");
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
  // Without max_tokens the completion is capped by the context instead.
  auto r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hello"})");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["usage"]["total_tokens"], 64);
  ExpectHealthy();
}

TEST_F(RouterHttpTest, TenMegabyteBodyGets413) {
  std::string body = "{\"model\":\"tiny-moe\",\"prompt\":\"" + std::string(10 << 20, 'a') + "\"}";
  TestConnection c(server_->port());
  // The server answers as soon as it sees Content-Length; the client may still be sending.
  std::thread sender([&] { c.Send(PostRequest("/v1/completions", body)); });
  auto r = c.Read(20000);
  sender.join();
  ASSERT_TRUE(r.has_value());
  json j = ExpectError(*r, 413);
  EXPECT_EQ(j["error"]["code"], "body_too_large");
  EXPECT_EQ(r->headers["connection"], "close");
  ExpectHealthy();
}

TEST_F(RouterHttpTest, ChunkedBodyOverTheLimitGets413) {
  TestConnection c(server_->port());
  std::string chunk(64 * 1024, 'a');
  std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  std::thread sender([&] {
    if (!c.Send(head)) return;
    char size_line[32];
    std::snprintf(size_line, sizeof(size_line), "%zx\r\n", chunk.size());
    for (int i = 0; i < 40; ++i) {
      if (!c.Send(size_line + chunk + "\r\n")) return;
    }
  });
  auto r = c.Read(20000);
  sender.join();
  ASSERT_TRUE(r.has_value());
  ExpectError(*r, 413);
  ExpectHealthy();
}

TEST_F(RouterHttpTest, UnfinishedHeadersAreClosed) {
  TestConnection c(server_->port());
  ASSERT_TRUE(c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(c.WaitClosed(5000)) << "the server kept a half-sent request open";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  // A connection that sends nothing at all is not closed by the header timeout (idle timeout is
  // longer), and is still served afterwards.
  TestConnection idle(server_->port());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  ASSERT_TRUE(idle.Send(GetRequest("/health")));
  auto r = idle.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  ExpectHealthy();
}

TEST_F(RouterHttpTest, GarbageRequestLine) {
  TestConnection c(server_->port());
  ASSERT_TRUE(c.Send("HELLO\x01\x02 WORLD\r\n\r\n"));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value());
  ExpectError(*r, 400);
  EXPECT_TRUE(c.WaitClosed(3000));
  ExpectHealthy();
}

TEST_F(RouterHttpTest, HugeHeadersGet431) {
  TestConnection c(server_->port());
  ASSERT_TRUE(c.Send("GET /health HTTP/1.1\r\nX-Big: " + std::string(64 * 1024, 'b') + "\r\n\r\n"));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value());
  ExpectError(*r, 431);
  ExpectHealthy();
}

// ---- HTTP conformance (RFC 9112)

// An HTTP/1.0 client cannot read chunked encoding: a stream to it is close-delimited.
TEST_F(RouterHttpTest, Http10StreamIsCloseDelimitedNotChunked) {
  const std::string body =
      R"({"model":"tiny-moe","prompt":"Hello","max_tokens":20,"stream":true})";
  TestConnection c(server_->port());
  ASSERT_TRUE(c.Send("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                     "Connection: keep-alive\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body));
  auto raw = c.ReadToClose(10000);
  ASSERT_TRUE(raw.has_value()) << "the stream did not end by closing the connection";
  const size_t head_end = raw->find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << *raw;
  std::string head = raw->substr(0, head_end);
  for (auto& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  EXPECT_EQ(head.rfind("http/1.1 200", 0), 0u) << head;
  EXPECT_EQ(head.find("transfer-encoding"), std::string::npos) << head;
  EXPECT_EQ(head.find("content-length"), std::string::npos) << head;
  EXPECT_NE(head.find("connection: close"), std::string::npos) << head;
  auto events = SseEvents(raw->substr(head_end + 4));  // the bytes as sent, no chunk framing
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    text += json::parse(events[i])["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, Decode(20));
  // HTTP/1.0 needs no Host; a complete response still has its Content-Length.
  TestConnection h(server_->port());
  ASSERT_TRUE(h.Send("GET /health HTTP/1.0\r\n\r\n"));
  auto r = h.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["connection"], "close");
  EXPECT_TRUE(h.WaitClosed(3000));
  ExpectHealthy();
}

TEST_F(RouterHttpTest, Http11WithoutHostOrWithTwoHostsGets400) {
  for (const std::string req : {"GET /health HTTP/1.1\r\n\r\n",
                                "GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                                "POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"}) {
    SCOPED_TRACE(req);
    TestConnection c(server_->port());
    ASSERT_TRUE(c.Send(req));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value());
    json j = ExpectError(*r, 400);
    EXPECT_EQ(j["error"]["code"], "bad_http");
    EXPECT_EQ(r->headers["connection"], "close");
    EXPECT_TRUE(c.WaitClosed(3000));
  }
  ExpectHealthy();
}

TEST_F(RouterHttpTest, SecondLineOfASingleValuedHeaderGets400) {
  // RFC 9110 section 5.3: only list-valued fields may repeat. A second Authorization (or
  // Content-Type, Content-Length, Host) is refused, not resolved by taking the first.
  const std::string body = R"({"model":"tiny-moe","prompt":"Hi","max_tokens":2})";
  const std::string n = std::to_string(body.size());
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  const std::string ct = "Content-Type: application/json\r\n";
  const std::string cl = "Content-Length: " + n + "\r\n";
  char size_hex[16];
  std::snprintf(size_hex, sizeof(size_hex), "%zx", body.size());
  const std::string chunked_body = std::string(size_hex) + "\r\n" + body + "\r\n0\r\n\r\n";
  const std::pair<std::string, std::string> cases[] = {
      {"Authorization",
       head + ct + cl + "Authorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n" + body},
      {"Authorization",
       head + ct + cl + "Authorization: Bearer a\r\nauthorization: Bearer a\r\n\r\n" + body},
      {"Content-Type", head + ct + ct + cl + "\r\n" + body},
      {"Content-Length", head + ct + cl + cl + "\r\n" + body},  // equal values: still two
      {"Content-Length", head + ct + "Content-Length: " + n + ", " + n + "\r\n\r\n" + body},
      {"Host", "GET /health HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n"},
      // RFC 9112 section 6.3: chunked not final (or twice): the body's length is unknown.
      {"Transfer-Encoding",
       head + ct + "Transfer-Encoding: chunked, chunked\r\n\r\n" + chunked_body},
      {"Transfer-Encoding", head + ct + "Transfer-Encoding: gzip\r\n\r\n" + body},
  };
  for (const auto& [field, req] : cases) {
    SCOPED_TRACE(req);
    TestConnection c(server_->port());
    ASSERT_TRUE(c.Send(req));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value());
    json j = ExpectError(*r, 400);
    EXPECT_EQ(j["error"]["code"], "bad_http");
    EXPECT_NE(j["error"]["message"].get<std::string>().find(field), std::string::npos) << r->body;
    EXPECT_EQ(r->headers["connection"], "close");
    EXPECT_TRUE(c.WaitClosed(3000));
  }
  // List-valued fields may repeat; one Content-Length, one chunked coding are served.
  for (const std::string& req :
       {head + ct + cl + "Connection: keep-alive\r\nConnection: keep-alive\r\n" +
            "Accept: application/json\r\nAccept: */*\r\n\r\n" + body,
        head + ct + "Transfer-Encoding: chunked\r\n\r\n" + chunked_body}) {
    SCOPED_TRACE(req);
    TestConnection c(server_->port());
    ASSERT_TRUE(c.Send(req));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200) << r->body;
  }
  ExpectHealthy();
}

TEST_F(RouterHttpTest, BodyShortOfContentLengthGets408AfterTheBodyTimeout) {
  Teardown();
  HttpServerOptions ho;
  ho.body_timeout = std::chrono::milliseconds(300);
  Build(RouterOptions{}, ho);
  TestConnection c(server_->port());
  ASSERT_TRUE(c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     "application/json\r\nContent-Length: 100\r\n\r\n{\"model\":"));
  const auto t0 = std::chrono::steady_clock::now();
  auto r = c.Read(5000);
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(r.has_value()) << "no answer to a body that stopped short";
  json j = ExpectError(*r, 408);
  EXPECT_EQ(j["error"]["code"], "request_timeout");
  EXPECT_EQ(r->headers["connection"], "close");
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::seconds(3));
  EXPECT_TRUE(c.WaitClosed(3000));
  EXPECT_TRUE(WaitFor([&] { return router_in_flight() == 0; }));
  ExpectHealthy();
}

// ---- admission, cancellation, timeouts, drain

TEST_F(RouterHttpTest, FullQueueGets429WithRetryAfter) {
  Teardown();
  RouterOptions ro;
  ro.max_waiting = 2;
  Build(ro, HttpServerOptions{});
  backend_->SetCapacity(0);  // nothing runs: requests wait
  TestConnection a(server_->port()), b(server_->port());
  const std::string req = PostRequest("/v1/completions", R"({"model":"tiny-moe","prompt":"x"})");
  ASSERT_TRUE(a.Send(req) && b.Send(req));
  ASSERT_TRUE(WaitFor([&] { return router_in_flight() == 2; }));
  auto r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x"})");
  json j = ExpectError(r, 429);
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_EQ(j["error"]["type"], "rate_limit_error");
  // Capacity comes back: the waiting requests run and complete.
  backend_->SetCapacity(8);
  auto ra = a.Read(), rb = b.Read();
  ASSERT_TRUE(ra && rb);
  EXPECT_EQ(ra->status, 200);
  EXPECT_EQ(rb->status, 200);
}

// Admission by decode KV (kv_admission.h): 6 blocks of 4 tokens; a 4-token prompt with
// max_tokens 12 needs 4 of them by its end.
TEST_F(RouterHttpTest, KvAdmissionWaitsForTheKvAnd429sBeyondTheQueueBound) {
  Teardown();
  RouterOptions ro;
  ro.max_queued_kv = 1.0;  // at most 6 blocks may wait
  Build(ro, HttpServerOptions{});
  backend_->SetKv(6, 4);
  backend_->SetPaused(true);
  const std::string req = PostRequest(
      "/v1/completions", R"({"model":"tiny-moe","prompt":[1,2,3,4],"max_tokens":12})");
  TestConnection a(server_->port()), b(server_->port());
  ASSERT_TRUE(a.Send(req));
  ASSERT_TRUE(WaitFor([&] { return backend_->submitted().size() == 1; }));
  // 4 committed + 4 > 6: the second waits at the router, not at the backend.
  ASSERT_TRUE(b.Send(req));
  ASSERT_TRUE(WaitFor([&] { return router_in_flight() == 2; }));
  EXPECT_EQ(backend_->submitted().size(), 1u);
  // 4 waiting + 4 > 6: the third is turned away, with when to come back.
  auto r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":[1,2,3,4],"max_tokens":12})");
  json j = ExpectError(r, 429);
  EXPECT_EQ(j["error"]["code"], "kv_queue_full");
  EXPECT_EQ(j["error"]["type"], "rate_limit_error");
  EXPECT_EQ(r.headers["retry-after"], "1");
  // n = 2 counts both candidates: 4 waiting + 2 * 3 > 6.
  r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":[1,2,3,4],"max_tokens":8,"n":2})");
  EXPECT_EQ(ExpectError(r, 429)["error"]["code"], "kv_queue_full");
  // One sequence needing more than a worker holds can never run: a clear 400, not a 429.
  r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":[1,2,3,4],"max_tokens":21})");
  j = ExpectError(r, 400);
  EXPECT_EQ(j["error"]["code"], "kv_capacity_exceeded");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_EQ(backend_->submitted().size(), 1u);
  // The first ends, its KV comes back: the second runs; both complete.
  backend_->SetPaused(false);
  auto ra = a.Read(), rb = b.Read();
  ASSERT_TRUE(ra && rb);
  EXPECT_EQ(ra->status, 200);
  EXPECT_EQ(rb->status, 200);
  EXPECT_EQ(backend_->submitted().size(), 2u);
  // Nothing waits now: a call bigger than the queue bound (2 * 4 > 6), each of its candidates
  // fitting a worker, is queued and runs its candidates as KV frees, never refused forever.
  r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":[1,2,3,4],"max_tokens":12,"n":2})");
  EXPECT_EQ(r.status, 200) << r.body;
  ExpectHealthy();
}

TEST_F(RouterHttpTest, ClientDisconnectCancelsTheRequest) {
  backend_->SetPaused(true);
  {
    TestConnection c(server_->port());
    ASSERT_TRUE(c.Send(PostRequest(
        "/v1/completions", R"({"model":"tiny-moe","prompt":"x","max_tokens":50,"stream":true})")));
    ASSERT_TRUE(WaitFor([&] { return backend_->active() == 1; }));
  }  // closes the socket mid-stream
  ASSERT_TRUE(WaitFor([&] { return backend_->cancelled().size() == 1; }));
  EXPECT_EQ(backend_->active(), 0u);
  EXPECT_TRUE(WaitFor([&] { return router_in_flight() == 0; }));
  // A waiting (not yet submitted) request is dropped from the queue the same way.
  backend_->SetCapacity(0);
  {
    TestConnection c(server_->port());
    ASSERT_TRUE(c.Send(PostRequest("/v1/completions", R"({"model":"tiny-moe","prompt":"x"})")));
    ASSERT_TRUE(WaitFor([&] { return router_in_flight() == 1; }));
  }
  EXPECT_TRUE(WaitFor([&] { return router_in_flight() == 0; }));
  backend_->SetCapacity(8);
  backend_->SetPaused(false);
  ExpectHealthy();
}

TEST_F(RouterHttpTest, RequestTimeout) {
  Teardown();
  RouterOptions ro;
  ro.request_timeout = std::chrono::milliseconds(300);
  Build(ro, HttpServerOptions{});
  backend_->SetPaused(true);
  auto r = Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","max_tokens":5})");
  json j = ExpectError(r, 504);
  EXPECT_EQ(j["error"]["code"], "timeout");
  EXPECT_EQ(backend_->cancelled().size(), 1u);
  // Streaming: the error arrives as an event, then [DONE].
  auto s =
      Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x","max_tokens":5,"stream":true})");
  ASSERT_EQ(s.status, 200);
  auto events = SseEvents(s.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_TRUE(json::parse(events[events.size() - 2]).contains("error"));
  backend_->SetPaused(false);
}

TEST_F(RouterHttpTest, BackendWithoutWorkersAnswers503) {
  backend_->SetFailSubmits(true);
  json j = ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x"})"), 503);
  EXPECT_EQ(j["error"]["type"], "server_error");
  backend_->SetFailSubmits(false);
  backend_->SetCapacity(0);
  auto health = Call(GetRequest("/health"));
  EXPECT_EQ(health.status, 503);
  json h = json::parse(health.body);
  EXPECT_EQ(h["status"], "no_workers");
  EXPECT_EQ(h["missing"], json::array({"prefill", "decode"}));
}

TEST_F(RouterHttpTest, DrainRefusesNewWorkAndFinishesInFlight) {
  backend_->SetPaused(true);
  TestConnection inflight(server_->port());
  ASSERT_TRUE(inflight.Send(
      PostRequest("/v1/completions", R"({"model":"tiny-moe","prompt":"x","max_tokens":4})")));
  ASSERT_TRUE(WaitFor([&] { return backend_->active() == 1; }));
  std::promise<void> drained;
  auto done = drained.get_future();
  server_->Post([&] { router_->BeginDrain([&] { drained.set_value(); }); });
  json j = ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"x"})"), 503);
  EXPECT_EQ(j["error"]["code"], "draining");
  EXPECT_EQ(Call(GetRequest("/health")).status, 503);
  EXPECT_EQ(done.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  backend_->SetPaused(false);
  auto r = inflight.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 4);
  EXPECT_EQ(done.wait_for(std::chrono::seconds(5)), std::future_status::ready);
}

TEST_F(RouterHttpTest, IdleConnectionsCostNoThreads) {
  const int before = ThreadCount();
  std::vector<std::unique_ptr<TestConnection>> idle;
  for (int i = 0; i < 500; ++i) {
    idle.push_back(std::make_unique<TestConnection>(server_->port()));
    ASSERT_TRUE(idle.back()->ok());
  }
  ASSERT_TRUE(WaitFor([&] { return server_->connections() >= 500; }));
  EXPECT_EQ(ThreadCount(), before);
  ExpectHealthy();
}

// ---- logprobs, echo, n, best_of, API keys, tokenizer endpoints ----

// Index of the character (code point) holding byte `pos` of the UTF-8 text `text`.
int64_t CharIndexOfByte(const std::string& text, size_t pos) {
  int64_t index = -1;
  for (size_t i = 0; i < text.size() && i <= pos; ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) ++index;
  }
  return pos >= text.size() ? index + 1 : index;
}

// Checks a legacy logprobs object against the ids it should describe: token strings, the
// scripted log-probabilities (the first `no_logprob` entries have none) and text offsets into
// `text` (the bytes of ids, in order, before `text_bytes_before`).
void ExpectLegacyLogprobs(const json& lp, const TextCodec& codec, const std::vector<int32_t>& ids,
                          const std::vector<float>& logprobs, const std::string& text, int top_n) {
  ASSERT_TRUE(lp.is_object()) << lp.dump();
  ASSERT_EQ(lp["tokens"].size(), ids.size()) << lp.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size());
  ASSERT_EQ(lp["top_logprobs"].size(), ids.size());
  ASSERT_EQ(lp["text_offset"].size(), ids.size());
  size_t byte_pos = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string bytes = codec.TokenBytes(ids[i]);
    EXPECT_EQ(lp["tokens"][i], TokenString(bytes)) << i;
    if (std::isnan(logprobs[i])) {
      EXPECT_TRUE(lp["token_logprobs"][i].is_null()) << i;
      EXPECT_TRUE(lp["top_logprobs"][i].is_null()) << i;
    } else {
      EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), logprobs[i]) << i;
      const json& top = lp["top_logprobs"][i];
      EXPECT_TRUE(top.contains(TokenString(bytes))) << i << " " << top.dump();
      EXPECT_LE(top.size(), static_cast<size_t>(std::max(top_n, 1)) + 1) << top.dump();
    }
    EXPECT_EQ(lp["text_offset"][i], CharIndexOfByte(text, byte_pos))
        << "token " << i << " at byte " << byte_pos << " of " << text;
    byte_pos += bytes.size();
  }
}

// Prompt with characters the byte-level tokenizer splits over several tokens.
constexpr const char* kSplitPrompt = "Runes \xe1\x9a\xa0\xe1\x9a\xa2 and \xf0\x9d\x94\x98 end";

TEST_F(RouterHttpTest, CompletionLogprobsHaveTheLegacyShapeAndExactOffsets) {
  auto r =
      Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","max_tokens":30,"logprobs":2})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  const std::string text = j["choices"][0]["text"];
  EXPECT_EQ(text, Decode(30));
  std::vector<int32_t> ids(script_.begin(), script_.begin() + 30);
  std::vector<float> lps;
  for (size_t i = 0; i < ids.size(); ++i)
    lps.push_back(testing::ScriptedLogprob(ids[i], i, 2).logprob);
  ExpectLegacyLogprobs(j["choices"][0]["logprobs"], *codec_, ids, lps, text, 2);
  auto sub = backend_->submitted();
  ASSERT_EQ(sub.size(), 1u);
  EXPECT_EQ(sub[0].sampling.logprobs, 2);
  EXPECT_EQ(sub[0].sampling.prompt_logprobs, -1);
  // Without logprobs the field is null.
  auto plain = json::parse(
      Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","max_tokens":2})").body);
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
}

TEST_F(RouterHttpTest, StreamedLogprobsEqualTheFullResponse) {
  const std::string req = R"({"model":"tiny-moe","prompt":"Hi","max_tokens":30,"logprobs":1)";
  json full = json::parse(Post("/v1/completions", req + "}").body)["choices"][0]["logprobs"];
  auto r = Post("/v1/completions", req + R"(,"stream":true})");
  ASSERT_EQ(r.status, 200);
  auto events = SseEvents(r.body);
  json merged = {{"tokens", json::array()},
                 {"token_logprobs", json::array()},
                 {"top_logprobs", json::array()},
                 {"text_offset", json::array()}};
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i])["choices"][0];
    if (c["logprobs"].is_null()) continue;
    for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      for (const auto& v : c["logprobs"][k]) merged[k].push_back(v);
    }
  }
  EXPECT_EQ(merged, full);
}

TEST_F(RouterHttpTest, EchoWithMaxTokensZeroGivesThePromptLogLikelihood) {
  auto prompt = codec_->Encode(kSplitPrompt);
  ASSERT_TRUE(prompt.ok());
  bool splits = false;
  for (int32_t id : *prompt) splits |= !IsValidUtf8(codec_->TokenBytes(id));
  ASSERT_TRUE(splits) << "the prompt should hold a token that splits a character";
  auto r = Post("/v1/completions", std::string(R"({"model":"tiny-moe","prompt":")") + kSplitPrompt +
                                       R"(","max_tokens":0,"echo":true,"logprobs":1})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], kSplitPrompt);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt->size());
  std::vector<float> lps = {std::nanf("")};
  for (size_t i = 1; i < prompt->size(); ++i) {
    lps.push_back(testing::ScriptedLogprob((*prompt)[i], i, 1).logprob);
  }
  ExpectLegacyLogprobs(j["choices"][0]["logprobs"], *codec_, *prompt, lps, kSplitPrompt, 1);
  auto sub = backend_->submitted();
  ASSERT_EQ(sub.size(), 1u);
  EXPECT_EQ(sub[0].sampling.prompt_logprobs, 1);
  EXPECT_EQ(sub[0].sampling.max_tokens, 1);  // one token is computed, not shown
}

TEST_F(RouterHttpTest, EchoWithGenerationContinuesTheOffsets) {
  auto prompt = codec_->Encode(kSplitPrompt);
  const std::string body = std::string(R"({"model":"tiny-moe","prompt":")") + kSplitPrompt +
                           R"(","max_tokens":25,"echo":true,"logprobs":0)";
  json j = json::parse(Post("/v1/completions", body + "}").body);
  const std::string text = j["choices"][0]["text"];
  EXPECT_EQ(text, std::string(kSplitPrompt) + Decode(25));
  std::vector<int32_t> ids = *prompt;
  std::vector<float> lps = {std::nanf("")};
  for (size_t i = 1; i < prompt->size(); ++i) {
    lps.push_back(testing::ScriptedLogprob((*prompt)[i], i, 0).logprob);
  }
  for (size_t i = 0; i < 25; ++i) {
    ids.push_back(script_[i]);
    lps.push_back(testing::ScriptedLogprob(script_[i], i, 0).logprob);
  }
  ExpectLegacyLogprobs(j["choices"][0]["logprobs"], *codec_, ids, lps, text, 0);
  // Streamed: the prompt comes first, then the generated text.
  auto r = Post("/v1/completions", body + R"(,"stream":true})");
  auto events = SseEvents(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(json::parse(events[0])["choices"][0]["text"], kSplitPrompt);
  std::string streamed;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    streamed += json::parse(events[i])["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, text);
  // Echo without logprobs: the text only.
  json plain = json::parse(
      Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","max_tokens":3,"echo":true})")
          .body);
  EXPECT_EQ(plain["choices"][0]["text"], "Hi" + Decode(3));
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
}

TEST_F(RouterHttpTest, EchoWithAPromptTooLongIsRefused) {
  std::string prompt;
  for (int i = 0; i < 80; ++i) prompt += " word";
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":")" + prompt +
                                          R"(","max_tokens":0,"echo":true,"logprobs":1})"),
              400, "prompt");
  ExpectError(
      Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","max_tokens":0,"logprobs":1})"),
      400, "max_tokens");
  ExpectHealthy();
}

TEST_F(RouterHttpTest, ChatLogprobsHaveTheChatShape) {
  const std::string req =
      R"({"model":"tiny-moe","messages":[{"role":"user","content":"Hi"}],"max_tokens":12,
          "logprobs":true,"top_logprobs":3)";
  auto r = Post("/v1/chat/completions", req + "}");
  ASSERT_EQ(r.status, 200) << r.body;
  json lp = json::parse(r.body)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["content"].size(), 12u) << lp.dump();
  EXPECT_TRUE(lp["refusal"].is_null());
  for (size_t i = 0; i < 12; ++i) {
    const json& e = lp["content"][i];
    const std::string bytes = codec_->TokenBytes(script_[i]);
    EXPECT_EQ(e["token"], TokenString(bytes));
    EXPECT_FLOAT_EQ(e["logprob"].get<float>(), testing::ScriptedLogprob(script_[i], i, 3).logprob);
    ASSERT_EQ(e["bytes"].size(), bytes.size());
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], TokenString(bytes));
  }
  // Streamed: the chunks' content entries add up to the same list.
  auto s = Post("/v1/chat/completions", req + R"(,"stream":true})");
  json merged = json::array();
  for (const auto& ev : SseEvents(s.body)) {
    if (ev == "[DONE]") continue;
    json c = json::parse(ev)["choices"][0];
    if (!c["logprobs"].is_null()) {
      for (const auto& e : c["logprobs"]["content"]) merged.push_back(e);
    }
  }
  EXPECT_EQ(merged, lp["content"]);
}

TEST_F(RouterHttpTest, NChoicesAreIndependentCandidates) {
  auto r = Post("/v1/completions",
                R"({"model":"tiny-moe","prompt":"Hi","max_tokens":5,"n":3,"seed":7})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], Decode(5));
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 15);
  EXPECT_EQ(j["usage"]["prompt_tokens"], codec_->Encode("Hi")->size());
  auto sub = backend_->submitted();
  ASSERT_EQ(sub.size(), 3u);
  std::set<uint64_t> seeds;
  for (const auto& g : sub) {
    EXPECT_TRUE(g.sampling.has_seed);
    seeds.insert(g.sampling.seed);
  }
  EXPECT_EQ(seeds, (std::set<uint64_t>{7, 8, 9}));
  // Chat, streamed: every choice gets its role chunk, text and finish chunk; one [DONE].
  auto s = Post("/v1/chat/completions",
                R"({"model":"tiny-moe","messages":[{"role":"user","content":"Hi"}],"max_tokens":4,
                    "n":2,"stream":true})");
  auto events = SseEvents(s.body);
  EXPECT_EQ(std::count(events.begin(), events.end(), "[DONE]"), 1);
  std::map<int, std::string> text;
  std::map<int, int> roles, finishes;
  for (const auto& ev : events) {
    if (ev == "[DONE]") continue;
    json c = json::parse(ev)["choices"][0];
    int idx = c["index"];
    if (c["delta"].contains("role")) ++roles[idx];
    if (c["delta"].contains("content")) text[idx] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++finishes[idx];
  }
  EXPECT_EQ(roles, (std::map<int, int>{{0, 1}, {1, 1}}));
  EXPECT_EQ(finishes, (std::map<int, int>{{0, 1}, {1, 1}}));
  EXPECT_EQ(text[0], text[1]);
}

TEST_F(RouterHttpTest, BestOfScoresCandidatesAndReturnsN) {
  auto r = Post("/v1/completions",
                R"({"model":"tiny-moe","prompt":"Hi","max_tokens":4,"n":2,"best_of":3})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());  // not asked for
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);      // every candidate's tokens
  auto sub = backend_->submitted();
  ASSERT_EQ(sub.size(), 3u);
  for (const auto& g : sub) EXPECT_EQ(g.sampling.logprobs, 0);  // scored internally
  ExpectError(Post("/v1/completions",
                   R"({"model":"tiny-moe","prompt":"Hi","n":2,"best_of":3,"stream":true})"),
              400, "best_of");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","n":0})"), 400, "n");
  ExpectError(Post("/v1/completions", R"({"model":"tiny-moe","prompt":"Hi","n":17})"), 400, "n");
  ExpectHealthy();
}

TEST_F(RouterHttpTest, DisconnectCancelsEveryCandidate) {
  backend_->SetPaused(true);
  {
    TestConnection c(server_->port());
    ASSERT_TRUE(c.Send(PostRequest("/v1/completions",
                                   R"({"model":"tiny-moe","prompt":"Hi","max_tokens":5,"n":3})")));
    ASSERT_TRUE(WaitFor([&] { return backend_->submitted().size() == 3; }));
  }
  EXPECT_TRUE(WaitFor([&] { return backend_->cancelled().size() == 3; }));
  EXPECT_TRUE(WaitFor([&] { return router_in_flight() == 0; }));
  backend_->SetPaused(false);
  ExpectHealthy();
}

TEST_F(RouterHttpTest, ApiKeysGuardTheApi) {
  Teardown();
  RouterOptions ro;
  ro.api_keys = {"sk-first", "sk-second"};
  Build(ro, HttpServerOptions{});
  const std::string body = R"({"model":"tiny-moe","prompt":"Hi","max_tokens":2})";
  auto missing = Post("/v1/completions", body);
  json e = ExpectError(missing, 401);
  EXPECT_EQ(e["error"]["code"], "invalid_api_key");
  EXPECT_EQ(missing.headers["www-authenticate"], "Bearer");
  auto wrong = Call(PostRequest("/v1/completions", body, "Authorization: Bearer sk-wrong-key\r\n"));
  ExpectError(wrong, 401);
  EXPECT_EQ(wrong.body.find("sk-wrong-key"), std::string::npos);  // never repeated
  ExpectError(Call(PostRequest("/v1/completions", body, "Authorization: Basic sk-first\r\n")), 401);
  ExpectError(Call(PostRequest("/v1/completions", body, "Authorization: Bearer sk-firs\r\n")), 401);
  for (const char* key : {"sk-first", "sk-second"}) {
    auto ok = Call(
        PostRequest("/v1/completions", body, std::string("Authorization: Bearer ") + key + "\r\n"));
    EXPECT_EQ(ok.status, 200) << ok.body;
  }
  EXPECT_EQ(
      Call(PostRequest("/v1/completions", body, "authorization: bearer  sk-first \r\n")).status,
      200);
  ExpectError(Call(GetRequest("/v1/models")), 401);
  ExpectError(Post("/tokenize", R"({"prompt":"Hi"})"), 401);
  EXPECT_EQ(Call(GetRequest("/health")).status, 200);  // open by default
  EXPECT_EQ(Call(GetRequest("/metrics")).status, 200);

  Teardown();
  ro.protect_health = true;
  ro.protect_metrics = true;
  Build(ro, HttpServerOptions{});
  ExpectError(Call(GetRequest("/health")), 401);
  ExpectError(Call(GetRequest("/metrics")), 401);
  auto h =
      Call("GET /health HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer sk-second\r\n\r\n");
  EXPECT_EQ(h.status, 200);
  auto m =
      Call("GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer sk-first\r\n\r\n");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("reason=\"unauthorized\""), std::string::npos);
  EXPECT_EQ(m.body.find("sk-"), std::string::npos);
}

TEST_F(RouterHttpTest, TokenizerEndpoints) {
  auto t = Post("/tokenize", R"({"prompt":"Hello there","add_special_tokens":false})");
  ASSERT_EQ(t.status, 200) << t.body;
  json tj = json::parse(t.body);
  EXPECT_EQ(tj["tokens"].get<std::vector<int32_t>>(), *codec_->Encode("Hello there"));
  EXPECT_EQ(tj["count"], tj["tokens"].size());
  EXPECT_EQ(tj["max_model_len"], 64);
  auto d = Post("/detokenize", json{{"tokens", tj["tokens"]}}.dump());
  ASSERT_EQ(d.status, 200);
  EXPECT_EQ(json::parse(d.body)["prompt"], "Hello there");
  auto info = Call(GetRequest("/tokenizer_info"));
  ASSERT_EQ(info.status, 200);
  json ij = json::parse(info.body);
  EXPECT_EQ(ij["eos_token"], tokenizer_->eos_token());
  ExpectError(Post("/detokenize", R"({"tokens":[1,-1]})"), 400, "tokens");
  ExpectError(Post("/tokenize", R"({"prompt":5})"), 400, "prompt");
  ExpectError(Call(GetRequest("/tokenize")), 405);
  // A batch of one token list, as evaluation harnesses send it.
  json batch = {{"model", "tiny-moe"}, {"prompt", json::array({tj["tokens"]})}, {"max_tokens", 2}};
  EXPECT_EQ(Post("/v1/completions", batch.dump()).status, 200);
}

// /tokenize with messages gives HF's apply_chat_template(..., tokenize=True) ids
// (tests/fixtures/chat_tokenize_cases.json, tools/gen_chat_template_real_cases.py), as vLLM's:
// under the embedded model's template and under real ones (Qwen2.5, Qwen3, Kimi-K2).
TEST_F(RouterHttpTest, TokenizeMessagesIsHfApplyChatTemplate) {
  using ojson = nlohmann::ordered_json;
  std::ifstream in(PW_SOURCE_DIR "/tests/fixtures/chat_tokenize_cases.json");
  ASSERT_TRUE(in.good());
  const ojson fixture = ojson::parse(in);
  ASSERT_EQ(fixture["model_dir"], "models/tiny-moe");
  size_t ok = 0, refused = 0, joined = 0;
  std::set<std::string> real;  // the real templates the cases were checked under
  // Cases under the model's own template (template null), then under real ones, each given to
  // the router as the checkpoint's chat_template.jinja.
  const std::string dir = ::testing::TempDir() + "/tokenize_real_" + std::to_string(getpid());
  std::string built_for;
  bool takes_parts = false;  // the embedded model's ChatML template adds content to a string
  for (const ojson& c : fixture["cases"]) {
    const std::string name = c["template"].is_null() ? "" : c["template"].get<std::string>();
    if (name != built_for) {
      std::filesystem::create_directories(dir);
      std::filesystem::copy_file(PW_SOURCE_DIR "/tests/fixtures/chat_templates/" + name + ".jinja",
                                 dir + "/chat_template.jinja", std::filesystem::copy_options::overwrite_existing);
      Teardown();
      chat_template_dir_ = dir;
      Build(RouterOptions{}, HttpServerOptions{});
      built_for = name;
      real.insert(name);
      std::ifstream src_in(dir + "/chat_template.jinja");
      takes_parts = ChatTemplateTakesContentParts(
          std::string((std::istreambuf_iterator<char>(src_in)), std::istreambuf_iterator<char>()));
    }
    SCOPED_TRACE(name.empty() ? "the model's own template" : name);
    const std::string request = c["request"].dump();
    auto r = Post("/tokenize", request);
    bool parts = false;
    for (const ojson& m : c["request"]["messages"]) parts = parts || (m.contains("content") && m["content"].is_array());
    if (c.contains("error") && parts && !takes_parts) {
      // HF raised on a list of parts a template adds to a string (the embedded ChatML one,
      // Qwen2.5's); the router joins the texts into one string first (vLLM's "string" content
      // format), so it renders.
      ASSERT_EQ(r.status, 200) << request << ": " << r.body;
      ++joined;
      continue;
    }
    if (c.contains("error")) {  // HF raised: a 400 naming the template's complaint
      ExpectError(r, 400, "messages");
      EXPECT_NE(r.body.find("cannot apply the chat template"), std::string::npos) << r.body;
      ++refused;
      continue;
    }
    ASSERT_EQ(r.status, 200) << request << ": " << r.body;
    json j = json::parse(r.body);
    EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), c["tokens"].get<std::vector<int32_t>>())
        << request;
    EXPECT_EQ(j["count"], c["tokens"].size());
    EXPECT_EQ(j["max_model_len"], 64);
    ++ok;
  }
  EXPECT_GE(ok, 40u);
  EXPECT_GE(real.size(), 3u);
  // The fixture's refusals by HF are all lists of parts for templates that add content to a
  // string, which the router joins (above); a refusal of another kind would still be a 400.
  EXPECT_GE(joined + refused, 1u);
  std::filesystem::remove_all(dir);
  Teardown();
  chat_template_dir_.clear();
  Build(RouterOptions{}, HttpServerOptions{});
  // Text parts for a template that does not take them are the texts joined by "\n".
  auto as_parts = Post("/tokenize", R"({"messages":[{"role":"user","content":[{"type":"text","text":"Hello"},{"type":"text","text":"world"}]}]})");
  auto as_string = Post("/tokenize", R"({"messages":[{"role":"user","content":"Hello\nworld"}]})");
  ASSERT_EQ(as_parts.status, 200) << as_parts.body;
  ASSERT_EQ(as_string.status, 200) << as_string.body;
  EXPECT_EQ(json::parse(as_parts.body)["tokens"], json::parse(as_string.body)["tokens"]);
  // add_generation_prompt defaults to true, as in vLLM.
  auto with = Post("/tokenize", R"({"messages":[{"role":"user","content":"Hi"}]})");
  auto explicit_gen = Post(
      "/tokenize", R"({"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":true})");
  ASSERT_EQ(with.status, 200);
  EXPECT_EQ(json::parse(with.body)["tokens"], json::parse(explicit_gen.body)["tokens"]);
  // Bad requests are refused naming the field.
  ExpectError(Post("/tokenize", R"({"messages":[]})"), 400, "messages");
  ExpectError(Post("/tokenize", R"({"messages":"hi"})"), 400, "messages");
  ExpectError(Post("/tokenize", R"({"messages":[{"content":"x"}]})"), 400, "messages[0].role");
  ExpectError(Post("/tokenize", R"({"messages":[{"role":"user","content":"x"}],"prompt":"y"})"),
              400, "prompt");
  ExpectError(Post("/tokenize",
                   R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":1})"),
              400, "add_generation_prompt");
  ExpectError(Post("/tokenize",
                   R"({"messages":[{"role":"user","content":"x"}],"add_special_tokens":true})"),
              400, "add_special_tokens");
  ExpectError(Post("/tokenize", R"({"messages":[{"role":"user","content":"x"}],)"
                                R"("add_generation_prompt":true,"continue_final_message":true})"),
              400, "continue_final_message");
  ExpectError(Post("/tokenize", R"({"messages":[{"role":"user","content":"x"}],"tools":{}})"),
              400, "tools");
}

// A chat completion renders the whole conversation as HF's apply_chat_template does (and as
// /tokenize with the same fields): content parts, tools, tool_calls, tool_call_id, name,
// reasoning_content, add_generation_prompt, continue_final_message, chat_template_kwargs. Real
// templates with tools and reasoning (tests/fixtures/chat_templates, the ones that use no
// bos/eos token and no clock, since the embedded tokenizer's differ from the fixture's) over
// every case of tests/fixtures/chat_template_real_cases.json (rendered by jinja2 through
// transformers, tools/gen_chat_template_real_cases.py): the prompt the backend receives decodes
// to the expected text byte for byte; a case HF refuses is a 400.
TEST_F(RouterHttpTest, ChatCompletionRendersWholeConversationAsHf) {
  using ojson = nlohmann::ordered_json;
  std::ifstream in(PW_SOURCE_DIR "/tests/fixtures/chat_template_real_cases.json");
  ASSERT_TRUE(in.good());
  const ojson fixture = ojson::parse(in);
  const std::string dir = ::testing::TempDir() + "/chat_whole_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  size_t rendered = 0, refused = 0, with_tools = 0, joined = 0;
  for (const char* name : {"llama.cpp-Qwen-Qwen2.5-7B-Instruct", "llama.cpp-Qwen-Qwen3-0.6B",
                           "llama.cpp-glm_4_5", "llama.cpp-moonshotai-Kimi-K2"}) {
    SCOPED_TRACE(name);
    std::filesystem::copy_file(PW_SOURCE_DIR "/" + fixture["templates"][name].get<std::string>(),
                               dir + "/chat_template.jinja",
                               std::filesystem::copy_options::overwrite_existing);
    std::ifstream template_in(dir + "/chat_template.jinja");
    const std::string source((std::istreambuf_iterator<char>(template_in)), std::istreambuf_iterator<char>());
    Teardown();
    chat_template_dir_ = dir;
    context_length_ = 8192;
    Build(RouterOptions{}, HttpServerOptions{});
    for (const ojson& c : fixture["cases"]) {
      if (c["template"] != name) continue;
      ojson request = {{"model", "tiny-moe"},
                       {"messages", fixture["conversations"][c["conversation"].get<size_t>()]},
                       {"max_tokens", 1},
                       {"add_generation_prompt", c["add_generation_prompt"]},
                       {"continue_final_message", c["continue_final_message"]}};
      if (!c["tools"].is_null()) {
        request["tools"] = fixture["tools"][c["tools"].get<size_t>()];
        ++with_tools;
      }
      if (!c["kwargs"].empty()) request["chat_template_kwargs"] = c["kwargs"];
      const std::string body = request.dump();
      const size_t before = backend_->submitted().size();
      auto r = Post("/v1/chat/completions", body);
      ojson tokenize = request;
      tokenize.erase("model");
      tokenize.erase("max_tokens");
      auto t = Post("/tokenize", tokenize.dump());
      // A template that does not take content parts gets them joined into one string (vLLM's
      // "string" content format; under HF such a template fails or prints the list): the
      // request renders, the same for chat and /tokenize, with every text of the parts.
      bool parts = false;
      for (const ojson& m : request["messages"]) parts = parts || (m.contains("content") && m["content"].is_array());
      if (parts && !ChatTemplateTakesContentParts(source)) {
        ASSERT_EQ(r.status, 200) << body << ": " << r.body;
        ASSERT_EQ(t.status, 200) << t.body;
        auto prompt = tokenizer_->Decode(backend_->submitted().back().prompt);
        ASSERT_TRUE(prompt.ok());
        for (const ojson& m : request["messages"]) {
          if (!m.contains("content") || !m["content"].is_array()) continue;
          for (const ojson& part : m["content"]) {
            EXPECT_NE(prompt->find(part["text"].get<std::string>()), std::string::npos) << *prompt;
          }
        }
        EXPECT_EQ(json::parse(t.body)["tokens"].get<std::vector<int32_t>>(), backend_->submitted().back().prompt);
        ++joined;
        continue;
      }
      if (c.contains("error")) {
        ExpectError(r, 400);
        ExpectError(t, 400);
        ++refused;
        continue;
      }
      ASSERT_EQ(r.status, 200) << body << ": " << r.body;
      auto submitted = backend_->submitted();
      ASSERT_EQ(submitted.size(), before + 1);
      auto prompt = tokenizer_->Decode(submitted.back().prompt);
      ASSERT_TRUE(prompt.ok());
      EXPECT_EQ(*prompt, c["expected"].get<std::string>()) << body;
      ASSERT_EQ(t.status, 200) << t.body;
      EXPECT_EQ(json::parse(t.body)["tokens"].get<std::vector<int32_t>>(), submitted.back().prompt);
      ++rendered;
    }
  }
  std::filesystem::remove_all(dir);
  EXPECT_GE(rendered, 140u);
  EXPECT_GE(refused, 10u);
  EXPECT_GE(joined, 1u);  // Qwen2.5 does not take parts
  EXPECT_GE(with_tools, 30u);
}

// What a chat request may carry is checked field by field, the same for /tokenize.
TEST_F(RouterHttpTest, ChatFieldsRefusedNamingTheField) {
  const std::string user = R"("messages":[{"role":"user","content":"Hi"}])";
  auto chat = [&](const std::string& rest) {
    return Post("/v1/chat/completions", R"({"model":"tiny-moe",)" + rest + "}");
  };
  struct Case {
    std::string fields, param;
  };
  const std::vector<Case> cases = {
      {R"("messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])",
       "messages[0].content[0].type"},
      {R"("messages":[{"role":"user","content":[{"type":"text","text":5}]}])",
       "messages[0].content[0].text"},
      {R"("messages":[{"role":"user","content":[{"text":"a"}]}])", "messages[0].content[0].type"},
      {R"("messages":[{"role":"user"}])", "messages[0].content"},
      {R"("messages":[{"role":"","content":"x"}])", "messages[0].role"},
      {R"("messages":[{"role":"assistant","tool_calls":{}}])", "messages[0].tool_calls"},
      {R"("messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}])",
       "messages[0].tool_calls[0].function.name"},
      {R"("messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{x"}}]}])",
       "messages[0].tool_calls[0].function.arguments"},
      {R"("messages":[{"role":"tool","content":"r","tool_call_id":7}])",
       "messages[0].tool_call_id"},
      {R"("messages":[{"role":"user","content":"x","name":[]}])", "messages[0].name"},
      {R"("messages":[{"role":"assistant","content":"x","reasoning_content":1}])",
       "messages[0].reasoning_content"},
      {user + R"(,"tools":[{"type":"function"}])", "tools[0].function"},
      {user + R"(,"tools":[{"type":"retrieval","function":{"name":"f"}}])", "tools[0].type"},
      {user + R"(,"tools":{})", "tools"},
      {user + R"(,"tool_choice":"required")", "tool_choice"},
      {user + R"(,"chat_template_kwargs":[1])", "chat_template_kwargs"},
      {user + R"(,"add_generation_prompt":"yes")", "add_generation_prompt"},
      {user + R"(,"continue_final_message":true)", "continue_final_message"},
      {user + R"(,"chat_template":"{{ 1 }}")", "chat_template"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fields);
    json e = ExpectError(chat(c.fields), 400, c.param);
    ExpectError(Post("/tokenize", "{" + c.fields + "}"), 400, c.param);
    if (c.param == "messages[0].content[0].type" && c.fields.find("image_url") != std::string::npos) {
      EXPECT_NE(e["error"]["message"].get<std::string>().find("'image_url'"), std::string::npos);
    }
  }
  // Arguments sent as a JSON string (as OpenAI clients do) reach the template as the object, as
  // vLLM gives them: the same prompt as the object itself (Qwen2.5's template writes a string
  // as it is and an object with tojson, so the compact string would otherwise show).
  const std::string dir = ::testing::TempDir() + "/chat_args_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(
      PW_SOURCE_DIR "/tests/fixtures/chat_templates/llama.cpp-Qwen-Qwen2.5-7B-Instruct.jinja",
      dir + "/chat_template.jinja", std::filesystem::copy_options::overwrite_existing);
  Teardown();
  chat_template_dir_ = dir;
  Build(RouterOptions{}, HttpServerOptions{});
  std::filesystem::remove_all(dir);
  const std::string call_str =
      R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":null,)"
      R"("tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"b\":1,\"a\":[2]}"}}]},)"
      R"({"role":"tool","tool_call_id":"c1","content":"ok"}]})";
  const std::string call_obj =
      R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":null,)"
      R"("tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{"b":1,"a":[2]}}}]},)"
      R"({"role":"tool","tool_call_id":"c1","content":"ok"}]})";
  auto a = Post("/tokenize", call_str);
  auto b = Post("/tokenize", call_obj);
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(json::parse(a.body)["tokens"], json::parse(b.body)["tokens"]);
  auto text = tokenizer_->Decode(json::parse(a.body)["tokens"].get<std::vector<int32_t>>());
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find(R"({"name": "f", "arguments": {"b": 1, "a": [2]}})"), std::string::npos)
      << *text;
  // tool_choice auto / none leave the output free and are accepted.
  EXPECT_EQ(chat(user + R"(,"max_tokens":1,"tool_choice":"none")").status, 200);
}

}  // namespace
}  // namespace pw::router
