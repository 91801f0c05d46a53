// HttpServer: an asynchronous HTTP/1.1 server (Boost.Asio/Beast) for the router's front end.
//
// Contract:
// - One io_context driven by one thread (the io thread): every handler, every HttpExchange call
//   and every task given to Post()/PostAfter() runs on it, so the code that serves requests needs
//   no locks. The work per request here is parsing and formatting; the model runs elsewhere. Idle
//   connections cost a socket and a small buffer, no thread.
// - Limits per connection (HttpServerOptions): headers larger than max_header_bytes -> 431 and
//   close; a body larger than max_body_bytes -> 413 with an OpenAI-style error object and close;
//   a client that does not finish its request line and headers within header_timeout is closed
//   without a response; a body that stops short (of its Content-Length or last chunk) for
//   body_timeout after the headers -> 408 and close; an idle keep-alive connection is closed
//   after idle_timeout. Malformed HTTP -> 400 and close; so is an HTTP/1.1 request without a
//   Host header (RFC 9112 section 3.2), any request with a second line of a single-valued
//   field it acts on (Host, Content-Length, Content-Type, Authorization; RFC 9110 section 5.3)
//   or more than one Content-Length value, and a Transfer-Encoding whose final coding is not
//   chunked (RFC 9112 section 6.3). List-valued fields (Connection, Accept, ...) may repeat.
// - Keep-alive: HTTP/1.1 connections stay open unless the client says `Connection: close`;
//   HTTP/1.0 ones only with `Connection: keep-alive`. Requests on one connection are served
//   one at a time, in order.
// - Streams (BeginStream) are chunked for HTTP/1.1 clients; an HTTP/1.0 client, which cannot
//   read chunked encoding, gets the bytes as they are and the end of the body is the end of the
//   connection (Connection: close, no Content-Length).
// - While a request is being served the server keeps reading the socket, so a client that goes
//   away is noticed at once and the exchange's disconnect callback runs (the router cancels the
//   request on the workers from there).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace pw::router {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// One parsed request. Header names are kept as sent; Header() compares case-insensitively.
struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // request target as sent, e.g. "/v1/completions?x=1"
  HttpHeaders headers;
  std::string body;
  // Path part of target (before '?').
  std::string_view Path() const;
  // Value of the first header named `name` (case-insensitive), or "" when absent.
  std::string_view Header(std::string_view name) const;
};

// A complete (non-streaming) response. Content-Length and Connection are added by the server.
struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  HttpHeaders headers;  // extra headers, e.g. {"Retry-After", "1"}
  std::string body;
};

// The server side of one request/response exchange, handed to the request handler.
// Every method must be called on the server's io thread (use HttpServer::Post from elsewhere).
// Exactly one of: Respond(), or BeginStream() + StreamWrite()* + EndStream(). Calls after the
// exchange ended or after the client disconnected are ignored.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual void Respond(HttpResponse response) = 0;
  // Starts a streamed response with the given status and headers: Transfer-Encoding: chunked
  // for HTTP/1.1; for HTTP/1.0, close-delimited (the connection closes after EndStream).
  virtual void BeginStream(int status, std::string content_type, HttpHeaders headers) = 0;
  // Sends `data` as one chunk; empty data is ignored (an empty chunk would end the body).
  virtual void StreamWrite(std::string data) = 0;
  virtual void EndStream() = 0;
  // `callback` runs once, on the io thread, if the client disconnects (or a write to it fails or
  // times out) before the exchange ended. Replaces any earlier callback.
  virtual void SetOnDisconnect(std::function<void()> callback) = 0;
  // True until the exchange ended or the client went away.
  virtual bool open() const = 0;
};

using HttpHandler =
    std::function<void(HttpRequest request, std::shared_ptr<HttpExchange> exchange)>;

struct HttpServerOptions {
  std::string bind_address = "127.0.0.1";
  uint16_t port = 8000;  // 0 = pick a free port (see HttpServer::port())
  size_t max_header_bytes = 16 * 1024;
  size_t max_body_bytes = 1024 * 1024;
  std::chrono::milliseconds header_timeout{10000};  // first byte -> end of headers
  std::chrono::milliseconds body_timeout{30000};    // end of headers -> end of body (then 408)
  std::chrono::milliseconds idle_timeout{60000};    // keep-alive wait for the next request
  std::chrono::milliseconds write_timeout{30000};   // one write to a client that does not read
  size_t max_connections = 10000;                   // over this, new connections are closed
};

// Body of the error object the server itself answers with (413/431/400 on bad HTTP), in the
// OpenAI format: {"error":{"message":...,"type":...,"param":null,"code":...}}.
std::string HttpErrorBody(std::string_view message, std::string_view type, std::string_view code);

class HttpServer {
 public:
  // Binds and listens; serving starts with Start(). Errors (address in use, bad address) are
  // returned as Status.
  static Result<std::unique_ptr<HttpServer>> Create(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Starts accepting and the io threads. Returns at once.
  void Start();
  // Stops accepting new connections; open connections keep being served.
  void StopAccepting();
  // Waits (up to `timeout`) until every response queued so far is written to its client; call
  // before Stop() so a drained request's last bytes are not cut off. Not from the io thread.
  void FlushWrites(std::chrono::milliseconds timeout);
  // Stops everything: closes all connections, joins the io thread. Idempotent.
  void Stop();
  // Runs `task` on the io thread (thread-safe; tasks run in the order posted).
  void Post(std::function<void()> task);
  // Runs `task` on the io thread after `delay`; returns an id for CancelTimer. Io thread only.
  uint64_t PostAfter(std::chrono::milliseconds delay, std::function<void()> task);
  // Cancels a timer set by PostAfter (io thread only). Unknown ids are ignored.
  void CancelTimer(uint64_t id);
  // The bound port (useful with port 0).
  uint16_t port() const;
  // Connections currently open.
  size_t connections() const;

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pw::router
