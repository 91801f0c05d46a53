#include "services/common/transferable_kv.h"

#include "services/proto/codec.h"

namespace pw::service {

namespace {

bool PerToken(const memory::KvLayerSpec& s) { return s.kind != memory::KvKind::kRecurrentState; }

}  // namespace

uint64_t KvLayerBytes(const memory::KvLayout& layout, std::span<const memory::KvLayerSpec> specs) {
  for (const memory::KvLayerSpec& s : specs) {
    if (PerToken(s)) return memory::LayerBlockBytes(s, layout);
  }
  return layout.bytes_per_layer();
}

Status CheckTransferableKv(const memory::KvBlockPool& pool, const std::string& model) {
  const auto& specs = pool.specs();
  size_t first = specs.size();
  for (size_t l = 0; l < specs.size(); ++l) {
    if (!PerToken(specs[l])) continue;
    if (first == specs.size()) {
      first = l;
      continue;
    }
    const size_t want = memory::LayerBlockBytes(specs[first], pool.layout()),
                 got = memory::LayerBlockBytes(specs[l], pool.layout());
    if (got == want) continue;
    return Unsupported(
        model + ": KV layer " + std::to_string(l) + " (" + memory::KvKindName(specs[l].kind) +
        ") takes " + std::to_string(got) + " bytes a block, layer " + std::to_string(first) + " (" +
        memory::KvKindName(specs[first].kind) + ") " + std::to_string(want) +
        "; the cluster's KV transfer moves layers of one size (KvLayout.layerBytes), so "
        "this model is not served by the cluster (only the in-process engine runs it)");
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
  for (size_t l = 0; l < specs.size(); ++l) {
    const char* what = nullptr;
    uint16_t since = 0;
    if (specs[l].kind == memory::KvKind::kRecurrentState) {
      what = "a recurrent state";
      since = kRecurrentStateMinor;
    } else if (specs[l].kind == memory::KvKind::kLatent) {
      what = "an MLA latent";
      since = kLatentKvMinor;
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
