// PeerLiveness: who has been heard from recently. A peer silent for `dead_after_beats`
// heartbeat intervals (3 by default, DESIGN.md section 2) is dead: the intervals of the longer
// of the two sides' heartbeats, since a peer that beats every 500 ms is not silent for a side
// that beats every 100 ms until 1500 ms have passed. A peer's own interval is the one it
// declares (Register's and RegisterAck's heartbeatIntervalMs), capped at kMaxPeerHeartbeatMs
// so that no declared figure keeps a dead peer alive for long.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"

namespace pw::transport {

// The longest heartbeat interval a peer's declaration is taken at (the options' bound).
inline constexpr uint64_t kMaxPeerHeartbeatMs = 60000;

class PeerLiveness {
 public:
  // heartbeat_ms: this side's interval between heartbeats; until a peer declares its own, it
  // is dead when now - last_heard > dead_after_beats * heartbeat_ms.
  PeerLiveness(const Clock* clock, uint64_t heartbeat_ms, uint32_t dead_after_beats = 3)
      : clock_(clock), heartbeat_ms_(heartbeat_ms), dead_after_beats_(dead_after_beats) {}

  // Records that `peer` was heard from now (adds it if new, at this side's timeout).
  void Touch(const std::string& peer) {
    auto [it, added] = peers_.try_emplace(peer, Entry{0, timeout_ms()});
    it->second.last_heard_ms = clock_->NowMs();
  }
  // `peer` beats every `peer_heartbeat_ms` (0: not declared): from now on its silence is judged
  // by dead_after_beats of max(ours, min(that, kMaxPeerHeartbeatMs)). Adds it if new.
  void SetPeerInterval(const std::string& peer, uint64_t peer_heartbeat_ms) {
    auto [it, added] = peers_.try_emplace(peer, Entry{clock_->NowMs(), 0});
    it->second.timeout_ms =
        dead_after_beats_ * std::max(heartbeat_ms_, std::min(peer_heartbeat_ms, kMaxPeerHeartbeatMs));
  }
  void Remove(const std::string& peer) { peers_.erase(peer); }
  bool Contains(const std::string& peer) const { return peers_.count(peer) != 0; }
  // Milliseconds since `peer` was last heard (0 if unknown).
  uint64_t SilentMs(const std::string& peer) const;
  // Removes and returns every peer silent for longer than its timeout, with that timeout.
  struct Dead {
    std::string peer;
    uint64_t timeout_ms;
  };
  std::vector<Dead> TakeDead();
  // This side's own timeout (dead_after_beats of its interval): a peer's until it declares one.
  uint64_t timeout_ms() const { return dead_after_beats_ * heartbeat_ms_; }
  size_t size() const { return peers_.size(); }

 private:
  struct Entry {
    uint64_t last_heard_ms;
    uint64_t timeout_ms;
  };
  const Clock* clock_;
  uint64_t heartbeat_ms_;
  uint64_t dead_after_beats_;
  std::map<std::string, Entry> peers_;
};

inline uint64_t PeerLiveness::SilentMs(const std::string& peer) const {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return 0;
  uint64_t now = clock_->NowMs();
  return now > it->second.last_heard_ms ? now - it->second.last_heard_ms : 0;
}

inline std::vector<PeerLiveness::Dead> PeerLiveness::TakeDead() {
  std::vector<Dead> dead;
  const uint64_t now = clock_->NowMs();
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (now > it->second.last_heard_ms && now - it->second.last_heard_ms > it->second.timeout_ms) {
      dead.push_back({it->first, it->second.timeout_ms});
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
  return dead;
}

}  // namespace pw::transport
