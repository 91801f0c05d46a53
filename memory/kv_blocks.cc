#include "memory/kv_blocks.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace pw::memory {

static Status CheckLayout(const KvLayout& layout, int num_blocks) {
  if (layout.num_layers <= 0 || layout.num_kv_heads <= 0 || layout.head_dim <= 0 ||
      layout.block_size <= 0 || num_blocks <= 0) {
    return InvalidArgument(
        "KV pool: layers, kv heads, head_dim, block_size and num_blocks must be "
        "positive (got layers=" +
        std::to_string(layout.num_layers) + " kv_heads=" + std::to_string(layout.num_kv_heads) +
        " head_dim=" + std::to_string(layout.head_dim) + " block_size=" +
        std::to_string(layout.block_size) + " num_blocks=" + std::to_string(num_blocks) + ")");
  }
  return Status::Ok();
}

namespace {

// The layer specs (every layer full attention when none are given) and each layer's first page
// within a block; fills *pages_per_block. kUnsupported for a kind not served.
Status LayOutLayers(const KvLayout& layout, size_t page_bytes, std::vector<KvLayerSpec>* specs,
                    std::vector<int>* first_page, int* pages_per_block) {
  if (specs->empty()) *specs = FullAttentionSpecs(layout);
  if (specs->size() != static_cast<size_t>(layout.num_layers)) {
    return InvalidArgument("KV pool: " + std::to_string(specs->size()) + " layer specs for " +
                           std::to_string(layout.num_layers) + " layers");
  }
  PW_ASSIGN_OR_RETURN(*first_page, BlockPageOffsets(*specs, layout, page_bytes));
  *pages_per_block = first_page->back();
  first_page->pop_back();
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<KvBlockPool>> KvBlockPool::Create(const KvLayout& layout, int num_blocks,
                                                         std::vector<KvLayerSpec> specs) {
  PW_RETURN_IF_ERROR(CheckLayout(layout, num_blocks));
  std::vector<int> first_page;
  int per_block = 0;
  const size_t page_bytes = MinPageBytes(layout, specs);
  PW_RETURN_IF_ERROR(LayOutLayers(layout, page_bytes, &specs, &first_page, &per_block));
  const int64_t pages = static_cast<int64_t>(num_blocks) * per_block;
  if (pages > (1ll << 31) - 1) return InvalidArgument("KV pool: too many pages");
  auto own = PagePool::Create(page_bytes, static_cast<int>(pages));
  if (!own.ok()) {
    return ResourceExhausted("KV pool: cannot allocate " + std::to_string(num_blocks) +
                             " blocks (" + own.status().message() + ")");
  }
  std::unique_ptr<KvBlockPool> p(new KvBlockPool(layout, std::move(specs), std::move(first_page),
                                                 per_block, own->get(), num_blocks));
  p->own_pages_ = std::move(own).value();
  return p;
}

Result<std::unique_ptr<KvBlockPool>> KvBlockPool::CreateOn(const KvLayout& layout, PagePool* pages,
                                                           int max_blocks,
                                                           std::vector<KvLayerSpec> specs) {
  PW_RETURN_IF_ERROR(CheckLayout(layout, max_blocks));
  if (pages == nullptr) return InvalidArgument("KV pool: no page pool");
  std::vector<int> first_page;
  int per_block = 0;
  PW_RETURN_IF_ERROR(LayOutLayers(layout, pages->page_bytes(), &specs, &first_page, &per_block));
  return std::unique_ptr<KvBlockPool>(new KvBlockPool(
      layout, std::move(specs), std::move(first_page), per_block, pages, max_blocks));
}

KvBlockPool::KvBlockPool(const KvLayout& layout, std::vector<KvLayerSpec> specs,
                         std::vector<int> first_page, int pages_per_block, PagePool* pages,
                         int num_blocks)
    : layout_(layout),
      specs_(std::move(specs)),
      first_page_(std::move(first_page)),
      pages_per_block_(pages_per_block),
      pages_(pages),
      num_blocks_(num_blocks),
      allocated_(static_cast<size_t>(num_blocks), 0),
      released_(static_cast<size_t>(num_blocks), 0),
      page_of_(static_cast<size_t>(num_blocks) * static_cast<size_t>(pages_per_block), -1),
      page_ptr_(page_of_.size(), nullptr) {
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
}

KvBlockPool::~KvBlockPool() {
  // Pages of blocks still allocated go back to a borrowed pool.
  if (own_pages_ == nullptr) {
    for (int b = 0; b < num_blocks_; ++b) {
      if (!allocated_[static_cast<size_t>(b)]) continue;
      std::vector<PageId> p;
      for (int k = 0; k < pages_per_block_; ++k) {
        const PageId id = page_of_[static_cast<size_t>(b) * pages_per_block_ + k];
        if (id >= 0) p.push_back(id);  // not released (ReleaseWindowPages)
      }
      (void)pages_->Free(p, Tenant::kKv);
    }
  }
}

size_t KvBlockPool::bytes_per_block() const {
  size_t n = 0;
  for (const KvLayerSpec& s : specs_) {
    // A recurrent-state layer counts as a full-attention one (protocol 1.3's blockBytes).
    n +=
        s.kind == KvKind::kRecurrentState ? layout_.bytes_per_layer() : LayerBlockBytes(s, layout_);
  }
  return n;
}

int KvBlockPool::num_free() const {
  const int by_pages = pages_->num_free() / pages_per_block_;
  return std::min(static_cast<int>(free_.size()), by_pages);
}

PageId KvBlockPool::PageOf(int32_t id, int layer) const {
  PW_CHECK(id >= 0 && id < num_blocks_ && layer >= 0 && layer < layout_.num_layers);
  const PageId p = page_of_[At(id, layer)];
  PW_CHECK(p >= 0);
  return p;
}

uint8_t* KvBlockPool::LayerPage(int32_t id, int layer) { return pages_->Page(PageOf(id, layer)); }
const uint8_t* KvBlockPool::LayerPage(int32_t id, int layer) const {
  return pages_->Page(PageOf(id, layer));
}

int KvBlockPool::LayerPages(int layer) const {
  PW_CHECK(layer >= 0 && layer < layout_.num_layers);
  const size_t l = static_cast<size_t>(layer);
  const int next = l + 1 < first_page_.size() ? first_page_[l + 1] : pages_per_block_;
  return next - first_page_[l];
}

PageId KvBlockPool::PageOf(int32_t id, int layer, int k) const {
  PW_CHECK(k >= 0 && k < LayerPages(layer));
  if (k == 0) return PageOf(id, layer);
  PW_CHECK(IsAllocated(id));
  return page_of_[At(id, layer) + static_cast<size_t>(k)];
}

uint8_t* KvBlockPool::LayerPage(int32_t id, int layer, int k) {
  PW_CHECK(k >= 0 && k < LayerPages(layer));
  if (k == 0) return LayerPage(id, layer);
  PW_CHECK(IsAllocated(id));
  return pages_->Page(page_of_[At(id, layer) + static_cast<size_t>(k)]);
}

const uint8_t* KvBlockPool::LayerPage(int32_t id, int layer, int k) const {
  return const_cast<KvBlockPool*>(this)->LayerPage(id, layer, k);
}

size_t KvBlockPool::SlabOffset(int layer, int kv, int kv_head) const {
  const KvLayerSpec& spec = specs_[static_cast<size_t>(layer)];
  return (static_cast<size_t>(kv) * LayerKvHeads(spec, layout_) + kv_head) * layout_.block_size *
         LayerHeadDim(spec, layout_);
}

float* KvBlockPool::Slab(int32_t block, int layer, int kv, int kv_head) {
  PW_CHECK(layout_.dtype == KvDtype::kF32);
  return reinterpret_cast<float*>(LayerPage(block, layer)) + SlabOffset(layer, kv, kv_head);
}

const float* KvBlockPool::Slab(int32_t block, int layer, int kv, int kv_head) const {
  return const_cast<KvBlockPool*>(this)->Slab(block, layer, kv, kv_head);
}

uint16_t* KvBlockPool::SlabBf16(int32_t block, int layer, int kv, int kv_head) {
  PW_CHECK(layout_.dtype == KvDtype::kBf16);
  return reinterpret_cast<uint16_t*>(LayerPage(block, layer)) + SlabOffset(layer, kv, kv_head);
}

const uint16_t* KvBlockPool::SlabBf16(int32_t block, int layer, int kv, int kv_head) const {
  return const_cast<KvBlockPool*>(this)->SlabBf16(block, layer, kv, kv_head);
}

Result<std::vector<int32_t>> KvBlockPool::Allocate(int n) {
  if (n < 0) return InvalidArgument("KV pool: cannot allocate " + std::to_string(n) + " blocks");
  if (n > static_cast<int>(free_.size())) {
    return ResourceExhausted("KV pool: " + std::to_string(n) + " blocks requested, " +
                             std::to_string(num_free()) + " of " + std::to_string(num_blocks_) +
                             " free");
  }
  auto pages = pages_->Allocate(n * pages_per_block_, Tenant::kKv);
  if (!pages.ok()) {
    return ResourceExhausted("KV pool: " + std::to_string(n) + " blocks requested, " +
                             std::to_string(num_free()) + " free (" + pages.status().message() +
                             ")");
  }
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int32_t id = free_.back();
    free_.pop_back();
    out[static_cast<size_t>(i)] = id;
    allocated_[static_cast<size_t>(id)] = 1;
    for (int k = 0; k < pages_per_block_; ++k) {
      const size_t at = static_cast<size_t>(id) * pages_per_block_ + k;
      page_of_[at] = (*pages)[static_cast<size_t>(i) * pages_per_block_ + k];
      page_ptr_[at] = pages_->Page(page_of_[at]);
    }
  }
  return out;
}

Status KvBlockPool::Free(std::span<const int32_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (!IsAllocated(id)) {
      return InvalidArgument("KV pool: block " + std::to_string(id) +
                             " is out of range or not allocated");
    }
    for (size_t j = 0; j < i; ++j) {
      if (ids[j] == id)
        return InvalidArgument("KV pool: block " + std::to_string(id) + " freed twice");
    }
  }
  std::vector<PageId> pages;
  pages.reserve(ids.size() * static_cast<size_t>(pages_per_block_));
  for (int32_t id : ids) {
    allocated_[static_cast<size_t>(id)] = 0;
    free_.push_back(id);
    released_[static_cast<size_t>(id)] = 0;
    for (int k = 0; k < pages_per_block_; ++k) {
      const size_t at = static_cast<size_t>(id) * pages_per_block_ + k;
      if (page_of_[at] < 0) continue;  // released (ReleaseWindowPages)
      pages.push_back(page_of_[at]);
      page_of_[at] = -1;
      page_ptr_[at] = nullptr;
    }
  }
  Status st = pages_->Free(pages, Tenant::kKv);
  PW_CHECK(st.ok());  // this pool is the only KV tenant of its pages
  return Status::Ok();
}

void KvBlockPool::ReadState(int32_t id, int layer, void* dst) const {
  const KvLayerSpec& spec = specs_[static_cast<size_t>(layer)];
  PW_CHECK(spec.kind == KvKind::kRecurrentState);
  const size_t page = pages_->page_bytes();
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (size_t done = 0, k = 0; done < spec.state_bytes; done += page, ++k) {
    const uint8_t* src = LayerPage(id, layer, static_cast<int>(k));
    std::memcpy(out + done, src, std::min(page, spec.state_bytes - done));
  }
}

void KvBlockPool::WriteState(int32_t id, int layer, const void* src) {
  const KvLayerSpec& spec = specs_[static_cast<size_t>(layer)];
  PW_CHECK(spec.kind == KvKind::kRecurrentState);
  const size_t page = pages_->page_bytes();
  const uint8_t* in = static_cast<const uint8_t*>(src);
  for (size_t done = 0, k = 0; done < spec.state_bytes; done += page, ++k) {
    uint8_t* dst = LayerPage(id, layer, static_cast<int>(k));
    std::memcpy(dst, in + done, std::min(page, spec.state_bytes - done));
  }
}

cpu::PagedKvView KvBlockPool::LayerView(int layer) const {
  PW_CHECK(layer >= 0 && layer < layout_.num_layers);
  cpu::PagedKvView v;
  const KvKind kind = specs_[static_cast<size_t>(layer)].kind;
  PW_CHECK(kind == KvKind::kFullAttention || kind == KvKind::kSlidingWindow);
  v.pages = page_ptr_.data() + first_page_[static_cast<size_t>(layer)];
  v.page_stride = static_cast<size_t>(pages_per_block_);
  v.element = layout_.dtype == KvDtype::kF32 ? cpu::KvElement::kF32 : cpu::KvElement::kBf16;
  v.num_kv_heads = LayerKvHeads(specs_[static_cast<size_t>(layer)], layout_);
  v.block_size = layout_.block_size;
  v.head_dim = LayerHeadDim(specs_[static_cast<size_t>(layer)], layout_);
  return v;
}

cpu::LatentKvView KvBlockPool::LatentView(int layer, int rope_dim) const {
  PW_CHECK(layer >= 0 && layer < layout_.num_layers);
  const KvLayerSpec& spec = specs_[static_cast<size_t>(layer)];
  PW_CHECK(spec.kind == KvKind::kLatent && rope_dim >= 0 && rope_dim < spec.latent_dim);
  cpu::LatentKvView v;
  v.pages = page_ptr_.data() + first_page_[static_cast<size_t>(layer)];
  v.page_stride = static_cast<size_t>(pages_per_block_);
  v.element = layout_.dtype == KvDtype::kF32 ? cpu::KvElement::kF32 : cpu::KvElement::kBf16;
  v.block_size = layout_.block_size;
  v.latent_dim = spec.latent_dim;
  v.rope_dim = rope_dim;
  return v;
}

Status KvBlockPool::ReleaseWindowPages(int32_t id) {
  if (!IsAllocated(id)) {
    return InvalidArgument("KV pool: block " + std::to_string(id) +
                           " is out of range or not allocated");
  }
  if (released_[static_cast<size_t>(id)]) return Status::Ok();
  released_[static_cast<size_t>(id)] = 1;
  std::vector<PageId> pages;
  for (size_t l = 0; l < specs_.size(); ++l) {
    if (specs_[l].kind != KvKind::kSlidingWindow) continue;
    const size_t at = At(id, static_cast<int>(l));
    pages.push_back(page_of_[at]);
    page_of_[at] = -1;
    page_ptr_[at] = nullptr;
  }
  if (pages.empty()) return Status::Ok();
  Status st = pages_->Free(pages, Tenant::kKv);
  PW_CHECK(st.ok());  // this pool is the only KV tenant of its pages
  return Status::Ok();
}

int KvBlockPool::LayerPagesInUse(int layer) const {
  PW_CHECK(layer >= 0 && layer < layout_.num_layers);
  int n = 0;
  for (int b = 0; b < num_blocks_; ++b) {
    if (allocated_[static_cast<size_t>(b)] && page_of_[At(b, layer)] >= 0) ++n;
  }
  return n * LayerPages(layer);
}

bool KvBlockPool::IsAllocated(int32_t id) const {
  return id >= 0 && id < num_blocks_ && allocated_[static_cast<size_t>(id)] != 0;
}

}  // namespace pw::memory
