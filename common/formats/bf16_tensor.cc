#include "common/formats/bf16_tensor.h"

#include <cstring>
#include <string>

#include "common/dtype.h"

namespace pw {

namespace {

// An F8_E4M3 matrix [rows, cols] times its weight_scale_inv per block, rounded to bf16.
Result<TensorView> DequantizeFp8(const Checkpoint& ckpt, std::string_view name,
                                 const std::vector<int64_t>& shape, std::vector<uint16_t>* out,
                                 Fp8BlockSize fp8) {
  const std::string weight(name);
  if (fp8.rows < 1 || fp8.cols < 1) {
    return InvalidArgument("tensor '" + weight + "' in " + ckpt.dir() +
                           " has dtype F8_E4M3, but config.json's quantization_config declares "
                           "no FP8 weight_block_size");
  }
  if (shape.size() != 2) {
    return InvalidArgument("tensor '" + weight + "' in " + ckpt.dir() +
                           " has dtype F8_E4M3; only matrices are read as FP8");
  }
  PW_ASSIGN_OR_RETURN(TensorView v, ckpt.Get(name, DType::kF8E4M3, shape));
  const std::string scale_name = weight + "_scale_inv";
  if (!ckpt.Has(scale_name)) {
    return InvalidArgument("tensor '" + weight + "' in " + ckpt.dir() +
                           " is F8_E4M3 but its scale tensor '" + scale_name + "' is missing");
  }
  const int64_t rows = shape[0], cols = shape[1];
  const int64_t br = (rows + fp8.rows - 1) / fp8.rows, bc = (cols + fp8.cols - 1) / fp8.cols;
  PW_ASSIGN_OR_RETURN(TensorView s, ckpt.Get(scale_name, DType::kF32, {br, bc}));
  out->resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* src = v.data + i * cols;
    const uint8_t* srow = s.data + (i / fp8.rows) * bc * 4;
    uint16_t* dst = out->data() + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      float scale;
      std::memcpy(&scale, srow + (j / fp8.cols) * 4, 4);
      dst[j] = F32ToBf16(F8E4M3ToF32(src[j]) * scale);
    }
  }
  v.dtype = DType::kBF16;
  v.data = reinterpret_cast<const uint8_t*>(out->data());
  v.nbytes = out->size() * 2;
  return v;
}

}  // namespace

Result<TensorView> GetAsBf16(const Checkpoint& ckpt, std::string_view name,
                             const std::vector<int64_t>& shape, std::vector<uint16_t>* converted,
                             Fp8BlockSize fp8) {
  PW_ASSIGN_OR_RETURN(TensorView v, ckpt.Get(name));
  if (v.dtype == DType::kF8E4M3) return DequantizeFp8(ckpt, name, shape, converted, fp8);
  if (v.dtype != DType::kBF16 && v.dtype != DType::kF16 && v.dtype != DType::kF32) {
    return InvalidArgument("tensor '" + std::string(name) + "' in " + ckpt.dir() +
                           " has dtype " + std::string(DTypeName(v.dtype)) +
                           ", expected BF16, F16, F32 or (FP8 checkpoints) F8_E4M3");
  }
  // The shape check and its message are Checkpoint's own.
  PW_ASSIGN_OR_RETURN(v, ckpt.Get(name, v.dtype, shape));
  if (v.dtype == DType::kBF16) return v;
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  converted->resize(n);
  if (v.dtype == DType::kF16) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, v.data + 2 * i, 2);
      (*converted)[i] = F32ToBf16(F16ToF32(h));
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, v.data + 4 * i, 4);
      (*converted)[i] = F32ToBf16(f);
    }
  }
  v.dtype = DType::kBF16;
  v.data = reinterpret_cast<const uint8_t*>(converted->data());
  v.nbytes = n * 2;
  return v;
}

}  // namespace pw
