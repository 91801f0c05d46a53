// ApwExpertProvider: runs a layer's experts from an .apw store, each block at its width in a
// WidthMap (the engine's ExpertWeightProvider seam, engine/experts/moe.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/apw_store.h"
#include "common/expert_block.h"
#include "common/status.h"
#include "kernels/anyprec/anyprec.h"
#include "kernels/anyprec/pack.h"
#include "kernels/anyprec/q8.h"
#include "engine/models/model.h"
#include "engine/experts/moe.h"
#include "common/formats/width_map.h"
#include "engine/experts/bf16_expert_provider.h"
#include "engine/experts/kernel_path.h"
#include "engine/experts/q8_block.h"

namespace pw::anyprec {

// Runs expert blocks from an .apw store, each at its width in the map (16 = the checkpoint's
// bf16 block, the reference path). Rows are split across the engine's thread pool; scratch
// (per-thread workspaces, x/y staging) is grown on demand and reused. On the fast path (the
// default) a block's int8 LUT at a width is made the first time the block runs at that width
// and kept.
class ApwExpertProvider final : public engine::ExpertWeightProvider {
 public:
  // The store must match the model (shapes; and hash unless check_hash is false). tile_rows:
  // rows per page of the page lists handed to the kernels.
  static Result<std::unique_ptr<ApwExpertProvider>> Create(std::shared_ptr<const apw::ApwStore> store,
                                                           const engine::Model& model,
                                                           WidthMap widths, bool check_hash = true,
                                                           int tile_rows = 64);
  // A layer whose blocks are all at 3..8 bits runs on the fast path through RunQ8Experts (x
  // quantized once, one dispatch per projection); all at 16 through the checkpoint's bf16
  // provider; the exact path, or a layer mixing 16 with 3..8, block by block.
  Status RunExperts(const engine::ExpertLayerCall& call) override;
  int Bits(int layer, int expert, engine::ExpertProj proj) const override;
  KernelPath kernel_path() const { return path_; }
  void set_kernel_path(KernelPath path) { path_ = path; }
  const WidthMap& widths() const { return widths_; }
  WidthMap& mutable_widths() { return widths_; }

 private:
  ApwExpertProvider(std::shared_ptr<const apw::ApwStore> store, const engine::Model& model,
                    WidthMap widths);
  struct AlignedFree {
    void operator()(void* p) const;
  };
  using AlignedPtr = std::unique_ptr<uint8_t, AlignedFree>;
  // One block's product at its width (the per-block path).
  Status ApplyBlock(int layer, int expert, engine::ExpertProj proj, const float* x, size_t ldx,
                    size_t num_tokens, float* y, size_t ldy, cpu::ThreadPool* pool);
  uint8_t* Workspace(int i, size_t bytes);
  // The int8 LUT of block i at `bits`, made on first use.
  Result<Q8Lut> FastLut(size_t i, int bits);

  struct Q8LutCache {
    std::vector<int8_t> values;
    std::vector<float> scales;
  };

  std::shared_ptr<const apw::ApwStore> store_;
  engine::Bf16ExpertProvider bf16_;
  WidthMap widths_;
  std::vector<std::unique_ptr<PageLists>> pages_;  // [layer][expert][proj]
  kernels::Backend backend_;
  kernels::Backend q8_backend_;
  KernelPath path_ = KernelPath::kFast;
  std::vector<std::unique_ptr<Q8LutCache>> q8_luts_;  // [block * (kMaxBits + 1) + bits]
  Q8ActsScratch acts_;
  std::vector<AlignedPtr> ws_;
  std::vector<size_t> ws_bytes_;
  std::vector<float> xbuf_, ybuf_;
};

}  // namespace pw::anyprec
