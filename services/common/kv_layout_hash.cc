#include "services/common/kv_layout_hash.h"

#include "common/hash.h"

namespace pw::service {

uint64_t KvLayoutHash(const memory::KvLayout& l, std::span<const memory::KvLayerSpec> specs,
                      int64_t hidden_size, int64_t vocab_size, const std::string& model_type) {
  std::string key = "kv-v" + std::to_string(memory::kKvLayoutVersion) + "|" +
                    memory::KvDtypeName(l.dtype) + "|" + model_type + "|" + std::to_string(l.num_layers) + "|" +
                    std::to_string(l.num_kv_heads) + "|" + std::to_string(l.head_dim) + "|" +
                    std::to_string(l.block_size) + "|" + std::to_string(hidden_size) + "|" +
                    std::to_string(vocab_size);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind == memory::KvKind::kRecurrentState) {
      key += "|state" + std::to_string(i) + ":" + std::to_string(specs[i].state_bytes);
    } else if (specs[i].kind == memory::KvKind::kLatent) {
      key += "|latent" + std::to_string(i) + ":" + std::to_string(specs[i].latent_dim);
    } else if (memory::HasOwnShape(specs[i])) {
      key += "|shape" + std::to_string(i) + ":" + std::to_string(specs[i].num_kv_heads) + "x" +
             std::to_string(specs[i].head_dim);
    }
  }
  return Fnv1a64Of(key.data(), key.size());
}

}  // namespace pw::service
