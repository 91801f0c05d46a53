// ResidualHeads: the planner's prompt residual heads (DESIGN.md 5.1, "exp(residual_i(prompt))"),
// and their file beside an .apw store (docs/formats.md, "Prompt residual heads (.pwrh)").
//
// One small linear head per (layer, projection): residual = bias + sum_e w_e * f_e, where f is
// the layer's prompt feature, the expert-routing histogram of the running batch's prompts
// (f_e = share of the layer's top-k assignments that went to expert e over the prompts' tokens;
// sums to 1, or all zero when unknown). The residual is the log of how much more (or less)
// damage those prompts take from lowering a block of the layer than the store's table says for
// the same routing (the training target: quant/residual_train.h). Predict clamps it to
// [-clamp, clamp] so a head never turns a step's damage into 0 or infinity.
//
// Plain data; Save writes `path`.tmp then renames. Load refuses, naming the path and the
// reason: a file too short or too long for its header (truncated), a wrong magic or version,
// a checksum mismatch, non-finite weights, or (with expected_model_hash) another model's heads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/expert_block.h"
#include "common/status.h"

namespace pw {

class ResidualHeads {
 public:
  static constexpr uint32_t kVersion = 1;
  static constexpr char kMagic[8] = {'P', 'W', 'R', 'E', 'S', 'I', 'D', '\0'};

  // Fit figures the trainer records (informational; docs/quality.md quotes them).
  struct FitInfo {
    uint32_t train_prompts = 0, heldout_prompts = 0;
    double ridge = 0;       // L2 penalty the heads were fitted with
    double heldout_r2 = 0;  // R^2 of predicted vs measured residuals on the held-out prompts
    double heldout_corr = 0;  // Pearson correlation of the same
  };

  ResidualHeads() = default;
  // All-zero heads (every residual 0) for a model of this shape.
  ResidualHeads(int num_layers, int num_experts, uint64_t model_hash, double clamp = 2.0);

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  uint64_t model_hash() const { return model_hash_; }
  double clamp() const { return clamp_; }
  FitInfo& fit() { return fit_; }
  const FitInfo& fit() const { return fit_; }

  // The head of (layer, proj): [0] = bias, [1 + e] = weight of expert e's share.
  std::vector<double>& head(int layer, ExpertProj proj) { return heads_[HeadIndex(layer, proj)]; }
  const std::vector<double>& head(int layer, ExpertProj proj) const { return heads_[HeadIndex(layer, proj)]; }

  // residual of (layer, proj) for `feature` (num_experts shares of that layer), clamped.
  double Predict(int layer, ExpertProj proj, const float* feature) const;
  double Predict(int layer, ExpertProj proj, const double* feature) const;

  Status Save(const std::string& path) const;
  static Result<ResidualHeads> Load(const std::string& path,
                                    std::optional<uint64_t> expected_model_hash = std::nullopt);
  // The bytes Save writes (header, weights, checksum), and their parser (Load's work).
  std::string Serialize() const;
  static Result<ResidualHeads> Parse(const std::string& bytes, const std::string& name);

 private:
  size_t HeadIndex(int layer, ExpertProj proj) const {
    return static_cast<size_t>(layer) * kProjsPerExpert + (proj == ExpertProj::kGateUp ? 0 : 1);
  }
  int num_layers_ = 0, num_experts_ = 0;
  uint64_t model_hash_ = 0;
  double clamp_ = 2.0;
  FitInfo fit_;
  std::vector<std::vector<double>> heads_;  // [layer * 2 + proj][1 + num_experts]
};

}  // namespace pw
