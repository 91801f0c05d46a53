// PagedWeights: a decode worker's any-precision experts in its page pool (DESIGN.md 4).
//
// Ties together what the worker lends it and what it owns:
//   - the weight page table (memory/weight_page_table.h) over the worker's PagePool;
//   - the plane mover (plane_mover.h) reading the broker's mapped .apw store;
//   - the manifest: where each plane and LUT of each block lies in the store, and its
//     checksum (checked against the shapes this worker computes from its own config);
//   - the engine-facing provider (provider()): every expert block runs on the fast path at its
//     committed width, straight from its pages. A block at width 0 (not resident) is fetched
//     synchronously into scratch at its desired width (or 3) for that call and counted.
//
// Plans set desired widths (SetDesired). At every iteration boundary the worker calls Poll():
// finished transfers are committed (or aborted: the block keeps its width, pages go back),
// then new transitions start for blocks whose desired width differs from the committed one,
// while free pages allow (never taking KV's pages) and at most max_in_flight at a time.
// Lowering needs only the small LUT of the new width; raising also the missing planes. A block
// whose transfer failed keeps its width and is tried again a second later.
// Everything but the mover's thread runs on the worker's loop thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/formats/model_config.h"
#include "common/status.h"
#include "memory/page_pool.h"
#include "memory/weight_page_table.h"
#include "engine/experts/moe.h"
#include "services/proto/codec.h"
#include "services/transport/ucx.h"
#include "services/workers/weights/plane_mover.h"
#include "kernels/anyprec/q8.h"
#include "engine/experts/apw_expert_provider.h"

namespace pw::workers {

// How background width changes (raises, lowerings, a residency budget's admissions) give way
// to the decode step (plane_mover.h, "Pacing"):
//   kFree    - they run whenever they are queued;
//   kFetches - the mover holds back while a synchronous fetch (FetchBlockNow, the scratch
//              path) runs, so the step's own fetches do not wait behind it;
//   kSteps   - it holds back for the whole of every engine step (BeginStep .. EndStep): pages
//              move between steps (and, bounded by PlaneMover::Options::max_held_us, one get
//              at a time when steps run back to back);
//   kAuto    - the decode worker's default: kSteps with a residency budget whose experts are
//              small (at most kAutoStepsMaxExpertBytes at the initial width: a fetch is then
//              a round trip, and admissions moving during the step delay it), kFree otherwise
//              (the planner's raises move as soon as asked; a large expert's admission held
//              through long steps would starve). PagedWeights reads it as kFree.
//              (docs/benchmarks.md: on the embedded model, 61 KiB experts, steps beat free;
//              on the OLMoE-dimension one, 3.1 MiB, free beat steps.)
enum class MoverPacing { kFree, kFetches, kSteps, kAuto };
inline constexpr double kAutoStepsMaxExpertBytes = 1 << 20;
// "free" | "fetches" | "steps" | "auto"; kInvalidArgument otherwise.
Result<MoverPacing> ParseMoverPacing(const std::string& name);
const char* MoverPacingName(MoverPacing p);

struct PagedWeightsOptions {
  uint64_t max_bytes_per_s = 0;  // plane transfer rate limit; 0 = unlimited
  int max_in_flight = 8;         // block transitions in flight at once
  int timeout_ms = 10000;        // per UCX get
  MoverPacing pacing = MoverPacing::kFree;
};

// A committed change, for PlanAck and metrics.
struct WidthChange {
  size_t block = 0;
  int from = 0, to = 0;
};

struct PagedWeightsStats {
  uint64_t planes_raised = 0, planes_lowered = 0;  // planes made resident / released
  uint64_t bytes_raised = 0;                       // bytes read from the store by transitions
  uint64_t bytes_released = 0;                     // page bytes returned by lowering
  uint64_t transitions_committed = 0, transitions_failed = 0;
  uint64_t sync_fetches = 0, sync_fetch_bytes = 0;
};

class PagedWeights {
 public:
  // Validates `manifest` (an any-precision one) against `config`'s shapes: every block's
  // 8 planes and 6 LUTs present once, sizes as computed here, inside the advertised region.
  static Result<std::unique_ptr<PagedWeights>> Create(memory::PagePool* pool, const ModelConfig& config,
                                                      transport::ucx::Worker& ucx,
                                                      wire::WeightManifest::Reader manifest,
                                                      PagedWeightsOptions options);
  ~PagedWeights();

  engine::ExpertWeightProvider* provider();
  memory::WeightPageTable& table() { return *table_; }
  const memory::WeightPageTable& table() const { return *table_; }
  // Whether block i (ExpertBlockIndex over the model's layers) exists: false in a dense layer.
  bool HasBlock(size_t i) const {
    const size_t layer = i / kProjsPerExpert / static_cast<size_t>(table_->num_experts());
    return layer < block_layers_.size() && block_layers_[layer];
  }
  const PagedWeightsStats& stats() const { return stats_; }
  // Seconds each raise committed since the last call took, submit to arrival.
  std::vector<double> TakeRaiseSeconds() { return std::exchange(raise_seconds_, {}); }
  uint64_t store_hash() const { return store_hash_; }

  // A plan's changes as (block, desired width); kInvalidArgument names a block outside the
  // model. Widths are checked by SetDesired.
  Result<std::vector<std::pair<size_t, int>>> PlanChanges(wire::Plan::Reader plan) const;
  // Desired widths (0 or 3..8) of the listed blocks; kInvalidArgument names a bad one and
  // changes nothing.
  Status SetDesired(const std::vector<std::pair<size_t, int>>& changes);
  // Every block to `bits`, synchronously (start-up): returns when all are committed, or the
  // first error (a block that does not fit the pool is an error here). `while_waiting` runs
  // between polls (the caller's heartbeats: loading takes seconds, its peers must not think
  // it dead meanwhile).
  Status LoadAll(int bits, int timeout_ms, const std::function<void()>& while_waiting = {});
  // The iteration boundary: commits finished transitions, starts new ones, leaving at least
  // `reserve_pages` pages free for KV (raises never take what running requests will need;
  // a lowering's new LUT may, since its commit frees more than it took).
  // Returns what was committed now.
  std::vector<WidthChange> Poll(int reserve_pages = 0);
  // A restarted broker: fails the transfers in flight (their blocks keep their widths) and
  // reads from the new broker's store, after checking its manifest as Create does.
  Status Rebind(transport::ucx::Worker& ucx, wire::WeightManifest::Reader manifest);
  // Blocks whose committed width differs from the desired one, and transitions in flight.
  int pending() const;
  int in_flight() const { return static_cast<int>(in_flight_); }
  // The broker went away: fail what is in flight (those blocks keep their widths).
  void CancelTransfers(const std::string& why);

  // A synchronous fetch, allowed during a step: block `block`, at width 0 with no transition
  // in flight, is read from the store into pool pages at `bits` and committed before this
  // returns (WeightPageTable::FetchBegin). kResourceExhausted (nothing changed) when the pool
  // lacks the pages; a failed get or checksum gives its pages back and leaves the block at 0.
  // *bytes gains the bytes read; `times` (optional) where the time went.
  Status FetchBlockNow(size_t block, int bits, uint64_t* bytes, FetchTimes* times = nullptr);

  // Engine step brackets (nothing in the table changes in between; with MoverPacing::kSteps
  // the mover holds back in between).
  void BeginStep();
  void EndStep();
  // The background mover's pacing waits (plane_mover.h), summed over the movers so far.
  PlaneMover::PacingStats pacing() const;

 private:
  class Provider;
  PagedWeights() = default;
  struct PartRef {
    uint64_t offset = 0, bytes = 0, checksum = 0;
    bool present = false;
  };
  // [block][0..7 planes, 8 + (b - 3) LUT of width b]
  static constexpr int kPartsPerBlock = anyprec::kNumPlanes + (anyprec::kMaxBits - anyprec::kMinBits + 1);
  PartRef& Ref(size_t block, int slot) { return parts_[block * kPartsPerBlock + static_cast<size_t>(slot)]; }
  Status StartTransition(size_t block, int target);
  Status ReadManifest(wire::WeightManifest::Reader manifest, std::vector<PartRef>* parts) const;
  Status StartMover(transport::ucx::Worker& ucx, wire::WeightManifest::Reader manifest);
  void Finish(MoveResult& r, std::vector<WidthChange>* committed);
  MoveJob MakeJob(size_t block, int target, const std::vector<memory::PartFill>& fills);

  memory::PagePool* pool_ = nullptr;
  std::unique_ptr<memory::WeightPageTable> table_;
  std::unique_ptr<PlaneMover> mover_;
  std::vector<std::unique_ptr<PlaneMover>> retiring_;  // cancelled, results not all taken back
  PlaneMover* held_ = nullptr;                          // held for the step (kSteps)
  PlaneMover::PacingStats retired_pacing_;              // of movers let go
  std::unique_ptr<Provider> provider_;
  std::vector<PartRef> parts_;
  PagedWeightsOptions options_;
  PagedWeightsStats stats_;
  uint64_t store_hash_ = 0;
  uint64_t next_job_ = 1;
  size_t in_flight_ = 0;
  size_t scan_from_ = 0;  // round-robin start of the pending scan
  std::vector<double> raise_seconds_;
  std::vector<uint64_t> retry_at_ms_;  // per block: failed transfer, not before this (0 = now)
  std::vector<bool> block_layers_;     // per model layer: whether it has expert blocks
};

}  // namespace pw::workers
