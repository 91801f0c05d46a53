// PagePool: one decode worker's memory for KV and expert weights (DESIGN.md section 4).
//
// One contiguous, page-aligned buffer of `num_pages` pages of `page_bytes` each, registered
// once with the transport, shared by two tenants:
//   - kKv: one page per (KV block, layer): the K and V of one layer for block_size tokens
//     (memory/kv_blocks.h lays them out);
//   - kWeights: one page per row tile of one bit-plane of an expert block, and row tiles of the
//     block's int8 LUT (memory/weight_page_table.h).
// Every page is the same size and either tenant may take any free page, so the bytes a dropped
// plane frees are usable by KV at once, with no copy and no compaction.
//
// Owner: the process that creates it (the decode worker); the engine and the page table
// borrow it. Allocation and release are serialized by an internal mutex; the page memory
// itself is not guarded (whoever holds a page's id owns its bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace pw::memory {

enum class Tenant : uint8_t { kFree = 0, kKv = 1, kWeights = 2 };
const char* TenantName(Tenant t);

using PageId = int32_t;

class PagePool {
 public:
  // page_bytes: a positive multiple of 64; num_pages >= 1. kResourceExhausted when the
  // buffer cannot be allocated (the message gives the bytes asked for).
  static Result<std::unique_ptr<PagePool>> Create(size_t page_bytes, int num_pages);
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  size_t page_bytes() const { return page_bytes_; }
  int num_pages() const { return num_pages_; }
  size_t total_bytes() const { return page_bytes_ * static_cast<size_t>(num_pages_); }
  uint8_t* base() { return base_; }
  const uint8_t* base() const { return base_; }
  // Start of page `id` (id in range: a broken invariant aborts).
  uint8_t* Page(PageId id) {
    CheckId(id);
    return base_ + static_cast<size_t>(id) * page_bytes_;
  }
  const uint8_t* Page(PageId id) const { return const_cast<PagePool*>(this)->Page(id); }
  // Byte offset of page `id` from base() (what a peer puts to or gets from).
  uint64_t Offset(PageId id) const { return static_cast<uint64_t>(id) * page_bytes_; }

  // Takes n free pages for `tenant` (kKv or kWeights), all or nothing; kResourceExhausted
  // (nothing taken) when fewer than n are free.
  Result<std::vector<PageId>> Allocate(int n, Tenant tenant);
  // Returns pages to the pool. kInvalidArgument (nothing freed) if an id is out of range, not
  // held by `tenant`, or repeated.
  Status Free(std::span<const PageId> ids, Tenant tenant);
  // True if `id` is in range and held by `tenant`.
  bool Holds(PageId id, Tenant tenant) const;

  int num_free() const;
  // Pages held by `tenant` now (kFree: the free pages).
  int Count(Tenant tenant) const;
  // Sum of Count over tenants == num_pages(); false means the accounting broke (tests).
  bool Balanced() const;

 private:
  PagePool(size_t page_bytes, int num_pages, uint8_t* base);
  void CheckId(PageId id) const;

  const size_t page_bytes_;
  const int num_pages_;
  uint8_t* const base_;
  mutable std::mutex mu_;
  std::vector<PageId> free_;    // stack of free ids (lowest handed out first)
  std::vector<Tenant> owner_;   // per page
  int count_[3] = {0, 0, 0};    // by tenant
};

}  // namespace pw::memory
