#include "services/common/transferable_kv.h"

#include "services/proto/codec.h"

namespace pw::service {

Status CheckTransferableKv(const memory::KvBlockPool& pool, const std::string& model) {
  for (size_t l = 0; l < pool.specs().size(); ++l) {
    if (pool.specs()[l].kind != memory::KvKind::kLatent) continue;
    return Unsupported(model + ": KV layer " + std::to_string(l) + " is " +
                       memory::KvKindName(memory::KvKind::kLatent) +
                       "; the cluster's KV transfer moves full-attention, sliding-window and "
                       "recurrent-state pages only, so an MLA (latent KV) model is not served by "
                       "the cluster yet (only the in-process engine runs it)");
  }
  return Status::Ok();
}

bool HasRecurrentState(std::span<const memory::KvLayerSpec> specs) {
  for (const memory::KvLayerSpec& s : specs) {
    if (s.kind == memory::KvKind::kRecurrentState) return true;
  }
  return false;
}

Status CheckPeerCarriesKv(std::span<const memory::KvLayerSpec> specs, const std::string& model,
                          const std::string& peer, uint16_t peer_minor) {
  if (peer_minor >= kRecurrentStateMinor) return Status::Ok();
  for (size_t l = 0; l < specs.size(); ++l) {
    if (specs[l].kind != memory::KvKind::kRecurrentState) continue;
    const std::string major = std::to_string(proto::kProtocolMajor) + ".";
    return Unsupported(peer + " speaks control protocol " + major + std::to_string(peer_minor) +
                       "; " + model + " keeps a recurrent state (KV layer " + std::to_string(l) +
                       ") that the KV transfer carries since protocol " + major +
                       std::to_string(kRecurrentStateMinor) + " (this process speaks " + major +
                       std::to_string(proto::kProtocolMinor) + ")");
  }
  return Status::Ok();
}

}  // namespace pw::service
