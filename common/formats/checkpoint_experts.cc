#include "common/formats/checkpoint_experts.h"

#include <fstream>
#include <iterator>
#include <sstream>

#include "common/formats/bf16_tensor.h"
#include "common/formats/stacked_experts.h"
#include "common/hash.h"

namespace pw {

namespace {

// Indexed by ModelType (its order in model_config.h).
constexpr ExpertNaming kExpertNaming[] = {
    {"mlp", {"gate_proj", "up_proj", "down_proj"}},  // qwen2_moe
    {"mlp", {"gate_proj", "up_proj", "down_proj"}},  // qwen3_moe
    {"mlp", {"gate_proj", "up_proj", "down_proj"}},  // olmoe
    {"block_sparse_moe", {"w1", "w3", "w2"}},        // mixtral
    {"mlp", {"gate_proj", "up_proj", "down_proj"}},  // glm4_moe (shared_experts: dense weights)
    {"mlp", {"gate_proj", "up_proj", "down_proj"}},  // qwen3_next (shared_expert: dense weights)
    {"mlp", {"gate_proj", "up_proj", "down_proj"}},  // qwen3_5_moe_text (as qwen3_next)
    // gpt_oss: stacked, "mlp.experts.gate_up_proj" and "mlp.experts.down_proj"
    // (stacked_experts.h); the per-expert names are never read.
    {"mlp", {"gate_up_proj", "gate_up_proj", "down_proj"}},
    // gemma4_text: stacked, "experts.gate_up_proj" and "experts.down_proj" directly in the
    // layer (no block prefix), beside its dense "mlp.".
    {"", {"gate_up_proj", "gate_up_proj", "down_proj"}},
    {"mlp", {"gate_proj", "up_proj", "down_proj"}},  // deepseek_v3 (shared_experts: dense weights)
};
static_assert(std::size(kExpertNaming) == static_cast<size_t>(ModelType::kDeepseekV3) + 1,
              "one ExpertNaming row per ModelType");

}  // namespace

const ExpertNaming& ExpertNamingOf(ModelType type) {
  const size_t i = static_cast<size_t>(type);
  PW_CHECK(i < std::size(kExpertNaming));
  return kExpertNaming[i];
}

std::string MoeBlockPrefix(const ModelConfig& config, int64_t layer) {
  const std::string block = ExpertNamingOf(config.type).moe_block;
  return config.weights_prefix + "layers." + std::to_string(layer) + "." +
         (block.empty() ? "" : block + ".");
}

std::string ExpertTensorName(const ModelConfig& config, int64_t layer, int64_t expert,
                             ExpertMatrix matrix) {
  return MoeBlockPrefix(config, layer) + "experts." + std::to_string(expert) + "." +
         ExpertNamingOf(config.type).matrix[static_cast<int>(matrix)] + ".weight";
}

Result<std::unique_ptr<CheckpointExperts>> CheckpointExperts::Open(const std::string& dir,
                                                                   FileLoad load) {
  std::unique_ptr<CheckpointExperts> c(new CheckpointExperts());
  c->dir_ = dir;
  const std::string path = dir + "/config.json";
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError(path + ": cannot read");
  std::stringstream ss;
  ss << f.rdbuf();
  c->config_bytes_ = ss.str();
  PW_ASSIGN_OR_RETURN(c->config_, LoadModelConfig(path));
  // A multimodal wrapper is read only where config.json's parse knows where it keeps its
  // language model (weights_prefix: qwen3_5_moe's model.language_model.).
  if (!c->config_.wrapper_model_type.empty() && c->config_.weights_prefix == "model.") {
    return Unsupported(path + ": model_type '" + c->config_.wrapper_model_type + "' wraps a " +
                       c->config_.model_type +
                       " text_config; only text-model checkpoints are served");
  }
  PW_ASSIGN_OR_RETURN(c->ckpt_, Checkpoint::Open(dir, load));
  return c;
}

Result<ExpertTensors> CheckpointExperts::Get(int64_t layer, int64_t expert) const {
  const ModelConfig& c = config_;
  if (layer < 0 || layer >= c.num_layers || !c.IsMoeLayer(layer) || expert < 0 ||
      expert >= c.num_experts) {
    return InvalidArgument(dir_ + ": no routed expert " + std::to_string(expert) + " in layer " +
                           std::to_string(layer));
  }
  const int64_t h = c.hidden_size, i = c.moe_intermediate_size;
  ExpertTensors t;
  StackedExpertShape stacked{c.num_experts, h, i};
  if (StackedLayoutOf(c.type, &stacked.layout)) {
    // Stacked (stacked_experts.h): the matrices are copied out as bf16; the biases are not
    // stored (the engine adds them from its own model, ExpertLayerCall).
    std::shared_ptr<std::vector<uint16_t>> m[3];
    for (auto& v : m) v = std::make_shared<std::vector<uint16_t>>();
    PW_RETURN_IF_ERROR(ReadStackedExpert(*ckpt_, MoeBlockPrefix(c, layer), stacked, expert,
                                         m[0].get(), m[1].get(), m[2].get())
                           .WithContext(dir_));
    t.ffn = i;
    t.hidden = h;
    t.gate = reinterpret_cast<const uint8_t*>(m[0]->data());
    t.up = reinterpret_cast<const uint8_t*>(m[1]->data());
    t.down = reinterpret_cast<const uint8_t*>(m[2]->data());
    for (int j = 0; j < 3; ++j) t.converted[j] = std::move(m[j]);
    return t;
  }
  t.ffn = i;
  t.hidden = h;
  for (ExpertMatrix m : {ExpertMatrix::kGate, ExpertMatrix::kUp, ExpertMatrix::kDown}) {
    const std::vector<int64_t> shape =
        m == ExpertMatrix::kDown ? std::vector<int64_t>{h, i} : std::vector<int64_t>{i, h};
    auto converted = std::make_shared<std::vector<uint16_t>>();
    PW_ASSIGN_OR_RETURN(
        TensorView v, GetAsBf16(*ckpt_, ExpertTensorName(c, layer, expert, m), shape,
                                converted.get(), {c.fp8_block_rows, c.fp8_block_cols}));
    if (!converted->empty()) t.converted[static_cast<int>(m)] = std::move(converted);
    (m == ExpertMatrix::kGate ? t.gate : m == ExpertMatrix::kUp ? t.up : t.down) = v.data;
  }
  return t;
}

Result<uint64_t> CheckpointExperts::Hash() const {
  Fnv1a64 h;
  h.Update(config_bytes_.data(), config_bytes_.size());
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    if (!config_.IsMoeLayer(l)) continue;
    for (int64_t e = 0; e < config_.num_experts; ++e) {
      PW_ASSIGN_OR_RETURN(ExpertTensors t, Get(l, e));
      const size_t bytes = static_cast<size_t>(t.ffn * t.hidden) * 2;
      h.Update(t.gate, bytes);
      h.Update(t.up, bytes);
      h.Update(t.down, bytes);
    }
  }
  return h.digest();
}

Result<uint64_t> ModelHash(const std::string& model_dir) {
  PW_ASSIGN_OR_RETURN(auto experts, CheckpointExperts::Open(model_dir));
  return experts->Hash();
}

}  // namespace pw
