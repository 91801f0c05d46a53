// A minimal blocking HTTP/1.1 client over POSIX sockets for router tests: it sends raw bytes
// (so tests can send malformed requests) and reads one response (Content-Length or chunked).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pw::router::testing {

struct ClientResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // de-chunked
  std::vector<std::string> chunks;             // chunk payloads, for chunked responses
};

class TestConnection {
 public:
  explicit TestConnection(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
    int one = 1;
    if (fd_ >= 0) setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~TestConnection() { Close(); }
  TestConnection(const TestConnection&) = delete;
  TestConnection& operator=(const TestConnection&) = delete;

  bool ok() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Sends everything; false if the peer closed.
  bool Send(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // True if the server closed the connection (EOF or reset) within `timeout_ms`, with no bytes.
  bool WaitClosed(int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now())
                                      .count());
      if (::poll(&p, 1, std::max(1, left)) <= 0) continue;
      char c;
      ssize_t n = ::recv(fd_, &c, 1, 0);
      if (n <= 0) return true;
      buf_.push_back(c);
    }
    return false;
  }

  // Everything the server sends until it closes the connection (what Read already buffered
  // included); nullopt if it is still open after `timeout_ms`.
  std::optional<std::string> ReadToClose(int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now())
                                      .count());
      if (::poll(&p, 1, std::max(1, left)) <= 0) continue;
      char tmp[65536];
      ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
      if (n <= 0) {
        std::string out = std::move(buf_);
        buf_.clear();
        return out;
      }
      buf_.append(tmp, static_cast<size_t>(n));
    }
    return std::nullopt;
  }

  // True once some bytes arrived (kept for Read) within `timeout_ms`.
  bool WaitForData(int timeout_ms) {
    deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    return !buf_.empty() || Fill();
  }

  // Reads one response; nullopt on timeout or a connection closed before a full response.
  std::optional<ClientResponse> Read(int timeout_ms = 10000) {
    deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    ClientResponse r;
    std::string head;
    if (!ReadUntil("\r\n\r\n", &head)) return std::nullopt;
    // Status line.
    size_t sp = head.find(' ');
    if (sp == std::string::npos) return std::nullopt;
    r.status = std::atoi(head.c_str() + sp + 1);
    size_t pos = head.find("\r\n") + 2;
    while (pos < head.size()) {
      size_t end = head.find("\r\n", pos);
      if (end == std::string::npos || end == pos) break;
      std::string line = head.substr(pos, end - pos);
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        size_t v = colon + 1;
        while (v < line.size() && line[v] == ' ') ++v;
        r.headers[name] = line.substr(v);
      }
      pos = end + 2;
    }
    if (r.status == 100) return Read(timeout_ms);
    if (r.headers.count("transfer-encoding")) {
      while (true) {
        std::string size_line;
        if (!ReadUntil("\r\n", &size_line)) return std::nullopt;
        size_t n = std::stoul(size_line, nullptr, 16);
        std::string data;
        if (!ReadExactly(n + 2, &data)) return std::nullopt;
        if (n == 0) break;
        data.resize(n);
        r.chunks.push_back(data);
        r.body += data;
      }
    } else {
      size_t n = r.headers.count("content-length") ? std::stoul(r.headers["content-length"]) : 0;
      if (!ReadExactly(n, &r.body)) return std::nullopt;
    }
    return r;
  }

 private:
  bool Fill() {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline_ - std::chrono::steady_clock::now())
                                    .count());
    if (left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) return false;
    char tmp[65536];
    ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  bool ReadUntil(const std::string& delim, std::string* out) {
    while (true) {
      size_t p = buf_.find(delim);
      if (p != std::string::npos) {
        *out = buf_.substr(0, p + delim.size());
        buf_.erase(0, p + delim.size());
        return true;
      }
      if (!Fill()) return false;
    }
  }
  bool ReadExactly(size_t n, std::string* out) {
    while (buf_.size() < n) {
      if (!Fill()) return false;
    }
    *out = buf_.substr(0, n);
    buf_.erase(0, n);
    return true;
  }

  int fd_ = -1;
  std::string buf_;
  std::chrono::steady_clock::time_point deadline_;
};

// "POST <path>" with a JSON body on keep-alive.
inline std::string PostRequest(const std::string& path, const std::string& body,
                               const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

inline std::string GetRequest(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
}

}  // namespace pw::router::testing
