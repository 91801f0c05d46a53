// Engine integration of any-precision experts (services/engine/moe.h seams):
//   - WidthMap: the width (3..8 bits, or 16 = the checkpoint's bf16) of every expert block;
//   - ApwExpertProvider: runs a layer's experts from an .apw store at their blocks' widths;
//   - CalibrationRecorder: computes the experts from the checkpoint's bf16 blocks and
//     accumulates, per block, sum_t x_tj^2 over the tokens routed to it (the diagonal Hessian
//     the quantizer weighs errors by);
//   - ModelHash: the hash an .apw store records for the checkpoint it was made from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/apw_store.h"
#include "common/expert_block.h"
#include "common/status.h"
#include "kernels/anyprec/anyprec.h"
#include "kernels/anyprec/pack.h"
#include "kernels/anyprec/q8.h"
#include "services/engine/model.h"
#include "services/engine/moe.h"
#include "services/engine/moe_layer.h"

namespace pw::anyprec {

inline constexpr int kBf16Bits = 16;  // width-map value selecting the checkpoint's bf16 block

// How expert blocks at 3..8 bits are multiplied: kExact = fp16 LUT and fp32 activations (the
// reference, anyprec.h); kFast = int8 LUT and int8 activations (q8.h).
enum class KernelPath { kExact, kFast };
const char* KernelPathName(KernelPath path);
// "exact" or "fast".
Result<KernelPath> ParseKernelPath(const std::string& name);

// FNV-1a 64 over config.json's bytes then every routed expert's gate, up, down tensors (bf16
// bytes) in (layer, expert) order. Errors when config.json cannot be read.
Result<uint64_t> ModelHash(const engine::Model& model);

// Per-block widths: [layer][expert][proj] with proj 0 = gate_up, 1 = down.
class WidthMap {
 public:
  WidthMap() = default;
  // Every block at `bits` (3..8 or 16).
  static Result<WidthMap> Uniform(int bits, int num_layers, int num_experts);
  // JSON (or YAML) file: {"default_bits": 4, "blocks": [{"layer": 0, "expert": 3,
  // "proj": "down", "bits": 5}, ...]}; entries override the default. Errors name the file and
  // the entry.
  static Result<WidthMap> FromFile(const std::string& path, int num_layers, int num_experts);
  // Writes the map in the FromFile format (every block listed).
  Status Save(const std::string& path) const;

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  int Get(int layer, int expert, engine::ExpertProj proj) const {
    return bits_[Index(layer, expert, proj)];
  }
  // bits must be 3..8 or 16.
  Status Set(int layer, int expert, engine::ExpertProj proj, int bits);
  // Mean bits per weight over all blocks, each weighted by its rows*cols.
  double AverageBits(const apw::StoreInfo& info) const;

 private:
  size_t Index(int layer, int expert, engine::ExpertProj proj) const {
    return ExpertBlockIndex(layer, expert, proj, num_experts_);
  }
  int num_layers_ = 0;
  int num_experts_ = 0;
  std::vector<uint8_t> bits_;
};

// Width maps at a target average width (bits per expert weight, weighted by block size),
// starting from every block at 8 bits and lowering one block by one bit at a time:
//   - PlanDamageRanked: always the step with the least expected damage per byte freed,
//       cost = f_i * (D_i[b-1] - D_i[b]) / (rows * cols / 8),
//     f_i = (tokens_i + 1) / (tokens of the layer's experts + E) (apw::CalibrationShares / E):
//     the routing frequency from
//     the calibration counts, since D_i is an error per routed token;
//   - PlanRandom: a uniformly random block still above min_bits (seeded, for baselines).
// Stops at the first map whose average is <= avg_bits; errors if avg_bits < min_bits.
Result<WidthMap> PlanDamageRanked(const apw::ApwStore& store, double avg_bits, int min_bits = kMinBits);
Result<WidthMap> PlanRandom(const apw::ApwStore& store, double avg_bits, uint64_t seed,
                            int min_bits = kMinBits);

// Scratch for quantized activations (Q8ActsBytes), grown on demand and reused.
class Q8ActsScratch {
 public:
  uint8_t* Get(size_t bytes);
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<uint8_t, Free> buf_;
  size_t bytes_ = 0;
};

// One block on the fast path: y[t][r] for t < num_tokens (in chunks of kMaxTokens, each
// quantized once for all the threads that share its rows) and every row r, split across
// `pool` when the block is large enough. The per-block form of RunQ8Experts (q8_experts.h),
// which gives the same bits for a whole layer.
Status ApplyQ8Block(Backend backend, const BlockView& view, int bits, const Q8Lut& lut,
                    const float* x, size_t ldx, size_t num_tokens, float* y, size_t ldy,
                    cpu::ThreadPool* pool, Q8ActsScratch* acts);

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
  Backend backend_;
  Backend q8_backend_;
  KernelPath path_ = KernelPath::kFast;
  std::vector<std::unique_ptr<Q8LutCache>> q8_luts_;  // [block * (kMaxBits + 1) + bits]
  Q8ActsScratch acts_;
  std::vector<AlignedPtr> ws_;
  std::vector<size_t> ws_bytes_;
  std::vector<float> xbuf_, ybuf_;
};

// Accumulates per block input statistics while computing the experts from the checkpoint's
// bf16 blocks (`inner`), block by block (the down block's input is silu(gate) * up).
class CalibrationRecorder final : public engine::ExpertWeightProvider {
 public:
  CalibrationRecorder(const engine::Bf16ExpertProvider* inner, int num_layers, int num_experts,
                      int hidden, int ffn);
  Status RunExperts(const engine::ExpertLayerCall& call) override;
  int Bits(int layer, int expert, engine::ExpertProj proj) const override {
    return inner_->Bits(layer, expert, proj);
  }
  // sum over recorded tokens of x_j^2: [cols of the block].
  const std::vector<double>& SumSquares(int layer, int expert, engine::ExpertProj proj) const {
    return sums_[Index(layer, expert, proj)];
  }
  // Tokens recorded for the block.
  uint64_t Tokens(int layer, int expert, engine::ExpertProj proj) const {
    return tokens_[Index(layer, expert, proj)];
  }

 private:
  size_t Index(int layer, int expert, engine::ExpertProj proj) const {
    return ExpertBlockIndex(layer, expert, proj, num_experts_);
  }
  const engine::Bf16ExpertProvider* inner_;
  int num_layers_, num_experts_;
  std::vector<std::vector<double>> sums_;
  std::vector<uint64_t> tokens_;
};

}  // namespace pw::anyprec
