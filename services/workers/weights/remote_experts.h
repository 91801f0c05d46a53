// RemoteExpertProvider: a decode worker's expert weights, fetched from the broker's host store
// over UCX (one get per expert block, the path later issues use to move single planes) and
// computed with the same bf16 kernels as the engine's checkpoint provider, so tokens match.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/formats/model_config.h"
#include "engine/experts/moe.h"
#include "services/proto/codec.h"
#include "services/transport/ucx.h"
#include "services/common/expert_store_layout.h"

namespace pw::workers {

class RemoteExpertProvider final : public engine::ExpertWeightProvider {
 public:
  // Checks `manifest` against the layout this worker computes from `config` (every block
  // present once, sizes equal, bf16, inside the advertised region), gets every block from the
  // broker through `worker` and verifies its checksum. Errors name the block.
  static Result<std::unique_ptr<RemoteExpertProvider>> Load(transport::ucx::Worker& worker,
                                                            wire::WeightManifest::Reader manifest,
                                                            const ModelConfig& config);

  Status RunExperts(const engine::ExpertLayerCall& call) override;
  int Bits(int, int, engine::ExpertProj) const override { return 16; }

  uint64_t bytes_loaded() const { return layout_.total_bytes; }
  const service::ExpertStoreLayout& layout() const { return layout_; }

 private:
  RemoteExpertProvider() = default;
  service::ExpertStoreLayout layout_;
  std::unique_ptr<uint16_t[]> data_;  // layout_.total_bytes / 2 bf16 values
};

}  // namespace pw::workers
