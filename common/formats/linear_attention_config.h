// LinearAttentionConfig: the linear-attention layers of a hybrid model (qwen3_next's Gated
// DeltaNet), as config.json describes them.
//
// A hybrid stacks two token mixers: full attention (the ModelConfig's heads, KV in paged
// blocks) and linear attention, whose memory of the past is a fixed-size recurrent state per
// sequence (a causal depthwise conv's last conv_kernel - 1 inputs, and one key_head_dim x
// value_head_dim matrix per value head), not a KV entry per token. `layers` says which is
// which; an empty list means every layer is full attention (every non-hybrid family).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pw {

struct LinearAttentionConfig {
  std::vector<bool> layers;     // [num_layers]: true for a linear-attention layer; empty: none
  int64_t num_key_heads = 0;    // linear_num_key_heads (queries and keys)
  int64_t num_value_heads = 0;  // linear_num_value_heads; a multiple of num_key_heads
  int64_t key_head_dim = 0;     // linear_key_head_dim
  int64_t value_head_dim = 0;   // linear_value_head_dim
  int64_t conv_kernel = 0;      // linear_conv_kernel_dim

  bool IsLinear(int64_t layer) const {
    return layer >= 0 && static_cast<size_t>(layer) < layers.size() &&
           layers[static_cast<size_t>(layer)];
  }
  // Channels of the causal conv: q, k (num_key_heads x key_head_dim each) and v.
  int64_t conv_dim() const {
    return 2 * num_key_heads * key_head_dim + num_value_heads * value_head_dim;
  }
  // fp32 floats of one sequence's state in one layer: the conv's last conv_kernel - 1 inputs
  // per channel, then a [key_head_dim, value_head_dim] matrix per value head.
  int64_t conv_state_floats() const { return conv_dim() * (conv_kernel - 1); }
  int64_t state_floats() const {
    return conv_state_floats() + num_value_heads * key_head_dim * value_head_dim;
  }
  size_t state_bytes() const { return static_cast<size_t>(state_floats()) * sizeof(float); }
};

}  // namespace pw
