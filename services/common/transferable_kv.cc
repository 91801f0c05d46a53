#include "services/common/transferable_kv.h"

#include <algorithm>

#include "services/proto/codec.h"

namespace pw::service {

namespace {

bool PerToken(const memory::KvLayerSpec& s) { return s.kind != memory::KvKind::kRecurrentState; }

}  // namespace

uint64_t KvLayerBytes(const memory::KvLayout& layout, std::span<const memory::KvLayerSpec> specs) {
  uint64_t most = 0;
  bool per_token = false;
  for (const memory::KvLayerSpec& s : specs) {
    if (!PerToken(s)) continue;
    per_token = true;
    most = std::max<uint64_t>(most, memory::LayerBlockBytes(s, layout));
  }
  return per_token ? most : layout.bytes_per_layer();
}

bool HasRecurrentState(std::span<const memory::KvLayerSpec> specs) {
  for (const memory::KvLayerSpec& s : specs) {
    if (s.kind == memory::KvKind::kRecurrentState) return true;
  }
  return false;
}

Status CheckPeerCarriesKv(std::span<const memory::KvLayerSpec> specs, const std::string& model,
                          const std::string& peer, uint16_t peer_minor) {
  for (size_t l = 0; l < specs.size(); ++l) {
    const char* what = nullptr;
    uint16_t since = 0;
    if (specs[l].kind == memory::KvKind::kRecurrentState) {
      what = "a recurrent state";
      since = kRecurrentStateMinor;
    } else if (specs[l].kind == memory::KvKind::kLatent) {
      what = "an MLA latent";
      since = kLatentKvMinor;
    } else if (memory::HasOwnShape(specs[l])) {
      what = "attention of its own KV width";
      since = kLayerShapeMinor;
    }
    if (what == nullptr || peer_minor >= since) continue;
    const std::string major = std::to_string(proto::kProtocolMajor) + ".";
    return Unsupported(peer + " speaks control protocol " + major + std::to_string(peer_minor) +
                       "; " + model + " keeps " + what + " (KV layer " + std::to_string(l) +
                       ") that the KV transfer carries since protocol " + major +
                       std::to_string(since) + " (this process speaks " + major +
                       std::to_string(proto::kProtocolMinor) + ")");
  }
  return Status::Ok();
}

}  // namespace pw::service
