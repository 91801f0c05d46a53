#include "policies/lynx/lynx_remap.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/status.h"
#include "policies/lynx/affinity_binning.h"

namespace pw::lynx {

bool IsExemptLayer(const std::vector<int>& exempt, int layer) {
  return std::find(exempt.begin(), exempt.end(), layer) != exempt.end();
}

LynxRemapper::LynxRemapper(LynxOptions options) : options_(std::move(options)) {
  if (options_.params) PW_CHECK(ValidateLynxParams(*options_.params).ok());
}

LynxParams LynxRemapper::ParamsFor(int num_experts, int top_k) const {
  return options_.params ? *options_.params : DefaultLynxParams(num_experts, top_k);
}

void LynxRemapper::Reserve(int max_tokens, int num_experts, int top_k) {
  buf_.Reserve(max_tokens, num_experts, top_k);
  const size_t T = static_cast<size_t>(std::max(max_tokens, 0)), N = static_cast<size_t>(num_experts);
  bins_.reserve(T * N);
  pow_.reserve(65);
  score_.reserve(N);
  m_.reserve(N);
  critical_.reserve(N);
  eligible_.reserve(N);
  chosen_.reserve(static_cast<size_t>(top_k));
}

const RemapOutput& LynxRemapper::Remap(const RemapInput& in) {
  buf_.Begin(in);
  const GateWeights gw = options_.gate_weights;
  if (!in.pure_decode || in.num_tokens <= 1 || IsExemptLayer(options_.exempt_layers, in.layer)) {
    return buf_.Identity(in, gw);
  }
  const LynxParams p = ParamsFor(in.num_experts, in.top_k);
  const size_t T = static_cast<size_t>(in.num_tokens), N = static_cast<size_t>(in.num_experts);
  const size_t k = static_cast<size_t>(in.top_k);
  const double B = static_cast<double>(T), inv_b = 1.0 / B;

  // 2. bins; 3. batch scores S[e] = sum_t B^q[t, e] (token order: deterministic).
  bins_.resize(T * N);
  AffinityBins(in.logits, in.num_tokens, in.num_experts, p, bins_.data());
  pow_.resize(static_cast<size_t>(p.beta) + 1);
  pow_[0] = 1.0;
  for (size_t j = 1; j < pow_.size(); ++j) pow_[j] = pow_[j - 1] / B;
  score_.assign(N, 0.0);
  for (size_t t = 0; t < T; ++t) {
    const int8_t* q = bins_.data() + t * N;
    for (size_t e = 0; e < N; ++e) score_[e] += pow_[static_cast<size_t>(-q[e])];
  }

  // 4. critical set: union of each token's top-k by m.
  uint8_t* in_c = buf_.expert_flags();
  std::fill(in_c, in_c + N, uint8_t{0});
  int32_t* idx = buf_.index_scratch();
  const int32_t* all = buf_.all_experts();
  m_.resize(N);
  for (size_t t = 0; t < T; ++t) {
    const int8_t* q = bins_.data() + t * N;
    const float* row = in.logits + t * N;
    for (size_t e = 0; e < N; ++e) {
      const double h = pow_[static_cast<size_t>(-q[e])];
      m_[e] = static_cast<double>(q[e]) + (score_[e] - h) * inv_b;
    }
    const double* m = m_.data();
    SelectTopK(all, N, k,
               [m, row](int32_t a, int32_t b) {
                 if (m[a] != m[b]) return m[a] > m[b];
                 return RanksBefore(row, a, b);
               },
               idx);
    for (size_t j = 0; j < k; ++j) in_c[idx[j]] = 1;
  }
  critical_.clear();
  for (size_t e = 0; e < N; ++e) {
    if (in_c[e]) critical_.push_back(static_cast<int32_t>(e));
  }

  // 5. each token's top-k of its original logits inside C (|C| >= k). A token whose top-k are
  // all in C keeps them (they are its k best anywhere, so also inside C). An expert whose logit
  // is -inf for the token is one its gate masked out (a grouped sigmoid gate's groups the token
  // did not keep): never chosen for it; when C holds fewer than k the token may take, the rest
  // are its own best (its original top-k in order).
  chosen_.resize(k);
  for (size_t t = 0; t < T; ++t) {
    const int32_t* orig = buf_.original(static_cast<int>(t));
    bool inside = true;
    for (size_t j = 0; j < k && inside; ++j) inside = in_c[orig[j]] != 0;
    if (inside) {
      buf_.KeepToken(in, gw, static_cast<int>(t));
      continue;
    }
    const float* row = in.logits + t * N;
    eligible_.clear();
    for (int32_t e : critical_) {
      if (row[e] != -INFINITY) eligible_.push_back(e);
    }
    const size_t take = std::min(k, eligible_.size());
    SelectTopK(eligible_.data(), eligible_.size(), take,
               [row](int32_t a, int32_t b) { return RanksBefore(row, a, b); }, chosen_.data());
    size_t n = take;
    for (size_t j = 0; j < k && n < k; ++j) {
      if (std::find(chosen_.begin(), chosen_.begin() + static_cast<std::ptrdiff_t>(n), orig[j]) ==
          chosen_.begin() + static_cast<std::ptrdiff_t>(n)) {
        chosen_[n++] = orig[j];
      }
    }
    PW_CHECK(n == k);
    buf_.SetToken(in, gw, static_cast<int>(t), chosen_.data(), /*sorted=*/take == k);
  }
  return buf_.Finish(in);
}

}  // namespace pw::lynx
