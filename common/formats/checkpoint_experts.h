// The routed experts of a Hugging Face checkpoint, read without the engine: their tensor names
// (one place for every family's naming), their bf16 bytes, and the model hash an .apw store
// records for the checkpoint it was made from. The broker builds its host store from these; the
// engine's model loader takes the names from here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/model_config.h"
#include "common/formats/safetensors.h"
#include "common/mmap_file.h"
#include "common/status.h"

namespace pw {

// The three matrices of one routed expert: gate [I, H], up [I, H], down [H, I].
enum class ExpertMatrix : uint8_t { kGate = 0, kUp = 1, kDown = 2 };

// How a family's checkpoint names its MoE block and its routed experts: layer l's block is
// "model.layers.{l}.{moe_block}." and expert e's matrices "{block}experts.{e}.{matrix}.weight".
// One row per ModelType in a table (checkpoint_experts.cc), read by the engine's model loader
// (engine/models/) and by the broker alike; a new family adds its row there.
struct ExpertNaming {
  const char* moe_block;  // "mlp" (qwen types, olmoe, glm4_moe) or "block_sparse_moe" (mixtral)
  const char* matrix[3];  // indexed by ExpertMatrix: {"gate_proj", "up_proj", "down_proj"} or
                          // mixtral's {"w1", "w3", "w2"}
};
const ExpertNaming& ExpertNamingOf(ModelType type);

// Prefix of layer `layer`'s MoE block ("model.layers.3.mlp." or, for mixtral,
// "model.layers.3.block_sparse_moe."; under config.weights_prefix, e.g.
// "model.language_model.layers.3.mlp." in a multimodal checkpoint).
std::string MoeBlockPrefix(const ModelConfig& config, int64_t layer);
// "model.layers.3.mlp.experts.5.gate_proj.weight" (mixtral: "...experts.5.w1.weight").
std::string ExpertTensorName(const ModelConfig& config, int64_t layer, int64_t expert,
                             ExpertMatrix matrix);

// One expert's bf16 bytes, row-major, pointing into the checkpoint (not aligned), or, for an
// fp16 / fp32 checkpoint, into `converted` (the values rounded to bf16; valid while this
// object or a copy of it lives).
struct ExpertTensors {
  const uint8_t* gate = nullptr;
  const uint8_t* up = nullptr;
  const uint8_t* down = nullptr;
  int64_t ffn = 0, hidden = 0;  // gate and up are [ffn, hidden], down [hidden, ffn]
  std::shared_ptr<const std::vector<uint16_t>> converted[3];  // by ExpertMatrix; null for BF16
};

class CheckpointExperts {
 public:
  // config.json and the safetensors files of `dir`.
  static Result<std::unique_ptr<CheckpointExperts>> Open(const std::string& dir,
                                                         FileLoad load = FileLoad::kMap);

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  // Expert `expert` of MoE layer `layer`; each tensor checked to be of the config's shape, as
  // bf16 (BF16 in place; F16 / F32 rounded to bf16, common/formats/bf16_tensor.h).
  Result<ExpertTensors> Get(int64_t layer, int64_t expert) const;
  // FNV-1a 64 over config.json's bytes, then every routed expert's gate, up and down bytes in
  // (layer, expert) order over the MoE layers.
  Result<uint64_t> Hash() const;

 private:
  CheckpointExperts() = default;
  std::string dir_;
  std::string config_bytes_;
  ModelConfig config_;
  std::unique_ptr<Checkpoint> ckpt_;
};

// CheckpointExperts::Open(dir) then Hash() (over the bf16 values, converted or not): the hash an .apw store records for its checkpoint.
Result<uint64_t> ModelHash(const std::string& model_dir);

}  // namespace pw
