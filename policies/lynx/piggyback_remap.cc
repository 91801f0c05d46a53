#include "policies/lynx/piggyback_remap.h"

#include <algorithm>
#include <cmath>

#include "common/status.h"
#include "policies/lynx/lynx_remap.h"

namespace pw::lynx {

PiggybackRemapper::PiggybackRemapper(PiggybackOptions options) : options_(std::move(options)) {
  PW_CHECK(options_.keep >= 1);
}

void PiggybackRemapper::Reserve(int max_tokens, int num_experts, int top_k) {
  buf_.Reserve(max_tokens, num_experts, top_k);
  base_.reserve(static_cast<size_t>(num_experts));
  cand_.reserve(static_cast<size_t>(num_experts));
  chosen_.reserve(static_cast<size_t>(top_k));
}

const RemapOutput& PiggybackRemapper::Remap(const RemapInput& in) {
  buf_.Begin(in);
  const GateWeights gw = options_.gate_weights;
  if (!in.pure_decode || in.num_tokens <= 1 || options_.keep >= in.top_k ||
      IsExemptLayer(options_.exempt_layers, in.layer)) {
    return buf_.Identity(in, gw);
  }
  const size_t T = static_cast<size_t>(in.num_tokens), N = static_cast<size_t>(in.num_experts);
  const size_t k = static_cast<size_t>(in.top_k), keep = static_cast<size_t>(options_.keep);

  uint8_t* in_p = buf_.expert_flags();
  std::fill(in_p, in_p + N, uint8_t{0});
  for (size_t t = 0; t < T; ++t) {
    const int32_t* orig = buf_.original(static_cast<int>(t));
    for (size_t j = 0; j < keep; ++j) in_p[orig[j]] = 1;
  }
  base_.clear();
  for (size_t e = 0; e < N; ++e) {
    if (in_p[e]) base_.push_back(static_cast<int32_t>(e));
  }

  chosen_.resize(k);
  for (size_t t = 0; t < T; ++t) {
    const int32_t* orig = buf_.original(static_cast<int>(t));
    const float* row = in.logits + t * N;
    size_t n = 0;
    for (; n < keep; ++n) chosen_[n] = orig[n];
    auto held = [&](int32_t e) { return std::find(chosen_.begin(), chosen_.begin() + n, e) != chosen_.begin() + n; };
    cand_.clear();
    // An expert whose logit is -inf for this token is one its gate masked out (a grouped
    // sigmoid gate's groups the token did not keep): never piggybacked onto it.
    for (int32_t e : base_) {
      if (!held(e) && row[e] != -INFINITY) cand_.push_back(e);
    }
    const size_t take = std::min(k - n, cand_.size());
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(take), cand_.end(),
                      [row](int32_t a, int32_t b) { return RanksBefore(row, a, b); });
    for (size_t j = 0; j < take; ++j) chosen_[n++] = cand_[j];
    for (size_t j = keep; j < k && n < k; ++j) {
      if (!held(orig[j])) chosen_[n++] = orig[j];
    }
    PW_CHECK(n == k);
    buf_.SetToken(in, gw, static_cast<int>(t), chosen_.data());
  }
  return buf_.Finish(in);
}

}  // namespace pw::lynx
