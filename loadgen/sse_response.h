// SseResponse: an incremental parser of one HTTP/1.1 response carrying a server-sent event
// stream (or, for an error, a JSON body), fed the bytes as recv() returns them.
//
// Handles the status line, headers (Content-Length, Transfer-Encoding: chunked, Connection),
// chunked decoding, and splits the body into SSE events ("data: ...\n\n"); each event is handed
// to the caller with the time of the recv() that completed it, so timestamps are those of the
// bytes' arrival. Malformed bytes from the server are an error (a message), never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace pw::loadgen {

class SseResponse {
 public:
  // Called with the payload after "data:" (leading space stripped), e.g. "[DONE]" or JSON.
  using EventFn = std::function<void(std::string_view data)>;

  explicit SseResponse(EventFn on_event) : on_event_(std::move(on_event)) {}

  // Consumes `bytes`; returns false on a protocol error (error() says what). Bytes after the end
  // of the response are an error too (the client sends one request at a time per connection).
  bool Feed(std::string_view bytes);
  // Call at EOF: true when the response was complete (or is delimited by the close).
  bool FinishAtEof();

  bool headers_done() const { return state_ > State::kHeaders; }
  bool complete() const { return state_ == State::kDone; }
  int status() const { return status_; }
  // Connection can carry the next request (HTTP/1.1 without "Connection: close", body framed).
  bool keep_alive() const { return keep_alive_; }
  // For a non-2xx response or a non-SSE body: the body (first 4 KiB).
  const std::string& body() const { return body_; }
  const std::string& error() const { return error_; }

 private:
  enum class State {
    kHeaders,
    kChunkSize,
    kChunkData,
    kChunkDataEnd,
    kTrailer,
    kLength,
    kUntilClose,
    kDone
  };
  bool Fail(std::string m);
  bool ParseHead(std::string_view head);
  void Body(std::string_view data);

  EventFn on_event_;
  State state_ = State::kHeaders;
  std::string buf_;     // unparsed header / chunk-size bytes
  std::string events_;  // body bytes not yet split into events
  std::string body_;
  std::string error_;
  int status_ = 0;
  bool keep_alive_ = true;
  bool sse_ = false;
  uint64_t remaining_ = 0;  // of the current chunk or Content-Length body
};

}  // namespace pw::loadgen
