#include "loadgen/stream_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>

#include "loadgen/sse_response.h"

namespace pw::loadgen {

Result<HttpTarget> ParseBaseUrl(const std::string& base_url, const std::string& endpoint) {
  const std::string scheme = "http://";
  if (base_url.rfind(scheme, 0) != 0) {
    return InvalidArgument("--base-url '" + base_url +
                           "': only http://HOST[:PORT][/PREFIX] is supported");
  }
  std::string rest = base_url.substr(scheme.size());
  std::string prefix;
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    prefix = rest.substr(slash);
    rest = rest.substr(0, slash);
  }
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  HttpTarget t;
  t.port = 80;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string::npos) return InvalidArgument("--base-url: unclosed '[' in the host");
    t.host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return InvalidArgument("--base-url: bad host");
    if (!rest.empty())
      rest = rest.substr(1);
    else
      rest.clear();
  } else {
    const size_t colon = rest.rfind(':');
    t.host = rest.substr(0, colon);
    rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
  }
  if (t.host.empty()) return InvalidArgument("--base-url '" + base_url + "' has no host");
  if (!rest.empty()) {
    char* end = nullptr;
    const long p = std::strtol(rest.c_str(), &end, 10);
    if (*end != '\0' || p < 1 || p > 65535) {
      return InvalidArgument("--base-url '" + base_url + "': bad port '" + rest + "'");
    }
    t.port = static_cast<uint16_t>(p);
  }
  std::string ep = endpoint.empty() ? "/v1/completions" : endpoint;
  if (ep.front() != '/') ep = "/" + ep;
  t.path = prefix + ep;
  return t;
}

namespace {
std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// The number of log-probability entries of a choice (-1: none): OpenAI's completions shape
// (logprobs.tokens), the chat shape (logprobs.content), which llama-server also sends for
// completions.
int64_t LogprobEntries(const nlohmann::json& choice) {
  auto lp = choice.find("logprobs");
  if (lp == choice.end() || !lp->is_object()) return -1;
  for (const char* key : {"tokens", "content"}) {
    if (auto a = lp->find(key); a != lp->end() && a->is_array()) {
      return static_cast<int64_t>(a->size());
    }
  }
  return -1;
}
}  // namespace

const char* TokenCountName(TokenCount c) {
  switch (c) {
    case TokenCount::kUsage:
      return "usage";
    case TokenCount::kLogprobs:
      return "logprobs";
    case TokenCount::kChunks:
      return "chunks";
  }
  return "?";
}

class StreamClient::IoThread {
 public:
  IoThread(StreamClient* owner, sockaddr_storage addr, socklen_t addr_len)
      : owner_(owner), addr_(addr), addr_len_(addr_len) {}
  ~IoThread() { Stop(); }

  Status Start() {
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epfd_ < 0 || efd_ < 0) return IoError(Errno("epoll/eventfd"));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, efd_, &ev);
    thread_ = std::thread([this] { Loop(); });
    return Status::Ok();
  }

  void Submit(uint64_t index, std::string body) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.emplace_back(index, std::move(body));
    }
    Wake();
  }

  void Stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    Wake();
    thread_.join();
    if (efd_ >= 0) close(efd_);
    if (epfd_ >= 0) close(epfd_);
    efd_ = epfd_ = -1;
  }

 private:
  struct Conn {
    uint64_t id = 0;  // epoll's key (a closed fd's number may come back for a new socket)
    int fd = -1;
    enum class State { kConnecting, kActive, kIdle } state = State::kConnecting;
    bool has_request = false;
    bool reused = false;     // the request went on a kept-alive connection
    bool got_bytes = false;  // any response byte for the current request
    bool retried = false;
    bool saw_done = false;
    std::string out;  // request bytes
    size_t out_off = 0;
    std::string body;  // kept for a retry
    std::unique_ptr<SseResponse> resp;
    StreamOutcome outcome;
    SteadyClock::time_point deadline;
    SteadyClock::time_point now;  // time of the recv() being parsed
    bool stream_error = false;
  };

  SteadyClock::time_point Now() const {
    return owner_->options_.clock ? owner_->options_.clock() : SteadyClock::now();
  }

  void Wake() {
    const uint64_t one = 1;
    ssize_t r = write(efd_, &one, sizeof(one));
    (void)r;
  }

  void Watch(Conn* c, uint32_t events, int op) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = c->id;
    epoll_ctl(epfd_, op, c->fd, &ev);
  }

  Conn* NewConn() {
    const int fd = socket(addr_.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return nullptr;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->id = ++last_id_;
    const int r = connect(fd, reinterpret_cast<const sockaddr*>(&addr_), addr_len_);
    if (r != 0 && errno != EINPROGRESS) {
      close(fd);
      connect_error_ = Errno("connect");
      return nullptr;
    }
    c->state = Conn::State::kConnecting;
    Conn* raw = c.get();
    conns_[raw->id] = std::move(c);
    Watch(raw, EPOLLOUT | EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
    return raw;
  }

  void CloseConn(Conn* c) {
    epoll_ctl(epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
    close(c->fd);
    for (size_t i = 0; i < idle_.size(); ++i) {
      if (idle_[i] == c) {
        idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
    conns_.erase(c->id);
  }

  void Begin(uint64_t index, std::string body, bool fresh_only, bool retried) {
    Conn* c = nullptr;
    if (!fresh_only && !idle_.empty()) {
      c = idle_.back();
      idle_.pop_back();
      c->reused = true;
    } else {
      c = NewConn();
      if (c) c->reused = false;
    }
    if (!c) {
      StreamOutcome o;
      o.index = index;
      o.sent = o.done = Now();
      o.error_kind = "connect";
      o.error = connect_error_.empty() ? "cannot open a socket" : connect_error_;
      owner_->on_done_(std::move(o));
      return;
    }
    const HttpTarget& t = owner_->target_;
    c->out = "POST " + t.path + " HTTP/1.1\r\nHost: " + t.host + ":" + std::to_string(t.port) +
             "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
             "Content-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body;
    c->out_off = 0;
    c->body = std::move(body);
    c->has_request = true;
    c->got_bytes = false;
    c->retried = retried;
    c->saw_done = false;
    c->stream_error = false;
    c->outcome = StreamOutcome{};
    c->outcome.index = index;
    c->outcome.sent = Now();
    c->deadline = SteadyClock::now() + owner_->options_.request_timeout;
    c->resp = std::make_unique<SseResponse>([this, c](std::string_view d) { OnEvent(c, d); });
    if (c->state == Conn::State::kIdle) {
      c->state = Conn::State::kActive;
      Watch(c, EPOLLIN | EPOLLOUT | EPOLLRDHUP, EPOLL_CTL_MOD);
      Write(c);
    }
  }

  void OnEvent(Conn* c, std::string_view data) {
    if (c->stream_error) return;
    if (data == "[DONE]") {
      c->saw_done = true;
      return;
    }
    auto j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      c->stream_error = true;
      c->outcome.error_kind = "protocol";
      c->outcome.error = "event is not a JSON object: " + std::string(data.substr(0, 200));
      return;
    }
    if (j.contains("error")) {
      c->stream_error = true;
      c->outcome.error_kind = "server_error";
      const auto& e = j["error"];
      c->outcome.error = e.is_object() && e.contains("message") && e["message"].is_string()
                             ? e["message"].get<std::string>()
                             : e.dump().substr(0, 300);
      return;
    }
    int64_t usage_tokens = -1;
    if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
      if (u->contains("prompt_tokens") && (*u)["prompt_tokens"].is_number_integer()) {
        c->outcome.prompt_tokens = (*u)["prompt_tokens"].get<int64_t>();
      }
      if (u->contains("completion_tokens") && (*u)["completion_tokens"].is_number_integer()) {
        usage_tokens = (*u)["completion_tokens"].get<int64_t>();
        c->outcome.completion_tokens = usage_tokens;
      }
    }
    owner_->events_.fetch_add(1, std::memory_order_relaxed);
    auto ch = j.find("choices");
    if (ch == j.end() || !ch->is_array() || ch->empty()) return;  // e.g. the final usage event
    bool text = false;
    int64_t logprobs = -1;
    for (const auto& choice : *ch) {
      if (!choice.is_object()) continue;
      const nlohmann::json* piece = nullptr;
      if (auto tx = choice.find("text"); tx != choice.end() && tx->is_string()) {
        piece = &*tx;
      } else if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
        if (auto ct = d->find("content"); ct != d->end() && ct->is_string()) piece = &*ct;
      }
      if (piece && !piece->get_ref<const std::string&>().empty()) {
        text = true;
        if (owner_->options_.keep_text) c->outcome.text += piece->get_ref<const std::string&>();
      }
      if (const int64_t n = LogprobEntries(choice); n >= 0) {
        logprobs = std::max<int64_t>(logprobs, 0) + n;
      }
    }
    StreamOutcome& o = c->outcome;
    ++o.choice_events;
    if (usage_tokens >= 0) ++o.usage_events;
    if (logprobs >= 0) {
      ++o.logprob_events;
    } else if (text) {
      ++o.text_events_without_logprobs;
    }
    int64_t tokens = 0;
    const int64_t counted = static_cast<int64_t>(o.token_times.size());
    switch (owner_->options_.token_count) {
      case TokenCount::kUsage:
        if (usage_tokens < 0) {
          return ProtocolError(c, "token count 'usage': an event with a choice carries no "
                                  "usage.completion_tokens (the server does not send continuous "
                                  "usage stats; use --token-count logprobs or chunks)");
        }
        if (usage_tokens < counted) {
          return ProtocolError(c, "usage.completion_tokens went down from " +
                                      std::to_string(counted) + " to " +
                                      std::to_string(usage_tokens));
        }
        tokens = usage_tokens - counted;
        break;
      case TokenCount::kLogprobs:
        if (logprobs < 0 && text) {
          return ProtocolError(c, "token count 'logprobs': an event with text carries no "
                                  "log-probabilities");
        }
        tokens = std::max<int64_t>(logprobs, 0);
        break;
      case TokenCount::kChunks:
        tokens = text ? 1 : 0;
        break;
    }
    o.token_times.insert(o.token_times.end(), static_cast<size_t>(tokens), c->now);
    owner_->tokens_.fetch_add(tokens, std::memory_order_relaxed);
  }

  void ProtocolError(Conn* c, std::string why) {
    c->stream_error = true;
    c->outcome.error_kind = "protocol";
    c->outcome.error = std::move(why);
  }

  void Write(Conn* c) {
    while (c->out_off < c->out.size()) {
      const ssize_t n =
          send(c->fd, c->out.data() + c->out_off, c->out.size() - c->out_off, MSG_NOSIGNAL);
      if (n > 0) {
        c->out_off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      Broken(c, Errno("send"));
      return;
    }
    Watch(c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
  }

  // The connection failed or closed: finish, retry or drop it.
  void Broken(Conn* c, const std::string& why) {
    if (!c->has_request) {
      CloseConn(c);
      return;
    }
    if (c->reused && !c->got_bytes && !c->retried) {
      const uint64_t index = c->outcome.index;
      std::string body = std::move(c->body);
      CloseConn(c);
      Begin(index, std::move(body), /*fresh_only=*/true, /*retried=*/true);
      return;
    }
    if (c->resp && c->resp->headers_done() && c->resp->FinishAtEof()) {
      Finish(c, /*reusable=*/false);
      return;
    }
    c->outcome.done = Now();
    if (c->outcome.error_kind.empty()) {
      c->outcome.error_kind = c->got_bytes ? "incomplete" : "connect";
      c->outcome.error = why;
    }
    c->outcome.success = false;
    StreamOutcome o = std::move(c->outcome);
    o.http_status = c->resp ? c->resp->status() : 0;
    CloseConn(c);
    owner_->on_done_(std::move(o));
  }

  void Finish(Conn* c, bool reusable) {
    StreamOutcome o = std::move(c->outcome);
    o.done = c->now;
    o.http_status = c->resp->status();
    if (o.http_status != 200) {
      o.error_kind = "http_" + std::to_string(o.http_status);
      auto j = nlohmann::json::parse(c->resp->body(), nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
          j["error"].contains("message") && j["error"]["message"].is_string()) {
        o.error = j["error"]["message"].get<std::string>();
      } else {
        o.error = c->resp->body().substr(0, 300);
      }
    } else if (o.error_kind.empty() && !c->saw_done) {
      o.error_kind = "incomplete";
      o.error = "stream ended without data: [DONE]";
    }
    o.success = o.error_kind.empty();
    c->has_request = false;
    c->resp.reset();
    c->body.clear();
    if (reusable && c->resp == nullptr && !c->stream_error) {
      c->state = Conn::State::kIdle;
      Watch(c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
      idle_.push_back(c);
    } else {
      CloseConn(c);
    }
    owner_->on_done_(std::move(o));
  }

  void Read(Conn* c) {
    char buf[65536];
    while (true) {
      const ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
      if (n > 0) {
        c->now = Now();
        if (!c->has_request) {  // bytes on an idle connection: not ours to take
          CloseConn(c);
          return;
        }
        c->got_bytes = true;
        if (!c->resp->Feed(std::string_view(buf, static_cast<size_t>(n)))) {
          c->outcome.error_kind = "protocol";
          c->outcome.error = c->resp->error();
          c->outcome.done = c->now;
          StreamOutcome o = std::move(c->outcome);
          o.http_status = c->resp->status();
          CloseConn(c);
          owner_->on_done_(std::move(o));
          return;
        }
        if (c->resp->complete()) {
          Finish(c, c->resp->keep_alive());
          return;
        }
        continue;
      }
      if (n == 0) {
        c->now = Now();
        Broken(c, "connection closed by the server");
        return;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      c->now = Now();
      Broken(c, Errno("recv"));
      return;
    }
  }

  void CheckTimeouts() {
    const auto now = SteadyClock::now();
    std::vector<Conn*> expired;
    for (auto& [id, c] : conns_) {
      if (c->has_request && now > c->deadline) expired.push_back(c.get());
    }
    for (Conn* c : expired) {
      StreamOutcome o = std::move(c->outcome);
      o.done = Now();
      o.http_status = c->resp ? c->resp->status() : 0;
      o.error_kind = "timeout";
      o.error = "no complete response within " +
                std::to_string(owner_->options_.request_timeout.count()) + " ms";
      CloseConn(c);
      owner_->on_done_(std::move(o));
    }
  }

  void Loop() {
    epoll_event events[256];
    auto last_check = SteadyClock::now();
    while (!stop_.load()) {
      const int n = epoll_wait(epfd_, events, 256, 50);
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        if (id == 0) {
          uint64_t v;
          ssize_t r = read(efd_, &v, sizeof(v));
          (void)r;
          continue;
        }
        auto it = conns_.find(id);
        if (it == conns_.end()) continue;  // closed earlier in this batch
        Conn* c = it->second.get();
        const uint32_t ev = events[i].events;
        if (c->state == Conn::State::kConnecting) {
          int err = 0;
          socklen_t len = sizeof(err);
          getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
          if (err != 0) {
            errno = err;
            Broken(c, Errno("connect"));
            continue;
          }
          if (!(ev & EPOLLOUT)) continue;
          c->state = Conn::State::kActive;
          c->outcome.sent = Now();
          c->deadline = SteadyClock::now() + owner_->options_.request_timeout;
          Write(c);
          continue;
        }
        if (c->state == Conn::State::kIdle) {
          // The server closed (or wrote to) an idle connection.
          CloseConn(c);
          continue;
        }
        if (ev & EPOLLOUT) Write(c);
        if (conns_.find(id) == conns_.end()) continue;
        if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) Read(c);
      }
      std::vector<std::pair<uint64_t, std::string>> work;
      {
        std::lock_guard<std::mutex> lock(mu_);
        work.swap(pending_);
      }
      for (auto& [index, body] : work) Begin(index, std::move(body), false, false);
      const auto now = SteadyClock::now();
      if (now - last_check > std::chrono::milliseconds(50)) {
        CheckTimeouts();
        last_check = now;
      }
    }
    // Stop: everything in flight or pending is cancelled.
    std::vector<Conn*> all;
    for (auto& [id, c] : conns_) all.push_back(c.get());
    for (Conn* c : all) {
      if (c->has_request) {
        StreamOutcome o = std::move(c->outcome);
        o.done = Now();
        o.error_kind = "cancelled";
        o.error = "the benchmark stopped";
        CloseConn(c);
        owner_->on_done_(std::move(o));
      } else {
        CloseConn(c);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [index, body] : pending_) {
      StreamOutcome o;
      o.index = index;
      o.sent = o.done = Now();
      o.error_kind = "cancelled";
      o.error = "the benchmark stopped";
      owner_->on_done_(std::move(o));
    }
    pending_.clear();
  }

  StreamClient* owner_;
  sockaddr_storage addr_;
  socklen_t addr_len_;
  int epfd_ = -1, efd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::pair<uint64_t, std::string>> pending_;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  uint64_t last_id_ = 0;
  std::vector<Conn*> idle_;
  std::string connect_error_;
};

StreamClient::StreamClient(HttpTarget target, Options options, DoneFn on_done)
    : target_(std::move(target)), options_(options), on_done_(std::move(on_done)) {}

StreamClient::~StreamClient() { Stop(); }

Status StreamClient::Start() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc =
      getaddrinfo(target_.host.c_str(), std::to_string(target_.port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return NotFound("cannot resolve '" + target_.host + "': " + gai_strerror(rc));
  }
  sockaddr_storage addr{};
  std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
  const socklen_t len = static_cast<socklen_t>(res->ai_addrlen);
  freeaddrinfo(res);
  const int n = std::max(1, options_.io_threads);
  for (int i = 0; i < n; ++i) {
    threads_.push_back(std::make_unique<IoThread>(this, addr, len));
    PW_RETURN_IF_ERROR(threads_.back()->Start());
  }
  return Status::Ok();
}

void StreamClient::Submit(uint64_t index, std::string body) {
  const uint64_t t = next_thread_.fetch_add(1) % threads_.size();
  threads_[t]->Submit(index, std::move(body));
}

void StreamClient::Stop() {
  for (auto& t : threads_) t->Stop();
  threads_.clear();
}

}  // namespace pw::loadgen
