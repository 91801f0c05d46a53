#include "services/common/expert_store_layout.h"

namespace pw::service {

ExpertStoreLayout ExpertStoreLayout::For(const ModelConfig& c) {
  ExpertStoreLayout s;
  s.num_layers_ = c.num_layers;
  s.num_experts_ = c.num_experts;
  s.index_.assign(static_cast<size_t>(c.num_layers * c.num_experts * 2), -1);
  const int64_t h = c.hidden_size, f = c.moe_intermediate_size;
  uint64_t off = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.IsMoeLayer(l)) continue;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      for (int kind = 0; kind < 2; ++kind) {
        ExpertRegion r;
        r.layer = static_cast<int>(l);
        r.expert = static_cast<int>(e);
        r.proj = static_cast<ExpertProj>(kind);
        r.rows = kind == 0 ? 2 * f : h;
        r.cols = kind == 0 ? h : f;
        r.bytes = static_cast<uint64_t>(r.rows * r.cols) * 2;
        r.offset = off;
        off += (r.bytes + 63) / 64 * 64;
        s.index_[ExpertBlockIndex(l, e, static_cast<ExpertProj>(kind), c.num_experts)] =
            static_cast<int64_t>(s.regions.size());
        s.regions.push_back(r);
      }
    }
  }
  s.total_bytes = off;
  return s;
}

int64_t ExpertStoreLayout::Find(int layer, int expert, ExpertProj proj) const {
  if (layer < 0 || layer >= num_layers_ || expert < 0 || expert >= num_experts_ ||
      (proj != ExpertProj::kGateUp && proj != ExpertProj::kDown)) {
    return -1;
  }
  return index_[ExpertBlockIndex(layer, expert, proj, num_experts_)];
}

}  // namespace pw::service
