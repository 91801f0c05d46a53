#include "engine/hooks/trace_recorder.h"

#include <string>

#include "engine/models/family.h"

namespace pw::engine {

misses::TraceHeader TraceHeaderFor(const ModelConfig& config) {
  misses::TraceHeader h;
  h.num_layers = static_cast<uint32_t>(config.num_layers);
  h.num_experts = static_cast<uint32_t>(config.num_experts);
  h.top_k = static_cast<uint32_t>(config.num_experts_per_tok);
  h.norm_topk_prob = config.norm_topk_prob;
  h.hidden_size = static_cast<uint32_t>(config.hidden_size);
  h.moe_intermediate_size = static_cast<uint32_t>(config.moe_intermediate_size);
  const ModelFamily* family = FindFamily(config.type);
  if (family != nullptr && family->gate == GateKind::kSigmoidGroupedTopK) {
    h.gate = misses::TraceGate::kSigmoid;
    h.n_group = static_cast<uint32_t>(config.n_group);
    h.topk_group = static_cast<uint32_t>(config.topk_group);
  }
  return h;
}

void TraceRecorder::Record(const RoutingContext& ctx, const std::vector<ExpertAssignment>& selected) {
  if (!status_.ok()) return;
  if (ctx.layer <= last_layer_) {
    recording_ = step_ % static_cast<uint64_t>(sample_every_) == 0;
    ++step_;
  }
  last_layer_ = ctx.layer;
  const size_t T = static_cast<size_t>(ctx.num_tokens), k = static_cast<size_t>(ctx.top_k);
  if (!recording_) {
    writer_->CountDropped(T);
    return;
  }
  if (selected.size() != T * k) {
    status_ = Internal("trace recorder expects the router's top-k (" + std::to_string(T * k) +
                       " assignments), got " + std::to_string(selected.size()));
    return;
  }
  experts_.resize(T * k);
  weights_.resize(T * k);
  for (size_t i = 0; i < T * k; ++i) {
    experts_[i] = selected[i].expert;
    weights_[i] = selected[i].weight;
  }
  if (ctx.selection_bias != nullptr) {
    status_ = writer_->SetSelectionBias(static_cast<uint32_t>(ctx.layer), ctx.selection_bias);
    if (!status_.ok()) return;
  }
  status_ = writer_->Append(static_cast<uint32_t>(ctx.layer), step_ - 1, T, ctx.seq_ids,
                            ctx.positions, ctx.router_logits,
                            experts_.data(), weights_.data());
}

}  // namespace pw::engine
