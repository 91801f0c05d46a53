// libFuzzer target: the router's HTTP/1.1 request parsing, end to end over a real loopback
// connection. One HttpServer (port 0, short timeouts) serves a handler that validates
// /v1/completions and /v1/chat/completions bodies with ParseApiRequest; each input is written
// as the raw bytes of a connection, the write side closed, and the reply read. The server must
// answer every input with well-formed HTTP status lines (or close without a reply) and keep
// serving: after each input a clean request must get its 200.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/status.h"
#include "services/router/http_server.h"
#include "services/router/openai_api.h"

namespace {

using namespace pw::router;

HttpServer* Server() {
  static HttpServer* server = [] {
    HttpServerOptions o;
    o.port = 0;
    o.header_timeout = std::chrono::milliseconds(500);
    o.body_timeout = std::chrono::milliseconds(500);
    o.idle_timeout = std::chrono::milliseconds(500);
    o.write_timeout = std::chrono::milliseconds(500);
    o.max_header_bytes = 4096;
    o.max_body_bytes = 16384;
    auto s = HttpServer::Create(o, [](HttpRequest req, std::shared_ptr<HttpExchange> ex) {
      HttpResponse resp;
      const std::string_view path = req.Path();
      if (path == "/v1/completions" || path == "/v1/chat/completions") {
        ApiLimits limits;
        limits.model_name = "tiny-moe";
        auto r = ParseApiRequest(req.body,
                                 path == "/v1/completions" ? Endpoint::kCompletions
                                                           : Endpoint::kChatCompletions,
                                 limits);
        if (auto* e = std::get_if<ApiError>(&r)) {
          resp.status = e->http_status;
          resp.body = ErrorJson(*e);
        } else {
          resp.body = "{}";
        }
      } else if (path == "/health") {
        resp.body = "{\"status\":\"ok\"}";
      } else {
        resp.status = 404;
        resp.body = "{}";
      }
      ex->Respond(std::move(resp));
    });
    PW_CHECK(s.ok());
    (*s)->Start();
    return s->release();
  }();
  return server;
}

// Writes `bytes` on a fresh connection, closes the write side, returns all that came back
// (what arrived within `timeout_s` of silence).
std::string Exchange(const std::string& bytes, int timeout_s = 2) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(Server()->port());
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Two loopback connections per input, thousands per second: the local ports can run out
  // for a moment (EADDRNOTAVAIL while earlier connections sit in TIME_WAIT), which is this
  // harness's limit, not the server's; try again for a while before calling it a failure (also
  // after EINTR: libFuzzer's timeout alarm interrupts a connect that waits).
  int s = -1, err = 0;
  for (int attempt = 0; attempt < 500; ++attempt) {
    s = socket(AF_INET, SOCK_STREAM, 0);
    PW_CHECK(s >= 0);
    timeval tv{timeout_s, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) break;
    err = errno;
    close(s);
    s = -1;
    if (err != EADDRNOTAVAIL && err != EAGAIN && err != EINTR) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  PW_CHECK_MSG(s >= 0, std::strerror(err));
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = send(s, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early (e.g. 431) while we still write
    off += static_cast<size_t>(n);
  }
  shutdown(s, SHUT_WR);
  std::string out;
  char buf[8192];
  ssize_t n;
  while ((n = recv(s, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(s);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string reply = Exchange(std::string(reinterpret_cast<const char*>(data), size));
  // Every reply starts with a status line "HTTP/1.x NNN ".
  if (!reply.empty()) {
    PW_CHECK_MSG(reply.size() >= 13 && reply.compare(0, 7, "HTTP/1.") == 0,
                 reply.substr(0, 64).c_str());
    const int status = std::atoi(reply.c_str() + 9);
    PW_CHECK_MSG(status >= 100 && status < 600, reply.substr(0, 64).c_str());
  }
  // And the server still serves (a few tries: on a loaded machine one reply may be slow).
  std::string ok;
  for (int attempt = 0; attempt < 3 && ok.compare(0, 12, "HTTP/1.1 200") != 0; ++attempt) {
    ok = Exchange("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 10);
  }
  PW_CHECK_MSG(ok.compare(0, 12, "HTTP/1.1 200") == 0, ok.substr(0, 64).c_str());
  return 0;
}

std::vector<std::string> PwFuzzSeeds() {
  const std::string body = R"({"model":"tiny-moe","prompt":"The sea","max_tokens":4})";
  return {
      "GET /health HTTP/1.1\r\nHost: a\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
      "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
      "1f\r\n{\"model\":\"tiny-moe\",\"messages\":\r\n9\r\n[{\"role\":\r\n"
      "1b\r\n\"user\",\"content\":\"hi\"}]}\r\n0\r\n\r\n",
      "GET /health HTTP/1.0\r\n\r\nGET /x HTTP/1.1\r\nHost: b\r\nConnection: keep-alive\r\n\r\n",
  };
}
