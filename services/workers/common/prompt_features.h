// Prompt features: the per-layer expert-routing histogram of recent prefills, the input of the
// broker planner's prompt residual heads (common/formats/residual_heads.h, DESIGN.md 5.1).
//
// Two halves, one on each side of a request's hand-off:
//   - PromptRoutingRecorder (prefill worker): the engine's RouterLogitsRecorder (seam (d) of
//     engine/experts/moe.h). Over one PrefillPass it counts, per sequence of the pass (in the
//     order the sequences first appear, which is the order of the pass's jobs) and per
//     (layer, expert), the router's own top-k assignments of the prompt tokens. The worker
//     adds each job's counts up over its passes and sends them with KvReady.promptRouting; the
//     router copies them into StartDecode.promptRouting.
//   - PromptFeatures (decode worker): every admitted request's counts become per-layer shares
//     (share_e = count_e / sum_e' count_e'; sums to 1 per layer) folded into an exponential
//     moving average (alpha per request; the first request sets it), sent as
//     Telemetry.promptFeatures. A layer a request did not route (no counts) keeps its value.
// Both are bounded: the recorder holds at most one pass's sequences (reset every pass), the
// features one [layers * experts] row. Engine's driving thread (recorder) and the decode
// worker's loop thread (features) only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/experts/moe.h"

namespace pw::workers {

class PromptRoutingRecorder final : public engine::RouterLogitsRecorder {
 public:
  PromptRoutingRecorder(int num_layers, int num_experts);

  // Forgets the last pass's counts; call before each PrefillPass.
  void BeginPass();
  void Record(const engine::RoutingContext& ctx, const std::vector<engine::ExpertAssignment>& selected) override;

  // Sequences seen in this pass, in order of first appearance.
  size_t num_sequences() const { return counts_.size(); }
  // Counts of the k-th of them: [num_layers * num_experts], layer * num_experts + expert.
  const std::vector<uint32_t>& counts(size_t k) const { return counts_[k]; }

 private:
  int num_layers_, num_experts_;
  std::vector<uint64_t> seqs_;
  std::vector<std::vector<uint32_t>> counts_;
};

// Adds `counts` into `*sum` (resized to counts' size when empty; saturating).
void AddRoutingCounts(const std::vector<uint32_t>& counts, std::vector<uint32_t>* sum);

class PromptFeatures {
 public:
  // alpha in (0, 1]: weight of the newest request.
  PromptFeatures(int num_layers, int num_experts, double alpha = 0.125);

  // Folds one request's routing counts in; ignored unless it has num_layers * num_experts
  // entries (a request from a prefill worker that sent none, or another model's).
  void Add(std::span<const uint32_t> counts);

  // [num_layers * num_experts]; all zero until a request came.
  const std::vector<float>& features() const { return features_; }
  uint64_t requests() const { return requests_; }

 private:
  int num_layers_, num_experts_;
  double alpha_;
  std::vector<float> features_;
  std::vector<bool> seen_;  // per layer
  uint64_t requests_ = 0;
};

}  // namespace pw::workers
