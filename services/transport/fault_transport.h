// FaultInjectingTransport: a decorator that wraps any Transport and injects failures on the
// frames it sends, so failure handling is tested without real faults.
//
// Per sent frame, in order: after `fail_after` successful sends every Send fails with
// kUnavailable (a dead link); with probability drop_rate the frame vanishes (Send still says
// OK, as a lossy network would); with probability corrupt_rate one random byte is overwritten
// or the frame is truncated; with delay_ms > 0 the frame is held and forwarded once the clock
// reaches send time + delay_ms (checked on every Send and Recv call). Received frames pass
// through unchanged. Deterministic for a given seed.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <random>

#include "common/clock.h"
#include "services/transport/transport.h"

namespace pw::transport {

struct FaultConfig {
  double drop_rate = 0.0;     // probability in [0, 1]
  double corrupt_rate = 0.0;  // probability in [0, 1]
  uint64_t delay_ms = 0;      // added latency per frame
  int64_t fail_after = -1;    // sends that succeed before the link fails; -1 = never
  uint64_t seed = 1;
};

struct FaultCounters {
  uint64_t sent = 0;       // frames forwarded to the inner transport
  uint64_t dropped = 0;
  uint64_t corrupted = 0;
  uint64_t delayed = 0;
  uint64_t failed = 0;     // Send calls refused by fail_after
};

class FaultInjectingTransport final : public Transport {
 public:
  // `clock` must outlive this object.
  FaultInjectingTransport(std::unique_ptr<Transport> inner, FaultConfig config, const Clock* clock);

  Status Send(std::string_view peer, std::string_view bytes) override;
  Result<std::optional<Frame>> Recv(int timeout_ms) override;
  std::string Describe() const override { return "faulty(" + inner_->Describe() + ")"; }
  Status Reconnect() override { return inner_->Reconnect(); }

  const FaultCounters& counters() const { return counters_; }
  void set_config(const FaultConfig& config) { config_ = config; }
  // Forwards held frames whose time has come. Returns the first inner Send error, if any.
  Status FlushDue();

 private:
  struct Held {
    uint64_t due_ms;
    std::string peer;
    std::string bytes;
  };
  std::unique_ptr<Transport> inner_;
  FaultConfig config_;
  const Clock* clock_;
  std::mt19937_64 rng_;
  std::deque<Held> held_;
  int64_t successful_sends_ = 0;
  FaultCounters counters_;
};

}  // namespace pw::transport
