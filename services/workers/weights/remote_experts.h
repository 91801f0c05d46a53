// RemoteExpertProvider: a decode worker's expert weights, fetched from the broker's host store
// over UCX (one get per expert block, the path later issues use to move single planes) and
// computed with the same bf16 kernels as the engine's checkpoint provider, so tokens match.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/formats/model_config.h"
#include "engine/experts/bf16_experts.h"
#include "engine/experts/moe.h"
#include "kernels/cpu/packed_bf16.h"
#include "services/proto/codec.h"
#include "services/transport/ucx.h"
#include "services/common/expert_store_layout.h"

namespace pw::workers {

class RemoteExpertProvider final : public engine::ExpertWeightProvider {
 public:
  // Checks `manifest` against the layout this worker computes from `config` (every block
  // present once, sizes equal, bf16, inside the advertised region), gets every block from the
  // broker through `worker` and verifies its checksum, then packs the blocks if `form` says so
  // and that takes fewer bytes (the fetched copy is then released). Errors name the block.
  static Result<std::unique_ptr<RemoteExpertProvider>> Load(transport::ucx::Worker& worker,
                                                            wire::WeightManifest::Reader manifest,
                                                            const ModelConfig& config,
                                                            engine::Bf16ExpertForm form = engine::Bf16ExpertForm::kPlain);

  Status RunExperts(const engine::ExpertLayerCall& call) override;
  int Bits(int, int, engine::ExpertProj) const override { return 16; }

  uint64_t bytes_loaded() const { return layout_.total_bytes; }
  const service::ExpertStoreLayout& layout() const { return layout_; }
  // Whether the blocks are held packed, and the bytes they take (the fetched bytes when not).
  bool packed() const { return !packed_.empty(); }
  uint64_t bytes_held() const;

 private:
  RemoteExpertProvider() = default;
  Status Pack();
  service::ExpertStoreLayout layout_;
  std::unique_ptr<uint16_t[]> data_;  // layout_.total_bytes / 2 bf16 values; released once packed
  // When packed: per layout_ region its matrices (a gate-up block's gate rows, then its up
  // rows; a down block's one), first_[region] the first's index.
  std::vector<cpu::PackedBf16Matrix> packed_;
  std::vector<size_t> first_;
};

}  // namespace pw::workers
