// FakeSseServer: a streaming completions server on loopback with fixed delays, for testing the
// load generator against known timings. Each POST gets a 200 SSE response: the first content
// event `ttft` after the request's last byte arrived, then one event every `itl` (times taken
// against the first event, so delays do not accumulate), max_tokens events in all, a usage
// event, and data: [DONE]. Connections are kept alive. It records, per request, when the
// request arrived and when each event was written (steady clock).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace pw::loadgen::testing {

class FakeSseServer {
 public:
  using Clock = std::chrono::steady_clock;
  struct Served {
    Clock::time_point arrived;
    std::vector<Clock::time_point> events;  // right before each content event's send()
    int64_t max_tokens = 0;
    std::vector<int32_t> prompt;  // token ids when the prompt was a list of ids
  };

  FakeSseServer(std::chrono::microseconds ttft, std::chrono::microseconds itl);
  ~FakeSseServer();
  uint16_t port() const { return port_; }
  std::vector<Served> served() const;
  int connections() const { return connections_.load(); }

 private:
  void Accept();
  void Serve(int fd);
  std::chrono::microseconds ttft_, itl_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread accept_;
  std::mutex mu_;
  std::vector<std::thread> workers_;
  mutable std::mutex served_mu_;
  std::vector<Served> served_;
};

}  // namespace pw::loadgen::testing
