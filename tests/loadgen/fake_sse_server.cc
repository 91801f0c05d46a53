#include "tests/loadgen/fake_sse_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

namespace pw::loadgen::testing {

FakeSseServer::FakeSseServer(std::chrono::microseconds ttft, std::chrono::microseconds itl)
    : ttft_(ttft), itl_(itl) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  listen(listen_fd_, 512);
  socklen_t len = sizeof(a);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  accept_ = std::thread([this] { Accept(); });
}

FakeSseServer::~FakeSseServer() {
  stop_.store(true);
  accept_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& t : workers_) t.join();
  close(listen_fd_);
}

std::vector<FakeSseServer::Served> FakeSseServer::served() const {
  std::lock_guard<std::mutex> lock(served_mu_);
  return served_;
}

void FakeSseServer::Accept() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    connections_.fetch_add(1);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mu_);
    workers_.emplace_back([this, fd] { Serve(fd); });
  }
}

void FakeSseServer::Serve(int fd) {
  std::string buf;
  char tmp[65536];
  auto send_all = [fd](const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  };
  auto chunk = [](const std::string& data) {
    char h[32];
    std::snprintf(h, sizeof(h), "%zx\r\n", data.size());
    return std::string(h) + data + "\r\n";
  };
  while (!stop_.load()) {
    // One request: headers, then Content-Length bytes of body.
    size_t head_end;
    while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) {
        if (stop_.load()) break;
        continue;
      }
      const ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
      if (n <= 0) {
        close(fd);
        return;
      }
      buf.append(tmp, static_cast<size_t>(n));
    }
    if (stop_.load()) break;
    const std::string head = buf.substr(0, head_end);
    size_t cl = 0;
    if (size_t p = head.find("Content-Length: "); p != std::string::npos) {
      cl = std::stoul(head.substr(p + 16));
    }
    while (buf.size() < head_end + 4 + cl) {
      const ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
      if (n <= 0) {
        close(fd);
        return;
      }
      buf.append(tmp, static_cast<size_t>(n));
    }
    Served s;
    s.arrived = Clock::now();
    const auto body = nlohmann::json::parse(buf.substr(head_end + 4, cl), nullptr, false);
    buf.erase(0, head_end + 4 + cl);
    s.max_tokens =
        body.is_object() && body.contains("max_tokens") ? body["max_tokens"].get<int64_t>() : 1;
    if (body.is_object() && body.contains("prompt") && body["prompt"].is_array()) {
      for (const auto& t : body["prompt"]) s.prompt.push_back(t.get<int32_t>());
    }
    if (!send_all("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                  "Transfer-Encoding: chunked\r\n\r\n")) {
      break;
    }
    const auto first = s.arrived + ttft_;
    bool ok = true;
    for (int64_t i = 0; i < s.max_tokens && ok; ++i) {
      std::this_thread::sleep_until(first + i * itl_);
      s.events.push_back(Clock::now());  // just before the bytes go: the client cannot be earlier
      ok = send_all(
          chunk("data: {\"choices\":[{\"index\":0,\"text\":\"t" + std::to_string(i) + "\"}]}\n\n"));
    }
    // Recorded before the last bytes go: a client that has them all finds its request here.
    {
      std::lock_guard<std::mutex> lock(served_mu_);
      served_.push_back(s);
    }
    ok = ok && send_all(chunk("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,"
                              "\"completion_tokens\":" +
                              std::to_string(s.max_tokens) + "}}\n\ndata: [DONE]\n\n") +
                        "0\r\n\r\n");
    if (!ok) break;
  }
  close(fd);
}

}  // namespace pw::loadgen::testing
