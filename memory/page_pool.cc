#include "memory/page_pool.h"

#include <cstdlib>
#include <cstring>


namespace pw::memory {

const char* TenantName(Tenant t) {
  switch (t) {
    case Tenant::kFree:
      return "free";
    case Tenant::kKv:
      return "kv";
    case Tenant::kWeights:
      return "weights";
  }
  return "unknown";
}

Result<std::unique_ptr<PagePool>> PagePool::Create(size_t page_bytes, int num_pages) {
  if (page_bytes == 0 || page_bytes % 64 != 0 || num_pages < 1) {
    return InvalidArgument("page pool: page_bytes must be a positive multiple of 64 and "
                           "num_pages >= 1 (got page_bytes=" + std::to_string(page_bytes) +
                           " num_pages=" + std::to_string(num_pages) + ")");
  }
  const size_t bytes = page_bytes * static_cast<size_t>(num_pages);
  const size_t align = 4096;
  void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
  if (p == nullptr) {
    return ResourceExhausted("page pool: cannot allocate " + std::to_string(bytes) +
                             " bytes for " + std::to_string(num_pages) + " pages");
  }
  std::memset(p, 0, bytes);
  return std::unique_ptr<PagePool>(new PagePool(page_bytes, num_pages, static_cast<uint8_t*>(p)));
}

PagePool::PagePool(size_t page_bytes, int num_pages, uint8_t* base)
    : page_bytes_(page_bytes),
      num_pages_(num_pages),
      base_(base),
      owner_(static_cast<size_t>(num_pages), Tenant::kFree) {
  free_.reserve(static_cast<size_t>(num_pages));
  for (int i = num_pages - 1; i >= 0; --i) free_.push_back(i);
  count_[0] = num_pages;
}

PagePool::~PagePool() { std::free(base_); }

void PagePool::CheckId(PageId id) const { PW_CHECK(id >= 0 && id < num_pages_); }

Result<std::vector<PageId>> PagePool::Allocate(int n, Tenant tenant) {
  if (n < 0 || tenant == Tenant::kFree) {
    return InvalidArgument("page pool: cannot allocate " + std::to_string(n) + " pages for " +
                           TenantName(tenant));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (static_cast<size_t>(n) > free_.size()) {
    return ResourceExhausted("page pool: " + std::to_string(n) + " pages requested for " +
                             TenantName(tenant) + ", " + std::to_string(free_.size()) + " of " +
                             std::to_string(num_pages_) + " free");
  }
  std::vector<PageId> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] = free_.back();
    free_.pop_back();
    owner_[static_cast<size_t>(out[static_cast<size_t>(i)])] = tenant;
  }
  count_[0] -= n;
  count_[static_cast<int>(tenant)] += n;
  return out;
}

Status PagePool::Free(std::span<const PageId> ids, Tenant tenant) {
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    const PageId id = ids[i];
    if (id < 0 || id >= num_pages_ || owner_[static_cast<size_t>(id)] != tenant ||
        tenant == Tenant::kFree) {
      return InvalidArgument("page pool: page " + std::to_string(id) +
                             " is out of range or not held by " + TenantName(tenant));
    }
    for (size_t j = 0; j < i; ++j) {
      if (ids[j] == id) return InvalidArgument("page pool: page " + std::to_string(id) + " freed twice");
    }
  }
  for (PageId id : ids) {
    owner_[static_cast<size_t>(id)] = Tenant::kFree;
    free_.push_back(id);
  }
  count_[static_cast<int>(tenant)] -= static_cast<int>(ids.size());
  count_[0] += static_cast<int>(ids.size());
  return Status::Ok();
}

bool PagePool::Holds(PageId id, Tenant tenant) const {
  std::lock_guard<std::mutex> l(mu_);
  return id >= 0 && id < num_pages_ && owner_[static_cast<size_t>(id)] == tenant;
}

int PagePool::num_free() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(free_.size());
}

int PagePool::Count(Tenant tenant) const {
  std::lock_guard<std::mutex> l(mu_);
  return count_[static_cast<int>(tenant)];
}

bool PagePool::Balanced() const {
  std::lock_guard<std::mutex> l(mu_);
  int by_owner[3] = {0, 0, 0};
  for (Tenant t : owner_) by_owner[static_cast<int>(t)]++;
  return by_owner[0] == count_[0] && by_owner[1] == count_[1] && by_owner[2] == count_[2] &&
         count_[0] + count_[1] + count_[2] == num_pages_ &&
         static_cast<size_t>(count_[0]) == free_.size();
}

}  // namespace pw::memory
