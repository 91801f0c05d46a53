#include "services/common/registration_check.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "services/common/kv_layout_hash.h"
#include "services/common/transferable_kv.h"
#include "memory/kv_layout.h"
#include "memory/kv_spec.h"

namespace pw::service {

namespace {

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

// The model's KV layout with `block_tokens` tokens a block and elements of `dtype`.
memory::KvLayout ModelLayout(const ModelConfig& m, uint32_t block_tokens, memory::KvDtype dtype) {
  memory::KvLayout l;
  l.num_layers = static_cast<int>(m.num_layers);
  l.num_kv_heads = static_cast<int>(m.num_kv_heads);
  l.head_dim = static_cast<int>(m.head_dim);
  l.block_size = static_cast<int>(block_tokens);
  l.dtype = dtype;
  return l;
}

// Bytes of one block of `l` and `specs`: memory::KvBlockPool::bytes_per_block() (each layer's
// LayerBlockBytes, a recurrent state counted as l.bytes_per_layer()).
uint64_t BlockBytes(const memory::KvLayout& l, const std::vector<memory::KvLayerSpec>& specs) {
  uint64_t n = 0;
  for (const memory::KvLayerSpec& s : specs) {
    n += s.kind == memory::KvKind::kRecurrentState ? l.bytes_per_layer()
                                                   : memory::LayerBlockBytes(s, l);
  }
  return n;
}

// The KV layout checks; appends a line per problem.
void CheckKvLayout(wire::KvLayout::Reader kl, const RegistrationLimits& limits, uint16_t peer_minor,
                   uint64_t max_bytes, std::vector<std::string>* bad, uint64_t* kv_bytes) {
  const uint32_t blocks = kl.getNumBlocks(), block_tokens = kl.getBlockTokens(),
                 layers = kl.getNumLayers();
  // 0: a peer before protocol 1.3, one page per layer.
  const uint32_t block_pages = kl.getPagesPerBlock() != 0 ? kl.getPagesPerBlock() : layers;
  const uint64_t block_bytes = kl.getBlockBytes(), layer_bytes = kl.getLayerBytes(),
                 page_bytes = kl.getPageBytes(), hash = kl.getLayoutHash();
  if (block_tokens < 1 || block_tokens > limits.max_block_tokens) {
    bad->push_back("kvLayout.blockTokens " + std::to_string(block_tokens) + " outside 1.." +
                   std::to_string(limits.max_block_tokens));
  }
  if (blocks < 1 || blocks > limits.max_kv_blocks) {
    bad->push_back("kvLayout.numBlocks " + std::to_string(blocks) + " outside 1.." +
                   std::to_string(limits.max_kv_blocks));
  }
  // layerBytes is the widest layer's (since 1.5 layers may be narrower), so a block is at most
  // numLayers of them; the model's layout gives the exact sum below.
  uint64_t layers_bytes = 0;
  if (__builtin_mul_overflow(layer_bytes, uint64_t{layers}, &layers_bytes) ||
      block_bytes > layers_bytes) {
    bad->push_back("kvLayout.blockBytes " + std::to_string(block_bytes) + " is above layerBytes " +
                   std::to_string(layer_bytes) + " x numLayers " + std::to_string(layers));
  }
  if (page_bytes < layer_bytes) {
    bad->push_back("kvLayout.pageBytes " + std::to_string(page_bytes) + " below layerBytes " +
                   std::to_string(layer_bytes));
  }
  if (block_pages < layers) {
    bad->push_back("kvLayout.pagesPerBlock " + std::to_string(block_pages) + " below numLayers " +
                   std::to_string(layers));
  }
  // The pool's KV pages: pagesPerBlock of each block.
  uint64_t pages = 0;
  if (__builtin_mul_overflow(uint64_t{blocks}, uint64_t{block_pages}, &pages) ||
      __builtin_mul_overflow(pages, page_bytes, kv_bytes) || *kv_bytes > max_bytes) {
    *kv_bytes = 0;  // reported here, not again against kvMemory
    bad->push_back("kvLayout: numBlocks " + std::to_string(blocks) + " x pagesPerBlock " +
                   std::to_string(block_pages) + " x pageBytes " + std::to_string(page_bytes) +
                   " above " + std::to_string(max_bytes) + " bytes");
  }
  if (!limits.model) return;
  const ModelConfig& m = *limits.model;
  if (layers != static_cast<uint64_t>(m.num_layers)) {
    bad->push_back("kvLayout.numLayers " + std::to_string(layers) + " is not the model's " +
                   std::to_string(m.num_layers));
  }
  const std::vector<memory::KvLayerSpec> specs = memory::ModelKvSpecs(m);
  if (Status st = CheckPeerCarriesKv(specs, "this " + m.model_type + " model", "the worker", peer_minor);
      !st.ok()) {
    bad->push_back(st.message());
    return;  // its layout cannot describe the state
  }
  if (block_tokens < 1 || block_tokens > limits.max_block_tokens) return;  // no layout to compare
  // The hash names the dtype (and the layout version); the model's layout of that dtype then
  // gives the bytes.
  std::string expected;
  for (memory::KvDtype dtype : {memory::KvDtype::kF32, memory::KvDtype::kBf16}) {
    const memory::KvLayout l = ModelLayout(m, block_tokens, dtype);
    const uint64_t want = KvLayoutHash(l, specs, m.hidden_size, m.vocab_size, m.model_type);
    if (want != hash) {
      expected += std::string(expected.empty() ? "" : ", ") + memory::KvDtypeName(dtype) + " " + Hex(want);
      continue;
    }
    // An MLA model's layers are its latent rows (KvLayerBytes), K and V the others', each layer
    // of its own width where it has one (the block: their sum).
    const uint64_t want_layer = KvLayerBytes(l, specs), want_block = BlockBytes(l, specs);
    if (layer_bytes != want_layer) {
      bad->push_back("kvLayout.layerBytes " + std::to_string(layer_bytes) + " is not the " +
                     memory::KvDtypeName(dtype) + " layout's " + std::to_string(want_layer));
    }
    if (block_bytes != want_block) {
      bad->push_back("kvLayout.blockBytes " + std::to_string(block_bytes) + " is not the " +
                     memory::KvDtypeName(dtype) + " layout's " + std::to_string(want_block));
    }
    // A recurrent state's pages follow from the page size (a page too small for a layer is
    // reported above).
    if (auto offsets = memory::BlockPageOffsets(specs, l, page_bytes);
        offsets.ok() && static_cast<uint64_t>(offsets->back()) != block_pages) {
      bad->push_back("kvLayout.pagesPerBlock " + std::to_string(block_pages) + " is not the " +
                     std::to_string(offsets->back()) + " pages of " + std::to_string(page_bytes) +
                     " bytes a block of this model takes");
    }
    return;
  }
  bad->push_back("kvLayout.layoutHash " + Hex(hash) + " is not the KV layout of this " +
                 m.model_type + " model with " + std::to_string(block_tokens) +
                 "-token blocks (" + expected + ")");
}

}  // namespace

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

Status CheckRegistration(wire::Register::Reader reg, const RegistrationLimits& limits,
                         uint16_t peer_minor) {
  const wire::Role role = reg.getRole();
  if (role != wire::Role::PREFILL && role != wire::Role::DECODE) return Status::Ok();
  uint64_t max_bytes = limits.max_kv_bytes != 0 ? limits.max_kv_bytes : PhysicalMemoryBytes();
  if (max_bytes == 0) max_bytes = std::numeric_limits<uint64_t>::max();  // unknown: no wrap-around only
  std::vector<std::string> bad;
  if (reg.getMaxBatch() > limits.max_batch) {
    bad.push_back("maxBatch " + std::to_string(reg.getMaxBatch()) + " above " +
                  std::to_string(limits.max_batch));
  }
  uint64_t kv_bytes = 0;
  if (!reg.hasKvLayout()) {
    bad.push_back("no kvLayout");
  } else {
    CheckKvLayout(reg.getKvLayout(), limits, peer_minor, max_bytes, &bad, &kv_bytes);
  }
  if (role == wire::Role::DECODE) {
    if (!reg.hasKvMemory()) {
      bad.push_back("no kvMemory");
    } else {
      auto mem = reg.getKvMemory();
      const uint64_t bytes = mem.getBytes();
      uint64_t end = 0;
      if (bytes > max_bytes) {
        bad.push_back("kvMemory.bytes " + std::to_string(bytes) + " above " + std::to_string(max_bytes));
      } else if (bytes < kv_bytes) {
        bad.push_back("kvMemory.bytes " + std::to_string(bytes) + " below the " + std::to_string(kv_bytes) +
                      " bytes of its KV pages");
      }
      if (__builtin_add_overflow(mem.getBaseAddr(), bytes, &end)) {
        bad.push_back("kvMemory.baseAddr " + Hex(mem.getBaseAddr()) + " + bytes wraps around");
      }
    }
    if (limits.model && reg.getResidencyCapacity() > static_cast<uint64_t>(limits.model->num_experts)) {
      bad.push_back("residencyCapacity " + std::to_string(reg.getResidencyCapacity()) +
                    " above the model's " + std::to_string(limits.model->num_experts) +
                    " experts per layer");
    }
  }
  if (bad.empty()) return Status::Ok();
  std::string msg;
  for (const std::string& b : bad) msg += (msg.empty() ? "" : "; ") + b;
  return InvalidArgument(msg);
}

}  // namespace pw::service
