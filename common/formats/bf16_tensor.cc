#include "common/formats/bf16_tensor.h"

#include <cstring>
#include <string>

#include "common/dtype.h"

namespace pw {

Result<TensorView> GetAsBf16(const Checkpoint& ckpt, std::string_view name,
                             const std::vector<int64_t>& shape, std::vector<uint16_t>* converted) {
  PW_ASSIGN_OR_RETURN(TensorView v, ckpt.Get(name));
  if (v.dtype != DType::kBF16 && v.dtype != DType::kF16 && v.dtype != DType::kF32) {
    return InvalidArgument("tensor '" + std::string(name) + "' in " + ckpt.dir() +
                           " has dtype " + std::string(DTypeName(v.dtype)) +
                           ", expected BF16, F16 or F32");
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
