#include "services/common/main_loop_beat.h"

namespace pw::service {

void DeclareMainLoopStaleOption(options::OptionSet* s, int64_t* stale_ms) {
  s->Add("main_loop_stale_ms", stale_ms,
         "/live (the livenessProbe) fails once the main loop has not come round for this long")
      .Range(100, 3600000);
}

std::string MainLoopBeat::NotLive() const {
  const uint64_t last = last_ms_.load(std::memory_order_relaxed);
  if (last == 0) return "starting: the " + name_ + " has not run yet";
  const uint64_t now = clock_->NowMs() + 1;
  const uint64_t age = now > last ? now - last : 0;
  if (age < static_cast<uint64_t>(stale_ms_)) return watched_ != nullptr ? watched_->NotLive() : "";
  return "the " + name_ + " has not come round for " + std::to_string(age) + " ms (main_loop_stale_ms " +
         std::to_string(stale_ms_) + ")";
}

}  // namespace pw::service
