// StreamClient: sends streaming completion requests over keep-alive HTTP/1.1 connections and
// times every server-sent event where its bytes arrive.
//
// A few I/O threads, each an epoll loop over non-blocking sockets, carry any number of
// concurrent streams (one request per connection at a time; a finished connection is kept for
// the next request of that thread unless the server closes it). Submit() is thread-safe; the
// done callback runs on an I/O thread, once per submitted request, with every time taken from
// std::chrono::steady_clock right after the recv() that brought the bytes.
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
  std::vector<SteadyClock::time_point> chunk_times;  // events carrying generated text
  SteadyClock::time_point done;                      // the last byte of the response
  int64_t prompt_tokens = -1;                        // from "usage" (-1: not reported)
  int64_t completion_tokens = -1;
  std::string text;  // generated text (kept when StreamClient::Options::keep_text)
};

class StreamClient {
 public:
  struct Options {
    int io_threads = 2;
    std::chrono::milliseconds request_timeout{600000};
    bool keep_text = false;
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

  // Events carrying generated text received so far (all threads).
  int64_t chunks_received() const { return chunks_.load(std::memory_order_relaxed); }

 private:
  class IoThread;
  HttpTarget target_;
  Options options_;
  DoneFn on_done_;
  std::vector<std::unique_ptr<IoThread>> threads_;
  std::atomic<uint64_t> next_thread_{0};
  std::atomic<int64_t> chunks_{0};
};

}  // namespace pw::loadgen
