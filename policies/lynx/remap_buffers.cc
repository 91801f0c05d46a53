#include "policies/lynx/remap_buffers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/status.h"

namespace pw::lynx {

void RemapBuffers::Reserve(int max_tokens, int num_experts, int top_k) {
  const size_t T = static_cast<size_t>(std::max(max_tokens, 0));
  const size_t N = static_cast<size_t>(num_experts), k = static_cast<size_t>(top_k);
  own_probs_.reserve(T * N);
  original_.reserve(T * k);
  idx_.reserve(N);
  iota_.reserve(N);
  flags_.reserve(N);
  chosen_.reserve(k);
  weights_.reserve(k);
  slots_.reserve(T * k);
  changed_.reserve(T);
}

void RemapBuffers::Begin(const RemapInput& in) {
  PW_CHECK(in.top_k >= 1 && in.top_k <= in.num_experts && in.num_tokens >= 0);
  PW_CHECK(in.num_tokens == 0 || in.logits != nullptr);
  n_ = in.num_experts;
  k_ = in.top_k;
  const size_t T = static_cast<size_t>(in.num_tokens), N = static_cast<size_t>(n_),
               k = static_cast<size_t>(k_);
  original_.resize(T * k);
  idx_.resize(N);
  if (iota_.size() != N) {
    iota_.resize(N);
    std::iota(iota_.begin(), iota_.end(), 0);
  }
  flags_.resize(N);
  chosen_.resize(k);
  weights_.resize(k);
  slots_.resize(T * k);
  changed_.resize(T);
  if (in.probs != nullptr) {
    probs_ = in.probs;
  } else {
    own_probs_.resize(T * N);
    for (size_t t = 0; t < T; ++t) {
      const float* row = in.logits + t * N;
      float* p = own_probs_.data() + t * N;
      float mx = row[0];
      for (size_t e = 1; e < N; ++e) mx = std::max(mx, row[e]);
      float z = 0.f;
      for (size_t e = 0; e < N; ++e) z += (p[e] = std::exp(row[e] - mx));
      for (size_t e = 0; e < N; ++e) p[e] /= z;
    }
    probs_ = own_probs_.data();
  }
  for (size_t t = 0; t < T; ++t) {
    const float* row = in.logits + t * N;
    SelectTopK(iota_.data(), N, k, [row](int32_t a, int32_t b) { return RanksBefore(row, a, b); },
               original_.data() + t * k);
  }
}

void RemapBuffers::KeepToken(const RemapInput& in, GateWeights gw, int t) {
  const size_t k = static_cast<size_t>(k_);
  const int32_t* orig = original(t);
  SetGateWeights(gw, in.norm_topk_prob, probs(t), orig, orig, k_, weights_.data(),
                 in.weight_scale);
  RemapSlot* slots = slots_.data() + static_cast<size_t>(t) * k;
  for (size_t j = 0; j < k; ++j) slots[j] = {orig[j], weights_[j], static_cast<int16_t>(j)};
  changed_[static_cast<size_t>(t)] = 0;
}

void RemapBuffers::SetToken(const RemapInput& in, GateWeights gw, int t, int32_t* chosen,
                            bool sorted) {
  const size_t k = static_cast<size_t>(k_);
  const float* row = in.logits + static_cast<size_t>(t) * static_cast<size_t>(n_);
  if (!sorted) {
    std::sort(chosen, chosen + k, [row](int32_t a, int32_t b) { return RanksBefore(row, a, b); });
  }
  const int32_t* orig = original(t);
  SetGateWeights(gw, in.norm_topk_prob, probs(t), orig, chosen, k_, weights_.data(),
                 in.weight_scale);
  bool changed = false;
  RemapSlot* slots = slots_.data() + static_cast<size_t>(t) * k;
  for (size_t j = 0; j < k; ++j) {
    int16_t rank = -1;
    for (size_t i = 0; i < k; ++i) {
      if (orig[i] == chosen[j]) rank = static_cast<int16_t>(i);
    }
    if (rank < 0) changed = true;
    slots[j] = {chosen[j], weights_[j], rank};
  }
  changed_[static_cast<size_t>(t)] = changed ? 1 : 0;
}

const RemapOutput& RemapBuffers::Identity(const RemapInput& in, GateWeights gw) {
  for (int t = 0; t < in.num_tokens; ++t) KeepToken(in, gw, t);
  Finish(in);
  out_.stats.applied = false;
  return out_;
}

const RemapOutput& RemapBuffers::Finish(const RemapInput& in) {
  const size_t T = static_cast<size_t>(in.num_tokens), k = static_cast<size_t>(k_);
  RemapStats st;
  st.applied = true;
  std::fill(flags_.begin(), flags_.end(), uint8_t{0});
  for (size_t i = 0; i < T * k; ++i) {
    if (!flags_[original_[i]]) ++st.distinct_before;
    flags_[original_[i]] = 1;
  }
  std::fill(flags_.begin(), flags_.end(), uint8_t{0});
  for (size_t i = 0; i < T * k; ++i) {
    const int32_t e = slots_[i].expert;
    if (!flags_[e]) ++st.distinct_after;
    flags_[e] = 1;
    if (slots_[i].orig_rank < 0) ++st.pairs_replaced;
  }
  for (size_t t = 0; t < T; ++t) st.tokens_changed += changed_[t];
  out_.slots = slots_.data();
  out_.changed = changed_.data();
  out_.stats = st;
  return out_;
}

}  // namespace pw::lynx
