// MainLoopBeat: the liveness of a process's main loop, for a Kubernetes livenessProbe (/live).
//
// The loop stamps it on every iteration, including those that only waited in a bounded poll
// (every service loop polls with a timeout of at most 100 ms), so its age is how long the loop
// has not come round. An HTTP thread answering /metrics says only that the HTTP thread runs: a
// process whose main loop is deadlocked, spinning in one step or stopped keeps answering it.
// /live answers from the beat instead: alive while the last beat is younger than `stale_ms`.
// Before the first beat (the model loading, the store mapping) it is "starting" and fails, so
// the startupProbe, which probes /live too, is what allows for the load.
//
// A process with another loop whose standstill also means it cannot serve (the prefill
// worker's compute thread: a frozen one leaves every prompt queued while the control loop
// keeps heartbeating) gives that loop a beat of its own and has the main one watch it
// (Watch): /live then fails when either has not come round.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "common/clock.h"
#include "common/formats/options.h"

namespace pw::service {

// The default of the option below: well above the longest step of a loop (a prefill forward
// pass over max_batch_tokens on CPU takes seconds), well below a probe's patience.
inline constexpr int64_t kDefaultMainLoopStaleMs = 30000;

// Declares `main_loop_stale_ms` (--main-loop-stale-ms), the beat's age at which /live fails,
// in a process's options table; every process with a /live declares it through this.
void DeclareMainLoopStaleOption(options::OptionSet* s, int64_t* stale_ms);

class MainLoopBeat {
 public:
  // `name`: the loop, in NotLive's reasons ("main loop", "compute loop").
  explicit MainLoopBeat(int64_t stale_ms = kDefaultMainLoopStaleMs,
                        const Clock* clock = SteadyClock::Get(), std::string name = "main loop")
      : clock_(clock), stale_ms_(stale_ms), name_(std::move(name)) {}

  // The main loop, once per iteration. Any thread may read the beat meanwhile.
  void Beat() { last_ms_.store(clock_->NowMs() + 1, std::memory_order_relaxed); }

  // "" while alive; otherwise why not: "starting: the main loop has not run yet", or "the main
  // loop has not come round for N ms (main_loop_stale_ms M)".
  std::string NotLive() const;
  // NotLive also fails, with `other`'s reason, while `other` (which must outlive this) does.
  // Set before any thread reads the beat.
  void Watch(const MainLoopBeat* other) { watched_ = other; }

  int64_t stale_ms() const { return stale_ms_; }

 private:
  const Clock* clock_;
  int64_t stale_ms_;
  std::string name_;
  const MainLoopBeat* watched_ = nullptr;
  std::atomic<uint64_t> last_ms_{0};  // NowMs() + 1 of the last beat; 0: none yet
};

}  // namespace pw::service
