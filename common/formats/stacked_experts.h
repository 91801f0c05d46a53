// Stacked experts: routed experts stored as one tensor per MoE layer and matrix (gpt_oss,
// gemma4), read as each expert's bf16 gate, up [I, H] and down [H, I], the layout the rest of the
// system uses.
//
// gemma4 (transformers' Gemma4TextExperts, [out, in] rows, no biases; B = "model.layers.{l}."):
//     B experts.gate_up_proj  [E, 2I, H]   rows 0..I-1 gate, I..2I-1 up
//     B experts.down_proj     [E, H, I]
//
// gpt_oss:
// With B = the layer's MoE block prefix ("model.layers.{l}.mlp."), either
//   float (bf16 / f16 / f32; transformers' GptOssExperts parameters, used as x @ W):
//     B experts.gate_up_proj  [E, H, 2I]   column 2i is gate row i, column 2i + 1 up row i
//     B experts.down_proj     [E, I, H]
//   or MXFP4 (the released gpt-oss checkpoints; [out, in] rows of 32-value blocks):
//     B experts.gate_up_proj_blocks [E, 2I, H/32, 16] U8   row 2i gate row i, 2i + 1 up row i
//     B experts.gate_up_proj_scales [E, 2I, H/32] U8
//     B experts.down_proj_blocks    [E, H, I/32, 16] U8;  B experts.down_proj_scales [E, H, I/32]
//   and, in both, the biases (float):
//     B experts.gate_up_proj_bias [E, 2I] interleaved as above;  B experts.down_proj_bias [E, H]
// An MXFP4 block holds 32 E2M1 values, two per byte, low nibble first (sign, 2 exponent bits,
// 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives); its scale byte s is the
// E8M0 factor 2^(s - 127). Every product is a bf16 value, so dequantizing is exact (as
// transformers' convert_moe_packed_tensors, which gpt-oss runs from).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/formats/model_config.h"
#include "common/formats/safetensors.h"
#include "common/status.h"

namespace pw {

// The dimensions of one layer's stacked experts: E experts of FFN width I over hidden H.
enum class StackedLayout : uint8_t {
  kGptOss,  // x @ W, gate/up interleaved, with biases (or MXFP4)
  kGemma4,  // [out, in], gate then up, no biases
};

struct StackedExpertShape {
  int64_t experts = 0;  // E
  int64_t hidden = 0;   // H
  int64_t ffn = 0;      // I
  StackedLayout layout = StackedLayout::kGptOss;
};

// The stacked layout of `type`'s routed experts; false when its experts are per-expert matrices.
bool StackedLayoutOf(ModelType type, StackedLayout* layout);

// True when layer block `block` stores its experts as MXFP4 (the *_blocks tensors exist).
bool HasMxfp4Experts(const Checkpoint& ckpt, const std::string& block);

// Expert `expert`'s matrices as bf16 bits: gate and up [I, H], down [H, I], each resized.
// Errors (kInvalidArgument) name the tensor and the shape or dtype found, among them MXFP4
// scales whose shape does not match their blocks.
Status ReadStackedExpert(const Checkpoint& ckpt, const std::string& block,
                         const StackedExpertShape& shape, int64_t expert,
                         std::vector<uint16_t>* gate, std::vector<uint16_t>* up,
                         std::vector<uint16_t>* down);

// Expert `expert`'s biases as fp32: gate and up [I] (de-interleaved), down [H].
Status ReadStackedExpertBiases(const Checkpoint& ckpt, const std::string& block,
                               const StackedExpertShape& shape, int64_t expert,
                               std::vector<float>* gate, std::vector<float>* up,
                               std::vector<float>* down);

// The 32 * n values of n MXFP4 blocks (16 bytes each) with their n scales, as bf16 bits.
void DequantizeMxfp4(const uint8_t* blocks, const uint8_t* scales, size_t n, uint16_t* out);

}  // namespace pw
