#include "policies/misses/expert_cache.h"

#include <cmath>

#include "common/status.h"

namespace pw::misses {

ExpertCache::ExpertCache(int num_layers, int num_experts, int capacity, Eviction eviction,
                         double decay)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      capacity_(capacity),
      eviction_(eviction),
      decay_(decay),
      log_decay_(std::log(decay)) {
  PW_CHECK(num_layers > 0 && num_experts > 0 && capacity >= 0 && capacity <= num_experts);
  const size_t n = static_cast<size_t>(num_layers) * static_cast<size_t>(num_experts);
  resident_.assign(n, 0);
  count_.assign(static_cast<size_t>(num_layers), 0);
  clock_.assign(static_cast<size_t>(num_layers), 0);
  last_use_.assign(n, -1);
  count_val_.assign(n, 0.0);
  ema_.assign(n, 0.0);
}

double ExpertCache::LfuValue(size_t i, int64_t now) const {
  if (last_use_[i] < 0) return 0.0;
  return count_val_[i] * std::exp(log_decay_ * static_cast<double>(now - last_use_[i]));
}

void ExpertCache::BeginToken(int layer, const float* probs, std::vector<int32_t>* evicted) {
  const size_t l = static_cast<size_t>(layer);
  clock_[l]++;
  if (eviction_ == Eviction::kScoreEma && probs != nullptr) {
    double* s = ema_.data() + Idx(layer, 0);
    for (int e = 0; e < num_experts_; ++e) {
      s[e] = decay_ * s[e] + (1.0 - decay_) * static_cast<double>(probs[e]);
    }
  }
  while (count_[l] > capacity_) {
    const int32_t v = Victim(layer, nullptr);
    if (v < 0) break;
    Remove(layer, v);
    if (evicted != nullptr) evicted->push_back(v);
  }
}

void ExpertCache::Use(int layer, int expert) {
  const size_t i = Idx(layer, expert);
  const int64_t now = clock_[static_cast<size_t>(layer)];
  if (eviction_ == Eviction::kLfu) {
    count_val_[i] = LfuValue(i, now) + 1.0;
  }
  last_use_[i] = now;
}

int32_t ExpertCache::Victim(int layer, const uint8_t* pinned) const {
  const int64_t now = clock_[static_cast<size_t>(layer)];
  int32_t best = -1;
  double best_key = 0.0;
  for (int e = 0; e < num_experts_; ++e) {
    const size_t i = Idx(layer, e);
    if (!resident_[i] || (pinned != nullptr && pinned[e])) continue;
    double key = 0.0;  // lower leaves first
    switch (eviction_) {
      case Eviction::kLfu: key = LfuValue(i, now); break;
      case Eviction::kLru: key = static_cast<double>(last_use_[i]); break;
      case Eviction::kScoreEma: key = ema_[i]; break;
    }
    if (best < 0 || key < best_key) {
      best = e;
      best_key = key;
    }
  }
  return best;
}

int32_t ExpertCache::Insert(int layer, int expert, const uint8_t* pinned) {
  const size_t i = Idx(layer, expert);
  if (resident_[i]) return -1;
  const size_t l = static_cast<size_t>(layer);
  int32_t victim = -1;
  if (count_[l] >= capacity_) {
    victim = Victim(layer, pinned);
    if (victim >= 0) Remove(layer, victim);
  }
  resident_[i] = 1;
  count_[l]++;
  // A newly resident expert starts with no history: LRU/LFU see it at the current clock.
  if (eviction_ == Eviction::kLfu) count_val_[i] = LfuValue(i, clock_[l]);
  last_use_[i] = clock_[l];
  return victim;
}

void ExpertCache::Remove(int layer, int expert) {
  const size_t i = Idx(layer, expert);
  if (!resident_[i]) return;
  resident_[i] = 0;
  count_[static_cast<size_t>(layer)]--;
}

}  // namespace pw::misses
