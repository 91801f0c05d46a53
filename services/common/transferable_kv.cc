#include "services/common/transferable_kv.h"

namespace pw::service {

Status CheckTransferableKv(const memory::KvBlockPool& pool, const std::string& model) {
  for (size_t l = 0; l < pool.specs().size(); ++l) {
    const memory::KvKind kind = pool.specs()[l].kind;
    // A sliding-window layer's page is laid out as a full-attention one; the blocks a transfer
    // moves are leased, and a leased block keeps its pages behind the window.
    if (kind == memory::KvKind::kFullAttention || kind == memory::KvKind::kSlidingWindow) continue;
    const char* what = kind == memory::KvKind::kLatent ? "an MLA (latent KV) model"
                                                        : "a hybrid model";
    return Unsupported(model + ": KV layer " + std::to_string(l) + " is " +
                       memory::KvKindName(kind) +
                       "; the cluster's KV transfer moves full-attention and sliding-window pages "
                       "only, so " + what + " is not served by the cluster yet (only the "
                       "in-process engine runs it)");
  }
  return Status::Ok();
}

}  // namespace pw::service
