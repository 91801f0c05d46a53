// A checkpoint matrix in the engine's bf16 storage, whatever float dtype the checkpoint was
// saved in (transformers writes bf16, fp16 or fp32 as the model was saved). BF16 is returned
// as it is, in place; F16 and F32 are converted into a buffer the caller owns, each value
// rounded to the nearest bf16 (ties to even). fp16 -> bf16 keeps 8 of the 11 significant bits
// and every fp16 value stays finite; fp32 -> bf16 keeps 8 of 24. Other dtypes are refused.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/formats/safetensors.h"
#include "common/status.h"

namespace pw {

// Tensor `name` of `ckpt` with shape `shape`, as BF16. When it had to be converted, the values
// are in `*converted` (resized) and the returned view points there; the view's dtype is BF16.
// Errors (kInvalidArgument) name the tensor, the directory, and the shape or dtype found.
Result<TensorView> GetAsBf16(const Checkpoint& ckpt, std::string_view name,
                             const std::vector<int64_t>& shape, std::vector<uint16_t>* converted);

}  // namespace pw
