// MainLoopBeat: the liveness of a process's main loop, for a Kubernetes livenessProbe (/live).
//
// The loop stamps it on every iteration, including those that only waited in a bounded poll
// (every service loop polls with a timeout of at most 100 ms), so its age is how long the loop
// has not come round. An HTTP thread answering /metrics says only that the HTTP thread runs: a
// process whose main loop is deadlocked, spinning in one step or stopped keeps answering it.
// /live answers from the beat instead: alive while the last beat is younger than `stale_ms`.
// Before the first beat (the model loading, the store mapping) it is "starting" and fails, so
// the startupProbe, which probes /live too, is what allows for the load.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

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
  explicit MainLoopBeat(int64_t stale_ms = kDefaultMainLoopStaleMs,
                        const Clock* clock = SteadyClock::Get())
      : clock_(clock), stale_ms_(stale_ms) {}

  // The main loop, once per iteration. Any thread may read the beat meanwhile.
  void Beat() { last_ms_.store(clock_->NowMs() + 1, std::memory_order_relaxed); }

  // "" while alive; otherwise why not: "starting: the main loop has not run yet", or "the main
  // loop has not come round for N ms (main_loop_stale_ms M)".
  std::string NotLive() const;

  int64_t stale_ms() const { return stale_ms_; }

 private:
  const Clock* clock_;
  int64_t stale_ms_;
  std::atomic<uint64_t> last_ms_{0};  // NowMs() + 1 of the last beat; 0: none yet
};

}  // namespace pw::service
