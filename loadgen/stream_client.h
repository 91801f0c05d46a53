// StreamClient: sends streaming completion requests over keep-alive HTTP/1.1 connections and
// times every generated token where the bytes of the event that carried it arrive.
//
// A few I/O threads, each an epoll loop over non-blocking sockets, carry any number of
// concurrent streams (one request per connection at a time; a finished connection is kept for
// the next request of that thread unless the server closes it). Submit() is thread-safe; the
// done callback runs on an I/O thread, once per submitted request, with every time taken from
// std::chrono::steady_clock (or Options::clock) right after the recv() that brought the bytes.
//
// Tokens, not events: an event may carry several tokens (a server that batches its output, or
// holds back text that ends inside a character) or none (a token that decodes to no text, which
// a server may send as an empty event or not at all). Options::token_count says how an event's
// tokens are counted; every token counted in one event gets that event's time (the client
// cannot see them apart):
//   - kUsage: `stream_options: {include_usage, continuous_usage_stats}` makes vLLM and our
//     router put the running usage on every event; the event's tokens are its
//     usage.completion_tokens minus the previous event's. An event with a choice but no usage
//     is a protocol error (the server does not send continuous usage).
//   - kLogprobs: with log-probabilities requested, an event's tokens are its entries
//     (choices[].logprobs.tokens of /v1/completions, .content of chat and of llama-server's
//     completions). An event with text but no log-probabilities is a protocol error.
//   - kChunks: one token per event carrying non-empty text (what vLLM's benchmark client
//     assumes; wrong for tokens without text and for events of several tokens).
//
// A request whose reused keep-alive connection fails before any response byte (the server
// closed it meanwhile) is sent again once on a fresh connection.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace pw::loadgen {

using SteadyClock = std::chrono::steady_clock;

struct HttpTarget {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  std::string path = "/v1/completions";
};

// Parses "http://host:port[/prefix]" (no https); the endpoint path is appended to the prefix.
Result<HttpTarget> ParseBaseUrl(const std::string& base_url, const std::string& endpoint);

// What happened to one request.
struct StreamOutcome {
  uint64_t index = 0;
  bool success = false;
  int http_status = 0;
  // "" on success, else one of: connect, http_<status>, server_error (an error event in the
  // stream), protocol (malformed response), incomplete (stream ended without [DONE]), timeout.
  std::string error_kind;
  std::string error;             // a message (first 300 bytes)
  SteadyClock::time_point sent;  // the request's first byte handed to the kernel
  // One per generated token counted (TokenCount), in order: the time of the event that carried
  // it (tokens of one event share it).
  std::vector<SteadyClock::time_point> token_times;
  SteadyClock::time_point done;   // the last byte of the response
  int64_t prompt_tokens = -1;     // from the last "usage" seen (-1: not reported)
  int64_t completion_tokens = -1;
  // What the events carried, whatever the counting (DetectTokenCount decides by these):
  int64_t choice_events = 0;   // events with at least one choice
  int64_t usage_events = 0;    // of those, events with usage.completion_tokens
  int64_t logprob_events = 0;  // of those, events with a log-probability list
  int64_t text_events_without_logprobs = 0;  // events with text and no log-probability list
  std::string text;  // generated text (kept when StreamClient::Options::keep_text)
};

// How an event's tokens are counted (above).
enum class TokenCount { kUsage, kLogprobs, kChunks };
// "usage", "logprobs", "chunks".
const char* TokenCountName(TokenCount c);

class StreamClient {
 public:
  struct Options {
    int io_threads = 2;
    std::chrono::milliseconds request_timeout{600000};
    bool keep_text = false;
    TokenCount token_count = TokenCount::kUsage;
    // The clock the outcome's times are read from (null: SteadyClock::now); deadlines always
    // use the steady clock. Tests set their own to control the times a request sees.
    std::function<SteadyClock::time_point()> clock;
  };
  using DoneFn = std::function<void(StreamOutcome)>;

  StreamClient(HttpTarget target, Options options, DoneFn on_done);
  ~StreamClient();
  StreamClient(const StreamClient&) = delete;
  StreamClient& operator=(const StreamClient&) = delete;

  // Resolves the host and starts the I/O threads.
  Status Start();
  // Sends POST `target.path` with the JSON `body`; `index` comes back in the outcome.
  void Submit(uint64_t index, std::string body);
  // Fails what is in flight (error_kind "cancelled") and joins the threads.
  void Stop();

  // Tokens counted so far (all threads), and events parsed so far.
  int64_t tokens_received() const { return tokens_.load(std::memory_order_relaxed); }
  int64_t events_received() const { return events_.load(std::memory_order_relaxed); }

 private:
  class IoThread;
  HttpTarget target_;
  Options options_;
  DoneFn on_done_;
  std::vector<std::unique_ptr<IoThread>> threads_;
  std::atomic<uint64_t> next_thread_{0};
  std::atomic<int64_t> tokens_{0};
  std::atomic<int64_t> events_{0};
};

}  // namespace pw::loadgen
