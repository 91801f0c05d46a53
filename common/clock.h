// Time source for liveness, leases and fault delays, injectable so tests never sleep.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace pw {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic milliseconds since an arbitrary origin.
  virtual uint64_t NowMs() const = 0;
};

// std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  uint64_t NowMs() const override {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
  // Process-wide instance.
  static SteadyClock* Get() {
    static SteadyClock clock;
    return &clock;
  }
};

// A clock that moves only when told to (tests). Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(uint64_t start_ms = 1000) : now_(start_ms) {}
  uint64_t NowMs() const override { return now_.load(); }
  void Advance(uint64_t ms) { now_.fetch_add(ms); }
  void Set(uint64_t ms) { now_.store(ms); }

 private:
  std::atomic<uint64_t> now_;
};

}  // namespace pw
