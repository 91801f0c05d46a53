// LynxRemapper: LYNX's batch-aware expert selection for one MoE layer of a decode batch
// (DESIGN.md 5.3; seed paper 004). With B = T tokens, router logits L[T, N], top-k:
//   1. phase gate: only pure-decode batches; exempt layers and B = 1 keep the router's choice
//      (at B = 1 the rule is the identity: m orders experts as the logits do);
//   2. bins q[t, e] = max(ceil(alpha * (L[t, e] - max L[t, .])), -beta)   (affinity_binning.h)
//   3. h[t, e] = B^q[t, e];  S[e] = sum_t h[t, e];  m[t, e] = q[t, e] + (S[e] - h[t, e]) / B
//      ((S - h) / B < 1: a token ranks experts by its own bin first, the batch breaks ties);
//   4. critical set C = union over t of token t's top-k by m (ties: higher logit, lower id);
//   5. each token takes its top-k of the ORIGINAL logits restricted to C: exactly k experts,
//      a dropped expert replaced by its next-best survivor; gate weights per gate_weights.h.
// A token whose top-k are all in C keeps them and the router's weights unchanged.
// Cost: O(T * N) for bins and scores plus two partial sorts of N per token.
#pragma once

#include <optional>
#include <vector>

#include "policies/lynx/batch_remapper.h"
#include "policies/lynx/gate_weights.h"
#include "policies/lynx/lynx_params.h"
#include "policies/lynx/remap_buffers.h"

namespace pw::lynx {

struct LynxOptions {
  // Per-model override of (alpha, beta); empty: DefaultLynxParams(N, k).
  std::optional<LynxParams> params;
  GateWeights gate_weights = GateWeights::kRenormalize;
  // Layers (model layer indices) that always keep the router's choice.
  std::vector<int> exempt_layers;
};

class LynxRemapper final : public BatchRemapper {
 public:
  explicit LynxRemapper(LynxOptions options);
  void Reserve(int max_tokens, int num_experts, int top_k) override;
  const RemapOutput& Remap(const RemapInput& in) override;

  // The (alpha, beta) used for a router of N experts choosing k.
  LynxParams ParamsFor(int num_experts, int top_k) const;
  const LynxOptions& options() const { return options_; }

 private:
  LynxOptions options_;
  RemapBuffers buf_;
  std::vector<int8_t> bins_;     // [T, N]
  std::vector<double> pow_;      // [beta + 1]: B^-j
  std::vector<double> score_;    // [N]: S[e]
  std::vector<double> m_;        // [N]: one token's adjusted scores
  std::vector<int32_t> critical_;  // experts of C, ascending
  std::vector<int32_t> eligible_;  // [|C|] those of C the token's gate did not mask out
  std::vector<int32_t> chosen_;  // [k]
};

// True when `layer` is in `exempt`.
bool IsExemptLayer(const std::vector<int>& exempt, int layer);

}  // namespace pw::lynx
