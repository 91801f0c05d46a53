#include "services/workers/common/prompt_features.h"

#include <algorithm>
#include <limits>

namespace pw::workers {

PromptRoutingRecorder::PromptRoutingRecorder(int num_layers, int num_experts)
    : num_layers_(num_layers), num_experts_(num_experts) {}

void PromptRoutingRecorder::BeginPass() {
  seqs_.clear();
  counts_.clear();
}

void PromptRoutingRecorder::Record(const engine::RoutingContext& ctx,
                                   const std::vector<engine::ExpertAssignment>& selected) {
  if (ctx.pure_decode || ctx.seq_ids == nullptr || ctx.layer < 0 || ctx.layer >= num_layers_ ||
      ctx.num_experts != num_experts_) {
    return;
  }
  const size_t base = static_cast<size_t>(ctx.layer) * num_experts_;
  size_t last = std::numeric_limits<size_t>::max();
  for (const engine::ExpertAssignment& a : selected) {
    if (a.token < 0 || a.token >= ctx.num_tokens || a.expert < 0 || a.expert >= num_experts_) continue;
    const uint64_t seq = ctx.seq_ids[a.token];
    if (last == std::numeric_limits<size_t>::max() || seqs_[last] != seq) {
      auto it = std::find(seqs_.begin(), seqs_.end(), seq);
      last = static_cast<size_t>(it - seqs_.begin());
      if (it == seqs_.end()) {
        seqs_.push_back(seq);
        counts_.emplace_back(static_cast<size_t>(num_layers_) * num_experts_, 0u);
      }
    }
    uint32_t& c = counts_[last][base + static_cast<size_t>(a.expert)];
    if (c < std::numeric_limits<uint32_t>::max()) ++c;
  }
}

void AddRoutingCounts(const std::vector<uint32_t>& counts, std::vector<uint32_t>* sum) {
  if (sum->empty()) sum->assign(counts.size(), 0u);
  if (sum->size() != counts.size()) return;
  for (size_t i = 0; i < counts.size(); ++i) {
    const uint64_t v = static_cast<uint64_t>((*sum)[i]) + counts[i];
    (*sum)[i] = static_cast<uint32_t>(std::min<uint64_t>(v, std::numeric_limits<uint32_t>::max()));
  }
}

PromptFeatures::PromptFeatures(int num_layers, int num_experts, double alpha)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      alpha_(alpha),
      features_(static_cast<size_t>(num_layers) * num_experts, 0.f),
      seen_(static_cast<size_t>(num_layers), false) {}

void PromptFeatures::Add(std::span<const uint32_t> counts) {
  if (counts.size() != features_.size()) return;
  bool any = false;
  for (int l = 0; l < num_layers_; ++l) {
    const size_t base = static_cast<size_t>(l) * num_experts_;
    double sum = 0;
    for (int e = 0; e < num_experts_; ++e) sum += counts[base + e];
    if (sum <= 0) continue;
    any = true;
    const double a = seen_[l] ? alpha_ : 1.0;
    for (int e = 0; e < num_experts_; ++e) {
      float& f = features_[base + e];
      f = static_cast<float>((1 - a) * f + a * (counts[base + e] / sum));
    }
    seen_[l] = true;
  }
  if (any) ++requests_;
}

}  // namespace pw::workers
