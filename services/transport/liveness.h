// PeerLiveness: who has been heard from recently. A peer silent for `dead_after_beats`
// heartbeat intervals (3 by default, DESIGN.md section 2) is dead.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"

namespace pw::transport {

class PeerLiveness {
 public:
  // heartbeat_ms: interval between heartbeats; a peer is dead when now - last_heard >
  // dead_after_beats * heartbeat_ms.
  PeerLiveness(const Clock* clock, uint64_t heartbeat_ms, uint32_t dead_after_beats = 3)
      : clock_(clock), timeout_ms_(heartbeat_ms * dead_after_beats) {}

  // Records that `peer` was heard from now (adds it if new).
  void Touch(const std::string& peer) { last_heard_ms_[peer] = clock_->NowMs(); }
  void Remove(const std::string& peer) { last_heard_ms_.erase(peer); }
  bool Contains(const std::string& peer) const { return last_heard_ms_.count(peer) != 0; }
  // Milliseconds since `peer` was last heard (0 if unknown).
  uint64_t SilentMs(const std::string& peer) const;
  // Removes and returns every peer silent for longer than the timeout.
  std::vector<std::string> TakeDead();
  uint64_t timeout_ms() const { return timeout_ms_; }
  size_t size() const { return last_heard_ms_.size(); }

 private:
  const Clock* clock_;
  uint64_t timeout_ms_;
  std::map<std::string, uint64_t> last_heard_ms_;
};

inline uint64_t PeerLiveness::SilentMs(const std::string& peer) const {
  auto it = last_heard_ms_.find(peer);
  if (it == last_heard_ms_.end()) return 0;
  uint64_t now = clock_->NowMs();
  return now > it->second ? now - it->second : 0;
}

inline std::vector<std::string> PeerLiveness::TakeDead() {
  std::vector<std::string> dead;
  const uint64_t now = clock_->NowMs();
  for (auto it = last_heard_ms_.begin(); it != last_heard_ms_.end();) {
    if (now > it->second && now - it->second > timeout_ms_) {
      dead.push_back(it->first);
      it = last_heard_ms_.erase(it);
    } else {
      ++it;
    }
  }
  return dead;
}

}  // namespace pw::transport
