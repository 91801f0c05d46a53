#include "policies/misses/miss_policy.h"

#include <algorithm>
#include <string>

namespace pw::misses {
namespace {

// Uniform in [0, 1) from (layer, token clock, expert): splitmix64's finaliser.
double BlindDraw(int layer, int64_t clock, int expert) {
  uint64_t z = (static_cast<uint64_t>(layer) << 48) ^ (static_cast<uint64_t>(clock) << 16) ^
               static_cast<uint64_t>(expert);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

}  // namespace

Result<std::unique_ptr<MissPolicy>> MissPolicy::Create(const MissConfig& config, int num_layers,
                                                       int num_experts, int top_k, int capacity) {
  PW_RETURN_IF_ERROR(ValidateMissConfig(config));
  if (num_layers <= 0 || num_experts <= 0 || top_k <= 0 || top_k > num_experts) {
    return InvalidArgument("miss policy: bad shape (" + std::to_string(num_layers) + " layers, " +
                           std::to_string(num_experts) + " experts, top-" + std::to_string(top_k) +
                           ")");
  }
  if (capacity < top_k || capacity > num_experts) {
    return InvalidArgument("miss policy: " + std::to_string(capacity) +
                           " resident experts per layer is outside [top_k, experts] = [" +
                           std::to_string(top_k) + ", " + std::to_string(num_experts) + "]");
  }
  return std::unique_ptr<MissPolicy>(new MissPolicy(config, num_layers, num_experts, top_k, capacity));
}

MissPolicy::MissPolicy(const MissConfig& config, int num_layers, int num_experts, int top_k,
                       int capacity)
    : config_(config),
      num_experts_(num_experts),
      top_k_(top_k),
      cache_(num_layers, num_experts, capacity, config.eviction, config.decay) {
  const size_t n = static_cast<size_t>(num_layers) * static_cast<size_t>(num_experts);
  lost_.assign(n, 0.0);
  pending_.assign(n, 0);
  due_.resize(static_cast<size_t>(num_layers));
  clock_.assign(static_cast<size_t>(num_layers), 0);
  pinned_.assign(static_cast<size_t>(num_experts), 0);
  scratch_.reserve(static_cast<size_t>(num_experts));
  events_.reserve(64);
}

void MissPolicy::Emit(CacheEvent::Kind kind, int layer, int expert) {
  if (record_events_) events_.push_back({kind, layer, expert});
}

void MissPolicy::WarmStart(int layer, const std::vector<int32_t>& experts) {
  for (int32_t e : experts) {
    if (e < 0 || e >= num_experts_ || cache_.ResidentCount(layer) >= cache_.capacity()) continue;
    cache_.Insert(layer, e, nullptr);
  }
}

void MissPolicy::Admit(int layer, int expert) {
  const size_t i = Idx(layer, expert);
  if (!pending_[i]) return;
  pending_[i] = 0;
  if (cache_.IsResident(layer, expert)) return;
  const int32_t victim = cache_.Insert(layer, expert, pinned_.data());
  stats_.admissions++;
  Emit(CacheEvent::kAdmitted, layer, expert);
  if (victim >= 0) {
    stats_.evictions++;
    Emit(CacheEvent::kEvict, layer, victim);
  }
}

void MissPolicy::AdmissionDone(int layer, int expert) {
  if (layer < 0 || layer >= cache_.num_layers() || expert < 0 || expert >= num_experts_) return;
  auto& due = due_[static_cast<size_t>(layer)];
  due.erase(std::remove_if(due.begin(), due.end(), [expert](const Due& d) { return d.expert == expert; }),
            due.end());
  Admit(layer, expert);
}

float MissPolicy::DecideToken(int layer, MissSlot* slots, int n, const float* probs,
                              SlotAction* actions) {
  const size_t l = static_cast<size_t>(layer);
  const int64_t now = ++clock_[l];
  scratch_.clear();
  cache_.BeginToken(layer, probs, &scratch_);
  for (int32_t v : scratch_) {
    stats_.evictions++;
    Emit(CacheEvent::kEvict, layer, v);
  }
  // Admissions due by now (emulation): resident from this token on.
  if (!external_admission_) {
    auto& due = due_[l];
    size_t kept = 0;
    for (size_t i = 0; i < due.size(); ++i) {
      if (due[i].clock <= now) {
        Admit(layer, due[i].expert);
      } else {
        due[kept++] = due[i];
      }
    }
    due.resize(kept);
  }

  // The token's first choice: its highest gate weight (first slot on ties).
  int first = 0;
  float total = 0.f;
  for (int j = 0; j < n; ++j) {
    total += slots[j].weight;
    if (slots[j].weight > slots[first].weight) first = j;
  }
  // Pin every selection: a fetch for this token never evicts another of its experts.
  for (int j = 0; j < n; ++j) pinned_[static_cast<size_t>(slots[j].expert)] = 1;

  float substituted = 0.f;
  stats_.token_layers++;
  stats_.slots += n;
  for (int j = 0; j < n; ++j) {
    MissSlot& s = slots[j];
    SlotAction act = SlotAction::kHit;
    if (cache_.IsResident(layer, s.expert)) {
      stats_.hits++;
    } else {
      stats_.misses++;
      bool fetch = true;
      switch (config_.rule) {
        case MissRule::kFetchEveryMiss: fetch = true; break;
        case MissRule::kThreshold: fetch = j == first || s.weight >= config_.threshold; break;
        case MissRule::kFirstChoice: fetch = j == first; break;
        case MissRule::kWeightBlind:
          fetch = j == first || BlindDraw(layer, now, s.expert) >= config_.blind_fraction;
          break;
      }
      int32_t sub = -1;
      if (!fetch) {
        float best = -1.f;
        for (int e = 0; e < num_experts_; ++e) {
          if (pinned_[static_cast<size_t>(e)] || !cache_.IsResident(layer, e)) continue;
          if (sub < 0 || probs[e] > best) {
            sub = e;
            best = probs[e];
          }
        }
        if (sub < 0) {
          fetch = true;
          stats_.forced_fetches++;
        }
      }
      if (fetch) {
        act = SlotAction::kFetched;
        stats_.fetches++;
        Emit(CacheEvent::kFetch, layer, s.expert);
        const int32_t victim = cache_.Insert(layer, s.expert, pinned_.data());
        if (victim >= 0) {
          stats_.evictions++;
          Emit(CacheEvent::kEvict, layer, victim);
        }
      } else {
        act = SlotAction::kSubstituted;
        stats_.substitutions++;
        if (j == first) stats_.first_choice_substitutions++;
        substituted += s.weight;
        stats_.substituted_weight += s.weight;
        // Background admission: the missed expert lost s.weight of gate mass.
        if (config_.admission_beta > 0.f) {
          const size_t i = Idx(layer, s.expert);
          lost_[i] += s.weight;
          if (lost_[i] >= config_.admission_beta && !pending_[i]) {
            lost_[i] = 0.0;
            pending_[i] = 1;
            stats_.admission_requests++;
            Emit(CacheEvent::kAdmitRequest, layer, s.expert);
            if (!external_admission_) due_[l].push_back({s.expert, now + config_.admission_delay});
          }
        }
        pinned_[static_cast<size_t>(sub)] = 1;
        s.expert = sub;
      }
    }
    if (actions != nullptr) actions[j] = act;
  }
  for (int j = 0; j < n; ++j) cache_.Use(layer, slots[j].expert);
  // Unpin: the token's final experts and the missed experts it substituted away.
  std::fill(pinned_.begin(), pinned_.end(), uint8_t{0});
  const float m = total > 0.f ? substituted / total : 0.f;
  stats_.mass_sum += m;
  if (substituted > 0.f) stats_.tokens_with_substitution++;
  return m;
}

}  // namespace pw::misses
