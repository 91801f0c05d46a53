// HttpServer implementation: Beast parses requests; responses are written as raw HTTP/1.1 text
// through a per-connection write queue (complete responses with Content-Length, streams with
// chunked transfer encoding, or close-delimited for HTTP/1.0 clients).
#include "services/router/http_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <deque>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/logging.h"

namespace pw::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

namespace {

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Fields whose value is one item, not a comma-separated list: RFC 9110 section 5.3 allows
// several field lines of one name only for list-valued fields, so a second line of these is an
// error, refused (400) rather than letting one of them silently win (a proxy in front may have
// honoured the other). Those this server acts on, or that frame the body:
//   Host            RFC 9112 section 3.2 ("a server MUST respond with 400 ... more than one")
//   Content-Length  RFC 9110 section 8.6, RFC 9112 section 6.3: the body's length; several values,
//                   in lines or in one list, are refused even when equal (RFC 9110 lets a
//                   recipient either refuse or collapse them)
//   Content-Type    RFC 9110 section 8.3: one media type
//   Authorization   RFC 9110 section 11.6.2: one set of credentials (the API key)
// List-valued fields may repeat (their lines are one list): Connection (RFC 9110 section 7.6.1),
// Transfer-Encoding (RFC 9112 section 6.1), Expect (RFC 9110 section 10.1.1), Accept and the like.
// Fields this server ignores are not looked at.
constexpr std::pair<http::field, const char*> kSingleValued[] = {
    {http::field::host, "Host"},
    {http::field::content_length, "Content-Length"},
    {http::field::content_type, "Content-Type"},
    {http::field::authorization, "Authorization"},
};

// Why the head of `req` cannot be served (400 and close), or nullopt. `chunked`: the parser
// found chunked as the final transfer coding.
std::optional<std::string> BadFraming(const http::request<http::string_body>& req, bool chunked) {
  for (const auto& [field, name] : kSingleValued) {
    if (req.count(field) > 1) return "request with more than one " + std::string(name) + " header";
  }
  if (req[http::field::content_length].find(',') != beast::string_view::npos) {
    return std::string("request with more than one Content-Length value");
  }
  // RFC 9112 section 6.3: with Transfer-Encoding and chunked not the final coding (or applied
  // twice, which section 7 forbids), a request's body length cannot be known: 400 and close.
  if (req.count(http::field::transfer_encoding) > 0 && !chunked) {
    return std::string(
        "Transfer-Encoding without chunked as its final coding: the body's length is unknown");
  }
  return std::nullopt;
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Unknown";
  }
}

// Bytes of the client's next request kept while one is served (pipelining); past this the
// server stops reading until the current exchange ends.
constexpr size_t kMaxPipelinedBytes = 64 * 1024;

}  // namespace

std::string_view HttpRequest::Path() const {
  std::string_view t = target;
  size_t q = t.find('?');
  return q == std::string_view::npos ? t : t.substr(0, q);
}

std::string_view HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (IEquals(k, name)) return v;
  }
  return {};
}

std::string HttpErrorBody(std::string_view message, std::string_view type, std::string_view code) {
  nlohmann::json err = {{"message", message}, {"type", type}, {"param", nullptr}};
  if (code.empty()) {
    err["code"] = nullptr;
  } else {
    err["code"] = code;
  }
  nlohmann::json body = {{"error", err}};
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class Session;

// Live sessions, shared with the sessions themselves so that a session destroyed late (with the
// io_context) can still unregister safely.
struct SessionRegistry {
  std::mutex mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;  // guarded by mu
  std::atomic<size_t> count{0};
  void Add(Session* p, std::weak_ptr<Session> w) {
    std::lock_guard<std::mutex> lock(mu);
    sessions[p] = std::move(w);
    count.store(sessions.size());
  }
  void Remove(Session* p) {
    std::lock_guard<std::mutex> lock(mu);
    sessions.erase(p);
    count.store(sessions.size());
  }
};

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, HttpHandler handler)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        acceptor_(ioc_),
        accept_timer_(ioc_),
        registry_(std::make_shared<SessionRegistry>()) {}
  ~Impl() { Stop(); }

  Status Listen() {
    beast::error_code ec;
    auto address = net::ip::make_address(options_.bind_address, ec);
    if (ec) {
      return InvalidArgument("router http: bad bind address '" + options_.bind_address +
                             "': " + ec.message());
    }
    tcp::endpoint endpoint(address, options_.port);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return Unavailable("router http: cannot listen on " + options_.bind_address + ":" +
                         std::to_string(options_.port) + ": " + ec.message());
    }
    port_ = acceptor_.local_endpoint().port();
    return Status::Ok();
  }

  void Start() {
    DoAccept();
    thread_ = std::thread([this] { ioc_.run(); });
  }

  void StopAccepting() {
    net::post(ioc_, [this] {
      beast::error_code ec;
      acceptor_.close(ec);
    });
  }

  void Stop();

  void Post(std::function<void()> task) { net::post(ioc_, std::move(task)); }

  uint64_t PostAfter(std::chrono::milliseconds delay, std::function<void()> task) {
    uint64_t id = next_timer_id_++;
    auto timer = std::make_shared<net::steady_timer>(ioc_, delay);
    timers_[id] = timer;
    timer->async_wait([this, id, timer, task = std::move(task)](beast::error_code ec) {
      timers_.erase(id);
      if (!ec) task();
    });
    return id;
  }

  void CancelTimer(uint64_t id) {
    auto it = timers_.find(id);
    if (it != timers_.end()) {
      it->second->cancel();
      timers_.erase(it);
    }
  }

  void DoAccept() {
    acceptor_.async_accept([this](beast::error_code ec, tcp::socket s) {
      if (ec) {
        if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
        // Out of descriptors (EMFILE/ENFILE) or a transient failure: log once per burst and
        // retry after a pause instead of spinning.
        if (!accept_backoff_) {
          std::fprintf(stderr, "router http: accept failed: %s; retrying in 100 ms\n",
                       ec.message().c_str());
        }
        accept_backoff_ = true;
        accept_timer_.expires_after(std::chrono::milliseconds(100));
        accept_timer_.async_wait([this](beast::error_code tec) {
          if (!tec && acceptor_.is_open()) DoAccept();
        });
        return;
      }
      accept_backoff_ = false;
      OnAccepted(std::move(s));
      if (acceptor_.is_open()) DoAccept();
    });
  }

  void OnAccepted(tcp::socket socket);

  HttpServerOptions options_;
  HttpHandler handler_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  net::steady_timer accept_timer_;
  bool accept_backoff_ = false;
  std::thread thread_;
  uint16_t port_ = 0;
  uint64_t next_timer_id_ = 1;                                               // io thread only
  std::unordered_map<uint64_t, std::shared_ptr<net::steady_timer>> timers_;  // io thread only
  std::shared_ptr<SessionRegistry> registry_;
  bool stopped_ = false;
};

// One TCP connection. All members are touched on the io thread only.
class Session : public HttpExchange, public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::Impl* server, tcp::socket socket)
      : server_(server),
        registry_(server->registry_),
        socket_(std::move(socket)),
        read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()) {}

  ~Session() override { registry_->Remove(this); }

  void Start() { ReadNextRequest(); }

  // --- HttpExchange ---
  void Respond(HttpResponse r) override {
    if (!exchange_active_ || streaming_ || closed_) return;
    std::string out = StatusLine(r.status);
    out += "Content-Type: " + r.content_type + "\r\n";
    for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
    out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
    out += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    out += r.body;
    EndExchange();
    Enqueue(std::move(out));
  }

  void BeginStream(int status, std::string content_type, HttpHeaders headers) override {
    if (!exchange_active_ || streaming_ || closed_) return;
    streaming_ = true;
    std::string out = StatusLine(status);
    out += "Content-Type: " + content_type + "\r\n";
    for (const auto& [k, v] : headers) out += k + ": " + v + "\r\n";
    if (http10_) {
      // No chunked encoding in HTTP/1.0 (RFC 1945): the body ends when the connection does.
      keep_alive_ = false;
      out += "Connection: close\r\n\r\n";
    } else {
      out += "Transfer-Encoding: chunked\r\n";
      out += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    }
    Enqueue(std::move(out));
  }

  void StreamWrite(std::string data) override {
    if (!exchange_active_ || !streaming_ || closed_ || data.empty()) return;
    if (http10_) {
      Enqueue(std::move(data));
      return;
    }
    char size_line[32];
    std::snprintf(size_line, sizeof(size_line), "%zx\r\n", data.size());
    std::string out = size_line;
    out += data;
    out += "\r\n";
    Enqueue(std::move(out));
  }

  void EndStream() override {
    if (!exchange_active_ || !streaming_ || closed_) return;
    EndExchange();
    if (!http10_) {
      Enqueue("0\r\n\r\n");
    } else if (!writing_ && out_.empty()) {
      ResponseWritten();  // everything is out: close, which ends the body
    }
  }

  void SetOnDisconnect(std::function<void()> callback) override {
    on_disconnect_ = std::move(callback);
  }

  bool open() const override { return exchange_active_ && !closed_; }

 private:
  std::string StatusLine(int status) {
    return "HTTP/1.1 " + std::to_string(status) + " " + ReasonPhrase(status) + "\r\n";
  }

  const HttpServerOptions& opts() const { return server_->options_; }

  void ArmReadTimer(std::chrono::milliseconds d) {
    read_timer_.expires_after(d);
    uint64_t gen = ++read_timer_gen_;
    read_timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
      if (ec || gen != self->read_timer_gen_) return;  // cancelled or re-armed
      if (self->reading_body_) {
        // The body stopped short: abort the pending read; OnBody answers 408.
        self->body_timed_out_ = true;
        beast::error_code ignored;
        self->socket_.cancel(ignored);
        return;
      }
      // A client that does not finish its request line and headers in time is closed without
      // a response.
      self->CloseNow();
    });
  }

  void ReadNextRequest() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(opts().max_header_bytes));
    parser_->body_limit(opts().max_body_bytes);
    if (buffer_.size() == 0) {
      // Idle keep-alive wait for the first byte of the next request.
      ArmReadTimer(opts().idle_timeout);
      socket_.async_read_some(buffer_.prepare(4096),
                              [self = shared_from_this()](beast::error_code ec, size_t n) {
                                self->buffer_.commit(n);
                                if (ec || self->closed_) {
                                  self->CloseNow();
                                  return;
                                }
                                self->ReadHeader();
                              });
    } else {
      ReadHeader();
    }
  }

  void ReadHeader() {
    ArmReadTimer(opts().header_timeout);
    http::async_read_header(
        socket_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  // Answers a protocol-level error and closes after the write, draining what the client still
  // sends for a short while so it can read the answer before the connection goes away.
  void FailRequest(int status, std::string_view message, std::string_view code) {
    CancelReadTimer();
    keep_alive_ = false;
    exchange_active_ = true;
    streaming_ = false;
    on_disconnect_ = nullptr;
    Respond(
        {status, "application/json", {}, HttpErrorBody(message, "invalid_request_error", code)});
  }

  // The client closed or reset the connection (or the server is closing it): nothing to answer.
  static bool PeerWentAway(beast::error_code ec) {
    return ec == http::error::end_of_stream || ec == net::error::eof ||
           ec == net::error::operation_aborted || ec == net::error::connection_reset ||
           ec == net::error::bad_descriptor;
  }

  void FailBodyTooLarge() {
    FailRequest(413,
                "request body exceeds the limit of " + std::to_string(opts().max_body_bytes) +
                    " bytes",
                "body_too_large");
  }

  void OnHeader(beast::error_code ec) {
    if (closed_) return;
    if (ec == http::error::header_limit) {
      FailRequest(431,
                  "request headers exceed " + std::to_string(opts().max_header_bytes) + " bytes",
                  "headers_too_large");
      return;
    }
    if (ec == http::error::body_limit) {
      FailBodyTooLarge();
      return;
    }
    if (ec) {
      if (PeerWentAway(ec)) {
        CloseNow();
        return;
      }
      FailRequest(400, "malformed HTTP request: " + ec.message(), "bad_http");
      return;
    }
    auto& req = parser_->get();
    http10_ = req.version() < 11;
    // RFC 9112 section 3.2: 400 for an HTTP/1.1 request without Host.
    if (!http10_ && req.count(http::field::host) == 0) {
      FailRequest(400, "HTTP/1.1 request without a Host header", "bad_http");
      return;
    }
    if (auto bad = BadFraming(req, parser_->chunked())) {
      FailRequest(400, *bad, "bad_http");
      return;
    }
    if (IEquals(std::string(req[http::field::expect]), "100-continue")) {
      Enqueue("HTTP/1.1 100 Continue\r\n\r\n");
    }
    reading_body_ = true;
    body_timed_out_ = false;
    ArmReadTimer(opts().body_timeout);
    http::async_read(
        socket_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(beast::error_code ec) {
    reading_body_ = false;
    if (closed_) return;
    if (body_timed_out_) {
      body_timed_out_ = false;
      FailRequest(408,
                  "request body not received within " +
                      std::to_string(opts().body_timeout.count()) + " ms",
                  "request_timeout");
      return;
    }
    if (ec == http::error::body_limit) {
      FailBodyTooLarge();
      return;
    }
    if (ec) {
      if (PeerWentAway(ec) || ec == http::error::partial_message) {
        CloseNow();
        return;
      }
      FailRequest(400, "malformed HTTP request: " + ec.message(), "bad_http");
      return;
    }
    CancelReadTimer();
    auto msg = parser_->release();
    HttpRequest request;
    request.method = std::string(msg.method_string());
    request.target = std::string(msg.target());
    for (const auto& field : msg) {
      request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    request.body = std::move(msg.body());
    keep_alive_ = msg.keep_alive();
    exchange_active_ = true;
    streaming_ = false;
    on_disconnect_ = nullptr;
    WatchForDisconnect();
    // The handler may answer at once or later (from Post()ed tasks).
    server_->handler_(std::move(request), shared_from_this());
  }

  // Keeps one read pending while an exchange is served: EOF or an error means the client left.
  void WatchForDisconnect() {
    if (watching_ || closed_ || buffer_.size() >= kMaxPipelinedBytes) return;
    watching_ = true;
    socket_.async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->OnWatch(ec, n); });
  }

  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    buffer_.commit(n);
    if (closed_) return;
    if (ec && ec != net::error::operation_aborted) {
      ClientGone();
      return;
    }
    if (exchange_active_) {
      if (!ec) WatchForDisconnect();
      return;
    }
    if (resume_after_watch_) {
      resume_after_watch_ = false;
      ReadNextRequest();
    }
  }

  void EndExchange() {
    exchange_active_ = false;
    response_complete_ = true;
  }

  void CancelReadTimer() {
    ++read_timer_gen_;
    read_timer_.cancel();
  }

  void Enqueue(std::string data) {
    if (closed_) return;
    out_.push_back(std::move(data));
    if (!writing_) DoWrite();
  }

  void DoWrite() {
    writing_ = true;
    write_timer_.expires_after(opts().write_timeout);
    uint64_t gen = ++write_timer_gen_;
    write_timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
      if (!ec && gen == self->write_timer_gen_) self->ClientGone();  // the client stopped reading
    });
    net::async_write(
        socket_, net::buffer(out_.front()),
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWritten(ec); });
  }

  void OnWritten(beast::error_code ec) {
    ++write_timer_gen_;
    write_timer_.cancel();
    writing_ = false;
    if (closed_) return;
    if (ec) {
      ClientGone();
      return;
    }
    PW_LOG(DEBUG) << "http: trace: wrote " << out_.front().size() << " bytes";
    out_.pop_front();
    if (!out_.empty()) {
      DoWrite();
      return;
    }
    if (!response_complete_) return;  // more of a stream to come, or only "100 Continue"
    ResponseWritten();
  }

  // The response is fully written: close, or read the next request.
  void ResponseWritten() {
    response_complete_ = false;
    if (!keep_alive_) {
      GracefulClose();
      return;
    }
    if (watching_) {
      // Stop the disconnect watch; its handler starts the next read.
      resume_after_watch_ = true;
      beast::error_code ignored;
      socket_.cancel(ignored);
    } else {
      ReadNextRequest();
    }
  }

  // The client went away (or stopped reading) before the exchange ended.
  void ClientGone() {
    bool was_active = exchange_active_;
    CloseNow();
    if (was_active && on_disconnect_) {
      auto cb = std::move(on_disconnect_);
      on_disconnect_ = nullptr;
      cb();
    }
  }

  // Half-close, then discard what the client still sends for up to one second, then close.
  void GracefulClose() {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    ArmReadTimer(std::chrono::milliseconds(1000));
    Drain();
  }

  void Drain() {
    if (closed_) return;
    if (watching_) return;  // the pending read drains into buffer_; CloseNow on timer
    auto scratch = std::make_shared<std::array<char, 8192>>();
    socket_.async_read_some(net::buffer(*scratch),
                            [self = shared_from_this(), scratch](beast::error_code ec, size_t) {
                              if (ec) {
                                self->CloseNow();
                                return;
                              }
                              self->Drain();
                            });
  }

  void CloseNow() {
    if (closed_) return;
    closed_ = true;
    exchange_active_ = false;
    beast::error_code ignored;
    CancelReadTimer();
    ++write_timer_gen_;
    write_timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

 public:
  // Called from Stop() on the io thread.
  void ForceClose() { ClientGone(); }
  // True when nothing is queued or being written (io thread).
  bool WritesIdle() const { return closed_ || (!writing_ && out_.empty()); }

 private:
  HttpServer::Impl* server_;
  std::shared_ptr<SessionRegistry> registry_;
  tcp::socket socket_;
  net::steady_timer read_timer_;
  net::steady_timer write_timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> out_;
  std::function<void()> on_disconnect_;
  uint64_t read_timer_gen_ = 0;
  uint64_t write_timer_gen_ = 0;
  bool response_complete_ = false;
  bool writing_ = false;
  bool watching_ = false;
  bool resume_after_watch_ = false;
  bool exchange_active_ = false;
  bool streaming_ = false;
  bool keep_alive_ = true;
  bool http10_ = false;         // the current request is HTTP/1.0 (no chunked streams)
  bool reading_body_ = false;   // the body read (under body_timeout) is pending
  bool body_timed_out_ = false;  // body_timeout fired: OnBody answers 408
  bool closed_ = false;
};

void HttpServer::Impl::OnAccepted(tcp::socket socket) {
  beast::error_code ignored;
  if (registry_->count.load() >= options_.max_connections) {
    socket.close(ignored);
    return;
  }
  socket.set_option(tcp::no_delay(true), ignored);
  auto session = std::make_shared<Session>(this, std::move(socket));
  registry_->Add(session.get(), session);
  session->Start();
}

void HttpServer::Impl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  std::promise<void> done;
  auto fut = done.get_future();
  net::post(ioc_, [this, &done] {
    beast::error_code ec;
    acceptor_.close(ec);
    accept_timer_.cancel();
    std::vector<std::shared_ptr<Session>> live;
    {
      std::lock_guard<std::mutex> lock(registry_->mu);
      for (auto& [p, w] : registry_->sessions) {
        if (auto s = w.lock()) live.push_back(s);
      }
    }
    for (auto& s : live) s->ForceClose();
    for (auto& [id, t] : timers_) t->cancel();
    timers_.clear();
    done.set_value();
  });
  if (thread_.joinable()) {
    fut.wait();
    ioc_.stop();
    thread_.join();
  }
}

void HttpServer::FlushWrites(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto idle = std::make_shared<std::promise<bool>>();
    auto fut = idle->get_future();
    impl_->Post([this, idle] {
      std::vector<std::shared_ptr<Session>> live;
      {
        std::lock_guard<std::mutex> lock(impl_->registry_->mu);
        for (auto& [p, w] : impl_->registry_->sessions) {
          if (auto s = w.lock()) live.push_back(std::move(s));
        }
      }
      bool all = true;
      for (const auto& s : live) all &= s->WritesIdle();
      live.clear();  // a last reference may unregister its session: outside the lock
      idle->set_value(all);
    });
    if (fut.wait_until(deadline) != std::future_status::ready) return;
    if (fut.get()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }

Result<std::unique_ptr<HttpServer>> HttpServer::Create(HttpServerOptions options,
                                                       HttpHandler handler) {
  auto impl = std::make_unique<Impl>(std::move(options), std::move(handler));
  PW_RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::Start() { impl_->Start(); }
void HttpServer::StopAccepting() { impl_->StopAccepting(); }
void HttpServer::Stop() { impl_->Stop(); }
void HttpServer::Post(std::function<void()> task) { impl_->Post(std::move(task)); }
uint64_t HttpServer::PostAfter(std::chrono::milliseconds delay, std::function<void()> task) {
  return impl_->PostAfter(delay, std::move(task));
}
void HttpServer::CancelTimer(uint64_t id) { impl_->CancelTimer(id); }
uint16_t HttpServer::port() const { return impl_->port_; }
size_t HttpServer::connections() const { return impl_->registry_->count.load(); }

}  // namespace pw::router
