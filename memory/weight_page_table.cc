#include "memory/weight_page_table.h"

#include <algorithm>

namespace pw::memory {

static int CeilDiv(int a, int b) { return (a + b - 1) / b; }

const char* PartStateName(PartState s) {
  switch (s) {
    case PartState::kAbsent:
      return "absent";
    case PartState::kLoading:
      return "loading";
    case PartState::kResident:
      return "resident";
    case PartState::kReleasing:
      return "releasing";
  }
  return "unknown";
}

WeightPageTable::WeightPageTable(PagePool* pool, int num_layers, int num_experts)
    : pool_(pool), num_layers_(num_layers), num_experts_(num_experts) {}

Result<std::unique_ptr<WeightPageTable>> WeightPageTable::Create(PagePool* pool, int num_layers,
                                                                 int num_experts, int hidden,
                                                                 int ffn) {
  if (pool == nullptr || num_layers < 1 || num_experts < 1 || hidden < 1 || ffn < 1) {
    return InvalidArgument("weight page table: a pool and positive layers, experts, hidden and ffn are required");
  }
  std::unique_ptr<WeightPageTable> t(new WeightPageTable(pool, num_layers, num_experts));
  if (t->PlaneTileRows(hidden) < 1 || t->PlaneTileRows(ffn) < 1 || t->LutTileRows(anyprec::kMaxBits) < 1) {
    return InvalidArgument("weight page table: pages of " + std::to_string(pool->page_bytes()) +
                           " bytes cannot hold one row of a plane (" +
                           std::to_string(anyprec::PlaneRowBytes(std::max(hidden, ffn))) +
                           " bytes) or of an 8-bit LUT (256 bytes)");
  }
  t->entries_.resize(static_cast<size_t>(num_layers) * num_experts * 2);
  for (int l = 0; l < num_layers; ++l) {
    for (int e = 0; e < num_experts; ++e) {
      Entry& g = t->entries_[t->Index(l, e, ExpertProj::kGateUp)];
      g.rows = 2 * ffn;
      g.cols = hidden;
      Entry& d = t->entries_[t->Index(l, e, ExpertProj::kDown)];
      d.rows = hidden;
      d.cols = ffn;
    }
  }
  return t;
}

int WeightPageTable::PlaneTileRows(int cols) const {
  return static_cast<int>(pool_->page_bytes() / anyprec::PlaneRowBytes(cols));
}

int WeightPageTable::LutTileRows(int bits) const {
  return static_cast<int>(pool_->page_bytes() >> bits);
}

int WeightPageTable::PagesFor(int rows, int cols, int bits, size_t page_bytes) {
  if (bits == 0) return 0;
  const int plane_tile = static_cast<int>(page_bytes / anyprec::PlaneRowBytes(cols));
  const int lut_tile = static_cast<int>(page_bytes >> bits);
  if (plane_tile < 1 || lut_tile < 1) return -1;
  return bits * CeilDiv(rows, plane_tile) + CeilDiv(rows, lut_tile);
}

int WeightPageTable::PagesToBegin(size_t i, int target) const {
  const Entry& e = entries_[i];
  const int planes = std::max(0, target - static_cast<int>(e.committed)) * CeilDiv(e.rows, PlaneTileRows(e.cols));
  return planes + (target > 0 ? CeilDiv(e.rows, LutTileRows(target)) : 0);
}

int WeightPageTable::PagesAt(size_t i, int bits) const {
  if (bits == 0) return 0;
  const Entry& e = entries_[i];
  return bits * CeilDiv(e.rows, PlaneTileRows(e.cols)) + CeilDiv(e.rows, LutTileRows(bits));
}

Status WeightPageTable::CheckIdle(const char* what) const {
  if (in_step_) return Internal(std::string("weight page table: ") + what + " during a step");
  return Status::Ok();
}

Result<std::vector<PartFill>> WeightPageTable::Begin(size_t i, int target) {
  PW_RETURN_IF_ERROR(CheckIdle("Begin"));
  return BeginAny(i, target);
}

Status WeightPageTable::CheckFetch(size_t i, int target) const {
  if (i >= entries_.size()) return InvalidArgument("weight page table: no block " + std::to_string(i));
  const Entry& e = entries_[i];
  if (e.committed != 0 || target < anyprec::kMinBits || target > anyprec::kMaxBits) {
    return InvalidArgument("weight page table: a fetch raises a block from 0 (block " + std::to_string(i) +
                           " is at " + std::to_string(e.committed) + ", target " + std::to_string(target) + ")");
  }
  return Status::Ok();
}

Result<std::vector<PartFill>> WeightPageTable::FetchBegin(size_t i, int target) {
  PW_RETURN_IF_ERROR(CheckFetch(i, target));
  return BeginAny(i, target);
}

Status WeightPageTable::FetchCommit(size_t i) {
  PW_RETURN_IF_ERROR(CheckFetch(i, i < entries_.size() ? entries_[i].target : 0));
  return CommitAny(i);
}

Status WeightPageTable::FetchAbort(size_t i) {
  PW_RETURN_IF_ERROR(CheckFetch(i, i < entries_.size() ? entries_[i].target : 0));
  return AbortAny(i);
}

Result<std::vector<PartFill>> WeightPageTable::BeginAny(size_t i, int target) {
  if (i >= entries_.size()) return InvalidArgument("weight page table: no block " + std::to_string(i));
  Entry& e = entries_[i];
  if (target != 0 && (target < anyprec::kMinBits || target > anyprec::kMaxBits)) {
    return InvalidArgument("weight page table: width " + std::to_string(target) +
                           " is not 0 or 3..8");
  }
  if (e.target >= 0) return InvalidArgument("weight page table: block " + std::to_string(i) + " is already changing");
  if (target == e.committed) return InvalidArgument("weight page table: block " + std::to_string(i) + " is already at " + std::to_string(target) + " bits");
  const int q = e.committed;
  const int plane_tile = PlaneTileRows(e.cols);
  const int plane_pages = CeilDiv(e.rows, plane_tile);
  const int new_planes = std::max(0, target - q);
  const int lut_tile = target > 0 ? LutTileRows(target) : 0;
  const int lut_pages = target > 0 ? CeilDiv(e.rows, lut_tile) : 0;
  const int total = new_planes * plane_pages + lut_pages;
  std::vector<PageId> pages;
  if (total > 0) {
    PW_ASSIGN_OR_RETURN(pages, pool_->Allocate(total, Tenant::kWeights));
  }
  pages_held_ += total;
  std::vector<PartFill> fills;
  size_t next = 0;
  auto hand_out = [&](PagedPart* part, int n, PartFill* fill) {
    part->state = PartState::kLoading;
    part->pages.assign(pages.begin() + static_cast<ptrdiff_t>(next),
                       pages.begin() + static_cast<ptrdiff_t>(next + static_cast<size_t>(n)));
    next += static_cast<size_t>(n);
    part->addrs.clear();
    for (PageId p : part->pages) part->addrs.push_back(pool_->Page(p));
    fill->pages = part->addrs;
  };
  for (int p = q; p < target; ++p) {
    PartFill f;
    f.plane = p;
    f.tile_rows = plane_tile;
    f.row_bytes = anyprec::PlaneRowBytes(e.cols);
    hand_out(&e.planes[p], plane_pages, &f);
    fills.push_back(std::move(f));
  }
  if (target > 0) {
    PartFill f;
    f.lut_bits = target;
    f.tile_rows = lut_tile;
    f.row_bytes = static_cast<size_t>(1) << target;
    hand_out(&e.next_lut, lut_pages, &f);
    e.next_lut_scales.assign(static_cast<size_t>(e.rows), 0.f);
    fills.push_back(std::move(f));
  }
  e.target = target;
  return fills;
}

void WeightPageTable::ReleasePart(PagedPart* part) {
  if (part->pages.empty()) {
    part->state = PartState::kAbsent;
    return;
  }
  part->state = PartState::kReleasing;
  Status st = pool_->Free(part->pages, Tenant::kWeights);
  PW_CHECK(st.ok());  // the table is the only holder of its pages
  pages_held_ -= static_cast<int>(part->pages.size());
  part->pages.clear();
  part->addrs.clear();
  part->state = PartState::kAbsent;
}

Status WeightPageTable::Commit(size_t i) {
  PW_RETURN_IF_ERROR(CheckIdle("Commit"));
  return CommitAny(i);
}

Status WeightPageTable::CommitAny(size_t i) {
  if (i >= entries_.size()) return InvalidArgument("weight page table: no block " + std::to_string(i));
  Entry& e = entries_[i];
  if (e.target < 0) return InvalidArgument("weight page table: block " + std::to_string(i) + " has no change in flight");
  const int q = e.committed, t = e.target;
  for (int p = q; p < t; ++p) e.planes[p].state = PartState::kResident;
  for (int p = t; p < q; ++p) ReleasePart(&e.planes[p]);
  ReleasePart(&e.lut);
  std::swap(e.lut, e.next_lut);
  if (t > 0) e.lut.state = PartState::kResident;
  e.lut_scales.swap(e.next_lut_scales);
  e.next_lut_scales.clear();
  if (t == 0) e.lut_scales.clear();
  e.committed = static_cast<uint8_t>(t);
  e.target = -1;
  return Status::Ok();
}

Status WeightPageTable::Abort(size_t i) {
  PW_RETURN_IF_ERROR(CheckIdle("Abort"));
  return AbortAny(i);
}

Status WeightPageTable::AbortAny(size_t i) {
  if (i >= entries_.size()) return InvalidArgument("weight page table: no block " + std::to_string(i));
  Entry& e = entries_[i];
  if (e.target < 0) return InvalidArgument("weight page table: block " + std::to_string(i) + " has no change in flight");
  for (int p = e.committed; p < e.target; ++p) ReleasePart(&e.planes[p]);
  ReleasePart(&e.next_lut);
  e.next_lut_scales.clear();
  e.target = -1;
  return Status::Ok();
}

std::vector<int> WeightPageTable::CommittedHistogram() const {
  std::vector<int> h(anyprec::kMaxBits + 1, 0);
  for (const Entry& e : entries_) h[e.committed]++;
  return h;
}

std::vector<uint64_t> WeightPageTable::CommittedPageBytes() const {
  std::vector<uint64_t> b(anyprec::kMaxBits + 1, 0);
  for (size_t i = 0; i < entries_.size(); ++i) {
    b[entries_[i].committed] += static_cast<uint64_t>(PagesAt(i, entries_[i].committed)) * pool_->page_bytes();
  }
  return b;
}

}  // namespace pw::memory
