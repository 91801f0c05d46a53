// RoPE frequencies of a model for the rope_type its config.json gives (ModelConfig::rope_scaling):
// default, linear, dynamic (NTK), yarn and llama3, computed in fp32 the way HF transformers'
// modeling_rope_utils.py computes them, so the engine's rotations match HF's.
#pragma once

#include <cstdint>
#include <vector>

#include "common/formats/model_config.h"

namespace pw::engine {

struct RopeTable {
  // [rotary_dim / 2] (gemma4's full layers: [full_head_dim / 2]): the angle of dimension pair j
  // is pos * inv_freq[j]
  std::vector<float> inv_freq;
  float attention_factor = 1.0f;  // cos and sin are multiplied by it (yarn; 1 otherwise)
};

// The table for a forward pass whose longest sequence reaches `seq_len` positions (its last
// position + 1). Only dynamic NTK depends on it: as in HF, a pass within
// max_position_embeddings uses the plain frequencies, a longer one a base grown for its length
// (so a sequence's tokens are rotated with the base of the pass that computed them, as HF's
// generate with a KV cache does).
// A model whose full layers have their own head size (ModelConfig::full_head_dim) gets the full
// layers' table, over that size.
RopeTable ComputeRope(const ModelConfig& config, int64_t seq_len);

// The sliding layers' table of a model whose layer types have their own RoPE
// (ModelConfig::sliding_rope, gemma4).
RopeTable ComputeSlidingRope(const ModelConfig& config);

// True when ComputeRope(config, seq_len) differs from the table at max_position_embeddings.
bool RopeDependsOnLength(const ModelConfig& config, int64_t seq_len);

}  // namespace pw::engine
