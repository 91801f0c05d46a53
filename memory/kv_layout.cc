#include "memory/kv_layout.h"

namespace pw::memory {

const char* KvDtypeName(KvDtype d) { return d == KvDtype::kF32 ? "fp32" : "bf16"; }

Result<KvDtype> ParseKvDtype(const std::string& name) {
  if (name == "fp32" || name == "f32") return KvDtype::kF32;
  if (name == "bf16") return KvDtype::kBf16;
  return InvalidArgument("KV dtype '" + name + "' is not 'fp32' or 'bf16'");
}

}  // namespace pw::memory
