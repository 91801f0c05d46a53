// WeightPageTable: a decode worker's expert weights as pages of its PagePool (DESIGN.md 4).
//
// One entry per linear block i = (layer, expert, gate_up | down), indexed by ExpertBlockIndex
// (common/expert_block.h). Each entry has
//   - q_i, the committed width: the engine reads the block at q_i bits; 0 = not resident;
//   - d_i, the desired width the broker's last plan asked for (q_i follows it);
//   - per bit-plane p (0 = most significant) a state ABSENT | LOADING | RESIDENT | RELEASING
//     and its pages: row tiles of PlaneTileRows(cols) rows, PlaneRowBytes(cols) bytes a row
//     (the kernels' page lists, kernels/anyprec/anyprec.h);
//   - the int8 LUT of width q_i (kernels/anyprec/q8.h) as row tiles of LutTileRows(b) rows,
//     2^b bytes a row, and its per-row fp32 scales (rows * 4 bytes, held beside the table:
//     they are 1/8 of one plane row at most and are not paged).
// Resident bytes of a block at width b: planes 0..b-1 and LUT_b; nothing of other widths.
//
// Changing a width is a transition q -> t, in two steps:
//   Begin(i, t): pages for what width t needs and the block lacks (planes q..t-1 when raising,
//     LUT_t whenever t > 0) are taken from the pool, all or nothing (never from KV in use:
//     only free pages; kResourceExhausted leaves everything as it was), and marked LOADING. The
//     caller fills them (the plane mover) while steps keep reading width q.
//   Commit(i): at an iteration boundary: q becomes t, the filled parts become RESIDENT, and
//     what width t does not use (planes t..q-1 when lowering, the old LUT) is RELEASING and its
//     pages go back to the pool at once: between steps no reader holds them.
//   Abort(i): the transfer failed: its pages go back, q stays.
// Lowering to 0 (or to a width whose LUT must be fetched) goes the same way; only t = 0 needs
// no transfer.
//
// Steps read the committed state only (View), and every mutation checks that no step is
// running (BeginStep / EndStep bracket Engine::Step), so nothing changes under a running step.
// One exception, a synchronous fetch (FetchBegin / FetchCommit / FetchAbort): a block at 0 is
// read by no one, so raising it from 0 may happen during a step; the caller fills its pages
// before the step's expert computation reads it.
// Not thread-safe: one thread (the worker's loop) uses it; page memory being filled belongs to
// the mover until Commit or Abort.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/expert_block.h"
#include "common/plane_layout.h"
#include "common/status.h"
#include "memory/page_pool.h"

namespace pw::memory {

enum class PartState : uint8_t { kAbsent, kLoading, kResident, kReleasing };
const char* PartStateName(PartState s);

// One bit-plane or one LUT of a block: its pages, in row order.
struct PagedPart {
  PartState state = PartState::kAbsent;
  std::vector<PageId> pages;
  std::vector<uint8_t*> addrs;  // pool addresses of `pages`
};

// What a Begin asks the caller to fill: each part's pages, in row order.
struct PartFill {
  int plane = -1;     // 0..7 for a bit-plane; -1 for the LUT
  int lut_bits = 0;   // the LUT's width when plane == -1
  int tile_rows = 0;  // rows per page
  size_t row_bytes = 0;
  std::vector<uint8_t*> pages;
};

class WeightPageTable {
 public:
  struct Entry {
    int rows = 0, cols = 0;
    uint8_t committed = 0;  // q_i
    uint8_t desired = 0;    // d_i
    int target = -1;        // width of the transition in flight, -1 = none
    PagedPart planes[anyprec::kNumPlanes];
    PagedPart lut;           // LUT of `committed`
    PagedPart next_lut;      // LUT of `target` while loading
    std::vector<float> lut_scales;       // of `committed`
    std::vector<float> next_lut_scales;  // of `target`, filled by the caller
  };

  // gate_up blocks are [2 * ffn, hidden], down blocks [hidden, ffn]. Every block starts
  // absent (q = d = 0). kInvalidArgument when one row of a plane or of an 8-bit LUT does not
  // fit a page.
  static Result<std::unique_ptr<WeightPageTable>> Create(PagePool* pool, int num_layers,
                                                         int num_experts, int hidden, int ffn);

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  int num_blocks() const { return static_cast<int>(entries_.size()); }
  size_t Index(int layer, int expert, ExpertProj proj) const {
    return ExpertBlockIndex(layer, expert, proj, num_experts_);
  }
  const Entry& entry(size_t i) const { return entries_[i]; }
  // Rows per page of a plane of a block with `cols` columns, and of a LUT of width `bits`.
  int PlaneTileRows(int cols) const;
  int LutTileRows(int bits) const;
  // Pages a block needs resident at width `bits` (planes and LUT).
  int PagesAt(size_t i, int bits) const;
  // Pages Begin(i, target) takes from the pool (new planes and the new LUT).
  int PagesToBegin(size_t i, int target) const;
  // The same as PagesAt for a rows x cols block in pages of `page_bytes` (sizing a pool before it exists).
  static int PagesFor(int rows, int cols, int bits, size_t page_bytes);

  void set_desired(size_t i, int bits) { entries_[i].desired = static_cast<uint8_t>(bits); }
  // Starts q_i -> target (0 or 3..8, != q_i, no transition in flight). Returns what to fill.
  Result<std::vector<PartFill>> Begin(size_t i, int target);
  // Commits the transition in flight of block i (see the file comment).
  Status Commit(size_t i);
  // Drops the transition in flight of block i; its pages return to the pool.
  Status Abort(size_t i);
  // Begin / Commit / Abort of a raise 0 -> target (3..8), allowed during a step (see the file
  // comment); kInvalidArgument when the block is not at 0 or the transition is not such a raise.
  Result<std::vector<PartFill>> FetchBegin(size_t i, int target);
  Status FetchCommit(size_t i);
  Status FetchAbort(size_t i);

  void BeginStep() { in_step_ = true; }
  void EndStep() { in_step_ = false; }

  // Pages the table holds (== the pool's kWeights count when the table is the only tenant).
  int pages_held() const { return pages_held_; }
  // Blocks committed at each width 0..8.
  std::vector<int> CommittedHistogram() const;
  // Bytes of weights resident at each width 0..8 (planes + LUTs, in pages).
  std::vector<uint64_t> CommittedPageBytes() const;

 private:
  WeightPageTable(PagePool* pool, int num_layers, int num_experts);
  Status TakePages(PagedPart* part, int n);
  void ReleasePart(PagedPart* part);
  Status CheckIdle(const char* what) const;
  Status CheckFetch(size_t i, int target) const;
  Result<std::vector<PartFill>> BeginAny(size_t i, int target);
  Status CommitAny(size_t i);
  Status AbortAny(size_t i);

  PagePool* pool_;
  int num_layers_, num_experts_;
  std::vector<Entry> entries_;
  int pages_held_ = 0;
  bool in_step_ = false;
};

}  // namespace pw::memory
