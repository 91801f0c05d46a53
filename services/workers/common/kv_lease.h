// KvLeaseTable: KV blocks a decode worker reserved for a request that prefill is still filling.
//
// A lease holds block ids from the decode worker's pool between KvReserve and StartDecode. It
// ends in exactly one of three ways: taken by StartDecode (blocks go to the engine), cancelled
// (blocks freed), or expired at `expires_ms` (blocks freed), so an abandoned request never
// strands blocks (DESIGN.md section 2, lessons). While its request is on its way (queued behind
// other prompts at the prefill worker, or prefilled and waiting for a decode slot) the router
// renews it (KvRenew), so only a lease the router forgot runs out. The table only tracks ids;
// the owner frees.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <optional>
#include <vector>

#include "common/clock.h"

namespace pw::workers {

struct KvLease {
  uint64_t lease_id = 0;
  uint64_t request_id = 0;
  std::vector<int32_t> blocks;  // in sequence order
  uint64_t expires_ms = 0;      // clock time at which the blocks return to the pool
  uint32_t max_tokens = 0;      // tokens to generate after the prompt (0: not said)
};

class KvLeaseTable {
 public:
  explicit KvLeaseTable(const Clock* clock) : clock_(clock) {}

  // Records a lease of `blocks` for `request_id` lasting `lease_ms`; returns its id (never 0).
  uint64_t Add(uint64_t request_id, std::vector<int32_t> blocks, uint64_t lease_ms, uint32_t max_tokens = 0) {
    KvLease l;
    l.max_tokens = max_tokens;
    l.lease_id = next_id_++;
    l.request_id = request_id;
    l.blocks = std::move(blocks);
    l.expires_ms = clock_->NowMs() + lease_ms;
    reserved_blocks_ += l.blocks.size();
    const uint64_t id = l.lease_id;
    leases_.emplace(id, std::move(l));
    return id;
  }
  // Removes and returns lease `lease_id` if it exists and belongs to `request_id`.
  std::optional<KvLease> Take(uint64_t lease_id, uint64_t request_id) {
    auto it = leases_.find(lease_id);
    if (it == leases_.end() || it->second.request_id != request_id) return std::nullopt;
    return Erase(it);
  }
  // Lease `lease_id` of `request_id` now expires no sooner than `lease_ms` from now; false when
  // there is no such lease (taken, ended, or another request's).
  bool Renew(uint64_t lease_id, uint64_t request_id, uint64_t lease_ms) {
    auto it = leases_.find(lease_id);
    if (it == leases_.end() || it->second.request_id != request_id) return false;
    it->second.expires_ms = std::max(it->second.expires_ms, clock_->NowMs() + lease_ms);
    return true;
  }
  // Removes and returns every lease of `request_id`.
  std::vector<KvLease> TakeByRequest(uint64_t request_id) {
    std::vector<KvLease> out;
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.request_id == request_id) {
        out.push_back(Erase(it++));
      } else {
        ++it;
      }
    }
    return out;
  }
  // Removes and returns the leases whose time is up.
  std::vector<KvLease> TakeExpired() {
    std::vector<KvLease> out;
    const uint64_t now = clock_->NowMs();
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.expires_ms <= now) {
        out.push_back(Erase(it++));
      } else {
        ++it;
      }
    }
    return out;
  }
  // Removes and returns the leases `pred` picks.
  template <typename Pred>
  std::vector<KvLease> TakeIf(Pred pred) {
    std::vector<KvLease> out;
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (pred(it->second)) {
        out.push_back(Erase(it++));
      } else {
        ++it;
      }
    }
    return out;
  }
  std::vector<KvLease> TakeAll() {
    std::vector<KvLease> out;
    while (!leases_.empty()) out.push_back(Erase(leases_.begin()));
    return out;
  }
  size_t size() const { return leases_.size(); }
  const std::map<uint64_t, KvLease>& all() const { return leases_; }
  // Sum of blocks over live leases.
  size_t reserved_blocks() const { return reserved_blocks_; }

 private:
  KvLease Erase(std::map<uint64_t, KvLease>::iterator it) {
    KvLease l = std::move(it->second);
    leases_.erase(it);
    reserved_blocks_ -= l.blocks.size();
    return l;
  }
  // Lease ids start at a random point (below 2^62, never 0) so a restarted decode worker does
  // not hand out the ids of its previous life, which stale KvReady/StartDecode frames may name.
  static uint64_t FirstId() {
    std::random_device rd;
    const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    return (r & ((uint64_t{1} << 62) - 1)) | 1;
  }
  const Clock* clock_;
  uint64_t next_id_ = FirstId();
  size_t reserved_blocks_ = 0;
  std::map<uint64_t, KvLease> leases_;
};

}  // namespace pw::workers
