#include "services/common/transferable_kv.h"

namespace pw::service {

Status CheckTransferableKv(const memory::KvBlockPool& pool, const std::string& model) {
  for (size_t l = 0; l < pool.specs().size(); ++l) {
    const memory::KvKind kind = pool.specs()[l].kind;
    if (kind == memory::KvKind::kFullAttention) continue;
    return Unsupported(model + ": KV layer " + std::to_string(l) + " is " +
                       memory::KvKindName(kind) +
                       "; the cluster's KV transfer moves full-attention pages only, so a hybrid "
                       "model is not served by the cluster yet (only the in-process engine runs "
                       "it)");
  }
  return Status::Ok();
}

}  // namespace pw::service
