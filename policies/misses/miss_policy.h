// MissPolicy: decides, token by token, what happens to each selected expert that is not
// resident — fetch it synchronously or substitute a resident one — keeps the residency
// (ExpertCache) and runs background admission (DESIGN.md 5.2; rules in miss_config.h).
//
// Pure: no engine types. The engine's routing hook (engine/hooks/miss_routing_hook.h),
// pw-sim replaying a router-logit trace (trace_replay.h) and the unit tests run the same code.
//
// How a serving process drives it. The policy is the authority on residency: IsResident is
// what the worker's kernels may read without a fetch. Each DecideToken appends what the
// worker must do to events(): kFetch (load now, before the layer's experts run: synchronous),
// kEvict (release at the next safe point: an expert evicted while deciding a later token of
// the same batch may still be read by an earlier token's computation of this step),
// kAdmitRequest (start an asynchronous load). With external admission (SetExternalAdmission)
// the worker calls AdmissionDone when the load has committed, and the expert becomes resident
// then (evicting per the rule, reported as kEvict); otherwise the policy completes admissions
// itself admission_delay tokens of the layer after the request (emulation, pw-sim). The
// caller drains events() after each call (ClearEvents).
//
// Per-token substituted gate mass m = (sum of substituted slots' gate weights) / (sum of the
// token's gate weights); MissStats sums it over (token, layer) pairs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "policies/misses/expert_cache.h"
#include "policies/misses/miss_config.h"

namespace pw::misses {

// One selected expert of a token, rewritten in place by DecideToken.
struct MissSlot {
  int32_t expert = 0;  // in: the selection; out: itself (hit, fetched) or the substitute
  float weight = 0.f;  // gate weight; a substitute keeps the missed expert's weight
};

enum class SlotAction : uint8_t { kHit = 0, kFetched = 1, kSubstituted = 2 };

struct CacheEvent {
  enum Kind : uint8_t { kFetch = 0, kEvict = 1, kAdmitRequest = 2, kAdmitted = 3 };
  Kind kind = kFetch;
  int32_t layer = 0;
  int32_t expert = 0;
};

// Sums over DecideToken calls (one call = one token of one layer).
struct MissStats {
  int64_t token_layers = 0;        // calls
  int64_t slots = 0;               // selected experts seen
  int64_t hits = 0;                // resident when selected
  int64_t misses = 0;              // not resident when selected (= fetches + substitutions)
  int64_t fetches = 0;             // synchronous fetches
  int64_t substitutions = 0;       // misses served by a resident substitute
  int64_t first_choice_substitutions = 0;  // ... of which the token's first choice
  int64_t forced_fetches = 0;      // misses the rule would substitute but no substitute existed
  int64_t admission_requests = 0;  // background admissions started
  int64_t admissions = 0;          // admissions that made an expert resident
  int64_t evictions = 0;           // experts evicted (by fetches and admissions)
  double mass_sum = 0;             // sum over calls of m
  double substituted_weight = 0;   // sum of substituted gate weights
  int64_t tokens_with_substitution = 0;  // calls with m > 0
};

class MissPolicy {
 public:
  // capacity: resident experts per layer, in [top_k, num_experts] (a token must be able to
  // hold all its selections). kInvalidArgument for a bad config or shape.
  static Result<std::unique_ptr<MissPolicy>> Create(const MissConfig& config, int num_layers,
                                                    int num_experts, int top_k, int capacity);

  // Decides one token of `layer`: slots[0, n) are its selections (distinct experts, n <= E),
  // probs [E] its router probabilities (the substitute is the resident expert with the highest
  // probability not among the token's selections; ties: lower id). Rewrites substituted slots'
  // experts, writes actions[n] (may be null), appends events, returns the token's m.
  float DecideToken(int layer, MissSlot* slots, int n, const float* probs, SlotAction* actions);

  bool IsResident(int layer, int expert) const { return cache_.IsResident(layer, expert); }
  // Makes experts resident before any token (a warm start; up to the capacity per layer).
  void WarmStart(int layer, const std::vector<int32_t>& experts);

  // Serving path: admissions complete only through AdmissionDone.
  void SetExternalAdmission(bool on) { external_admission_ = on; }
  // An admission requested earlier has committed: the expert becomes resident now (an evicted
  // victim is reported as kEvict). An expert that is resident already or was not requested
  // is ignored.
  void AdmissionDone(int layer, int expert);

  const std::vector<CacheEvent>& events() const { return events_; }
  void ClearEvents() { events_.clear(); }
  // When off, events are not recorded (emulation and pw-sim need only the statistics).
  void set_record_events(bool on) { record_events_ = on; }

  const MissStats& stats() const { return stats_; }
  void ResetStats() { stats_ = {}; }
  const MissConfig& config() const { return config_; }
  const ExpertCache& cache() const { return cache_; }
  int top_k() const { return top_k_; }

 private:
  MissPolicy(const MissConfig& config, int num_layers, int num_experts, int top_k, int capacity);
  void Emit(CacheEvent::Kind kind, int layer, int expert);
  void Admit(int layer, int expert);
  size_t Idx(int layer, int expert) const {
    return static_cast<size_t>(layer) * static_cast<size_t>(num_experts_) + static_cast<size_t>(expert);
  }

  MissConfig config_;
  int num_experts_, top_k_;
  ExpertCache cache_;
  bool external_admission_ = false;
  bool record_events_ = true;
  std::vector<double> lost_;          // [L, E] gate weight lost to substitution since reset
  std::vector<uint8_t> pending_;      // [L, E] an admission is in flight
  struct Due {
    int32_t expert;
    int64_t clock;  // the layer's clock at which it becomes resident
  };
  std::vector<std::vector<Due>> due_;  // [L] in-flight admissions, request order
  std::vector<int64_t> clock_;        // [L] tokens decided
  std::vector<uint8_t> pinned_;       // [E] the current token's experts
  std::vector<int32_t> scratch_;      // evicted experts of BeginToken
  std::vector<CacheEvent> events_;
  MissStats stats_;
};

}  // namespace pw::misses
