// TraceRecorder: the engine's recorder seam (moe.h, seam (d)) writing router-logit traces
// (policies/misses/router_trace.h; docs/formats.md): per MoE layer of each recorded forward
// pass, every token's router logits and the router's top-k with its gate weights.
//
// Sampling for a long-running process: every `sample_every`-th forward pass is recorded
// whole (all its layers), the others are counted as dropped; the writer's byte bound drops
// what would not fit. A forward pass starts when the layer index does not increase. The first
// write error stops recording; status() reports it. Driving thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/formats/model_config.h"
#include "policies/misses/router_trace.h"
#include "engine/experts/moe.h"

namespace pw::engine {

// The trace header for a model.
misses::TraceHeader TraceHeaderFor(const ModelConfig& config);

class TraceRecorder final : public RouterLogitsRecorder {
 public:
  // `writer` is borrowed and must outlive the recorder; sample_every >= 1.
  explicit TraceRecorder(misses::RouterTraceWriter* writer, int sample_every = 1)
      : writer_(writer), sample_every_(sample_every < 1 ? 1 : sample_every) {}
  void Record(const RoutingContext& ctx, const std::vector<ExpertAssignment>& selected) override;
  const Status& status() const { return status_; }
  uint64_t steps() const { return step_; }  // forward passes seen

 private:
  misses::RouterTraceWriter* writer_;
  int sample_every_;
  int last_layer_ = 1 << 30;
  uint64_t step_ = 0;
  bool recording_ = false;
  std::vector<int32_t> experts_;
  std::vector<float> weights_;
  Status status_ = Status::Ok();
};

}  // namespace pw::engine
