// ExpertCache: which experts of each MoE layer are resident under a per-layer capacity, and
// the eviction state of one rule (miss_config.h: LFU with decayed counts, LRU, score EMA).
//
// Each layer has its own clock, advanced once per token of that layer (BeginToken), and its
// own capacity: a budget of a fraction f of the expert blocks is round(f * E) experts in every
// layer. Because layers never compete for room, the order in which layers are visited does
// not matter: a forward pass over a whole window (layer by layer, every token of the window
// in each) and token-by-token decode see the same per-layer sequence of events and reach the
// same states.
//
// Insert may temporarily exceed the capacity when every resident expert is pinned (the token
// being decided holds them); the next BeginToken of the layer trims back to the capacity.
// Single-threaded; no allocation after construction.
#pragma once

#include <cstdint>
#include <vector>

#include "policies/misses/miss_config.h"

namespace pw::misses {

class ExpertCache {
 public:
  // capacity in [0, num_experts] experts per layer; decay as in MissConfig.
  ExpertCache(int num_layers, int num_experts, int capacity, Eviction eviction, double decay);

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  int capacity() const { return capacity_; }
  bool IsResident(int layer, int expert) const { return resident_[Idx(layer, expert)] != 0; }
  int ResidentCount(int layer) const { return count_[static_cast<size_t>(layer)]; }

  // Starts the next token of `layer`: advances its clock; with kScoreEma folds the token's
  // router probabilities probs [E] into the moving averages (probs may be null otherwise).
  // Experts evicted to trim an overflow are appended to *evicted.
  void BeginToken(int layer, const float* probs, std::vector<int32_t>* evicted);
  // Records a use of a resident expert at the layer's current token (LRU time, LFU count).
  void Use(int layer, int expert);
  // Makes `expert` resident; when the layer is full, evicts the rule's victim among the
  // residents not flagged in pinned [E] (may be null) and returns it, else returns -1. With
  // every resident pinned it inserts over capacity and returns -1. Already resident: -1.
  int32_t Insert(int layer, int expert, const uint8_t* pinned);
  // Removes an expert (no-op when absent).
  void Remove(int layer, int expert);
  // The rule's victim among unpinned residents of `layer`, or -1 when there is none.
  int32_t Victim(int layer, const uint8_t* pinned) const;

 private:
  size_t Idx(int layer, int expert) const {
    return static_cast<size_t>(layer) * static_cast<size_t>(num_experts_) + static_cast<size_t>(expert);
  }
  double LfuValue(size_t i, int64_t now) const;

  int num_layers_, num_experts_, capacity_;
  Eviction eviction_;
  double decay_;
  double log_decay_;
  std::vector<uint8_t> resident_;   // [L, E]
  std::vector<int> count_;          // [L] residents
  std::vector<int64_t> clock_;      // [L] tokens seen
  std::vector<int64_t> last_use_;   // [L, E] LRU: clock of last use; LFU: clock of count_val_
  std::vector<double> count_val_;   // [L, E] LFU: decayed count as of last_use_
  std::vector<double> ema_;         // [L, E] score EMA
};

}  // namespace pw::misses
