// A checkpoint matrix in the engine's bf16 storage, whatever float dtype the checkpoint was
// saved in (transformers writes bf16, fp16 or fp32 as the model was saved). BF16 is returned
// as it is, in place; F16 and F32 are converted into a buffer the caller owns, each value
// rounded to the nearest bf16 (ties to even). fp16 -> bf16 keeps 8 of the 11 significant bits
// and every fp16 value stays finite; fp32 -> bf16 keeps 8 of 24. FP8 block-scaled weights
// (DeepSeek-V3's checkpoints: F8_E4M3 values, and beside "X.weight" a float32
// "X.weight_scale_inv" [ceil(rows / block rows), ceil(cols / block cols)]) are dequantized,
// value x its block's scale in fp32, then rounded to bf16 (as DeepSeek's fp8_cast_bf16 does).
// Other dtypes are refused.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/formats/safetensors.h"
#include "common/status.h"

namespace pw {

// The block one weight_scale_inv value covers (ModelConfig::fp8_block_rows / _cols); 0 x 0
// when the config declares no FP8 quantization, and an F8_E4M3 tensor is then refused.
struct Fp8BlockSize {
  int64_t rows = 0;
  int64_t cols = 0;
};

// Tensor `name` of `ckpt` with shape `shape`, as BF16. When it had to be converted, the values
// are in `*converted` (resized) and the returned view points there; the view's dtype is BF16.
// Errors (kInvalidArgument) name the tensor, the directory, and the shape or dtype found; for
// an FP8 weight, a missing or mis-shaped scale tensor by its name.
Result<TensorView> GetAsBf16(const Checkpoint& ckpt, std::string_view name,
                             const std::vector<int64_t>& shape, std::vector<uint16_t>* converted,
                             Fp8BlockSize fp8 = {});

}  // namespace pw
