// RemapBuffers: the scratch and the steps both remap rules share (internal to pw_lynx): the
// router's own top-k per token, probabilities, output slots, distinct counts.
#pragma once

#include <cstdint>
#include <vector>

#include "policies/lynx/batch_remapper.h"
#include "policies/lynx/gate_weights.h"

namespace pw::lynx {

// True when expert a ranks before b for a token with logits `row`: higher logit, then lower id.
inline bool RanksBefore(const float* row, int32_t a, int32_t b) {
  return row[a] > row[b] || (row[a] == row[b] && a < b);
}

// The k best of candidates[0..n) under `before` (a strict total order), best first, into out[k]
// (k <= n). Insertion into a sorted run of k: O(n) when few candidates beat the k-th, as is
// the case for router rows. Same result as partial_sort with `before`; does not allocate.
template <typename Before>
void SelectTopK(const int32_t* candidates, size_t n, size_t k, Before before, int32_t* out) {
  size_t have = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t e = candidates[i];
    if (have == k && !before(e, out[k - 1])) continue;
    size_t j = have < k ? have++ : k - 1;
    while (j > 0 && before(e, out[j - 1])) {
      out[j] = out[j - 1];
      --j;
    }
    out[j] = e;
  }
}

class RemapBuffers {
 public:
  void Reserve(int max_tokens, int num_experts, int top_k);

  // Starts a call: sizes buffers (growing only), computes probabilities when in.probs is null,
  // and each token's original top-k into original(t).
  void Begin(const RemapInput& in);
  // Writes every token's original top-k as its selection (changed = 0), stats.applied = false.
  const RemapOutput& Identity(const RemapInput& in, GateWeights gw);
  // Writes token t's selection `chosen` [k], its weights and flags. `sorted`: chosen is
  // already in rank order (best first); otherwise it is sorted here.
  void SetToken(const RemapInput& in, GateWeights gw, int t, int32_t* chosen, bool sorted = false);
  // Token t keeps its original top-k (the router's weights, changed = 0).
  void KeepToken(const RemapInput& in, GateWeights gw, int t);
  // Counts distinct experts before/after and finishes the output (stats.applied = true).
  const RemapOutput& Finish(const RemapInput& in);

  const int32_t* original(int t) const { return original_.data() + static_cast<size_t>(t) * k_; }
  const float* probs(int t) const { return probs_ + static_cast<size_t>(t) * n_; }
  int32_t* index_scratch() { return idx_.data(); }  // [N] scratch
  const int32_t* all_experts() const { return iota_.data(); }  // [N]: 0..N-1
  uint8_t* expert_flags() { return flags_.data(); }  // [N]

 private:
  int n_ = 0, k_ = 0;
  const float* probs_ = nullptr;
  std::vector<float> own_probs_;       // [T, N] when the caller gives none
  std::vector<int32_t> original_;      // [T, k]
  std::vector<int32_t> idx_;           // [N]
  std::vector<int32_t> iota_;          // [N]: 0..N-1
  std::vector<uint8_t> flags_;         // [N]
  std::vector<int32_t> chosen_;        // [k]
  std::vector<float> weights_;         // [k]
  std::vector<RemapSlot> slots_;       // [T, k]
  std::vector<uint8_t> changed_;       // [T]
  RemapOutput out_;
};

}  // namespace pw::lynx
