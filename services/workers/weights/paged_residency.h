// PagedResidency: a decode worker's residency budget for experts (DESIGN.md 5.2), applied to
// its paged weights (paged_weights.h).
//
// What owns what:
//   - the miss policy (policies/misses/miss_policy.h) is the one source of truth on which
//     experts are resident: it decides every miss in the engine's routing hook
//     (engine/hooks/miss_routing_hook.h, after LYNX when both run) under a capacity of
//     experts per MoE layer, with external admission;
//   - the weight page table follows it: a block's desired width d_i is its plan width (the
//     broker's last plan, kept here) when its expert is resident or being admitted, 0
//     otherwise; every iteration boundary sets them so, then PagedWeights::Poll moves pages;
//   - this class is the engine's ExpertFetcher (engine/experts/moe.h, seam (e)):
//       Fetch  = a synchronous UCX get of the expert's blocks into pool pages at their plan
//                width, committed before the layer's experts run (PagedWeights::FetchBlockNow).
//                When the pool has no pages above the KV reserve, or the block is being
//                admitted already, the block stays at 0 and the provider fetches it into
//                scratch for each use (counted as a scratch fetch) until a raise commits;
//       Admit  = the block's desired width is raised; the plane mover loads it in the
//                background and, when both blocks of the expert have committed at a boundary,
//                the policy's AdmissionDone makes it resident (its victim, if any, is evicted);
//       Evict  = the expert is no longer resident for the policy at once (later tokens of the
//                step substitute or fetch it), but nothing moves during the step (an earlier
//                token may still read it); its blocks drop to 0 at the next boundary and their
//                pages return to the pool, for KV or other experts.
//   Misses, substitutions, evictions and admissions are counted in the policy's MissStats.
//   So the policy's resident set is always contained in what the table holds or is fetching,
//   and at each boundary the table is set to follow it again (Check() verifies both).
//
// Cold start: no expert is resident until the first tokens fetch them. Driving thread only
// (Fetch / Admit / Evict from the engine's step, the rest from the worker's loop).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "memory/page_pool.h"
#include "policies/misses/miss_policy.h"
#include "policies/misses/miss_settings.h"
#include "engine/hooks/miss_routing_hook.h"
#include "engine/experts/moe.h"
#include "engine/hooks/routing_hook_chain.h"
#include "services/workers/weights/paged_weights.h"

namespace pw::workers {

struct ResidencyStats {
  uint64_t fetches = 0;          // experts fetched synchronously into pool pages
  uint64_t fetch_bytes = 0;      // bytes those fetches read
  uint64_t scratch_fetches = 0;  // expert fetches left to the provider's scratch path
  uint64_t admissions_started = 0, admissions_committed = 0;
};

class PagedResidency final : public engine::ExpertFetcher {
 public:
  // True when `settings` name a budget (residency or residency_bytes): the worker runs one.
  static bool Enabled(const misses::MissSettings& s) { return s.residency || s.residency_bytes; }
  // `settings` must name a budget (residency or residency_bytes); the capacity is computed as
  // pw-eval's emulation does (bf16 expert bytes for a byte budget). Every block's plan width
  // becomes `initial_bits` and its desired width 0 (nothing resident). `weights` and `pool`
  // are borrowed.
  static Result<std::unique_ptr<PagedResidency>> Create(const misses::MissSettings& settings,
                                                        const ModelConfig& config,
                                                        PagedWeights* weights,
                                                        memory::PagePool* pool, int initial_bits);

  // Installs the policy into `hooks` (routing hook after `before`, e.g. LYNX; residency;
  // fetcher). The hooks borrow this object.
  void Install(engine::RoutingHook* before, engine::MoeHooks* hooks);

  // A plan's widths (replaces PagedWeights::SetDesired while a budget runs): validated the same
  // way, kept as plan widths; resident blocks follow them at the next boundary.
  Status SetPlanWidths(const std::vector<std::pair<size_t, int>>& changes);

  // The iteration boundary (replaces PagedWeights::Poll): desired widths from the policy,
  // Poll, admissions whose blocks committed made resident. Returns what committed.
  std::vector<WidthChange> Boundary(int reserve_pages);

  // engine::ExpertFetcher (called from the routing hook during a step).
  Status Fetch(int layer, int expert) override;
  Status Admit(int layer, int expert) override;
  void Evict(int layer, int expert) override;

  // OK when the table agrees with the policy (see the file comment): every resident or
  // admitting expert's blocks desired at their plan width, every other block desired at 0;
  // with `settled` (after a boundary with nothing in flight and pages to spare) also every
  // resident expert committed. Otherwise kInternal naming the first disagreement.
  Status Check(bool settled) const;

  const misses::MissPolicy& policy() const { return *policy_; }
  const engine::MissRoutingHook& hook() const { return *hook_; }
  const ResidencyStats& stats() const { return stats_; }
  int capacity() const { return capacity_; }
  // Layers with expert blocks: the budget is capacity() experts in each.
  int num_moe_layers() const { return num_moe_layers_; }
  // The broker's width for `block` when its expert is resident (the last plan's, else the
  // initial width).
  int PlanBits(size_t block) const;
  // Experts the policy holds resident, over all layers.
  int resident_experts() const;
  // Seconds each synchronous fetch took since the last call.
  std::vector<double> TakeFetchSeconds() { return std::exchange(fetch_seconds_, {}); }
  // Where each fetch into pages spent its time (UCX get, checks, page table), since the last
  // call.
  std::vector<FetchTimes> TakeFetchPhases() { return std::exchange(fetch_phases_, {}); }
  // For every step that fetched, the seconds it waited on synchronous fetches (summed between
  // two boundaries), since the last call.
  std::vector<double> TakeStepWaits() { return std::exchange(step_waits_, {}); }

 private:
  PagedResidency() = default;
  size_t Block(int layer, int expert, ExpertProj proj) const {
    return weights_->table().Index(layer, expert, proj);
  }
  bool Wanted(int layer, int expert) const;
  void Follow();  // desired widths from the policy

  PagedWeights* weights_ = nullptr;
  memory::PagePool* pool_ = nullptr;
  std::unique_ptr<misses::MissPolicy> policy_;
  std::unique_ptr<engine::MissRoutingHook> hook_;
  std::unique_ptr<engine::RoutingHookChain> chain_;
  std::vector<uint8_t> plan_bits_;   // [block] the broker's width for the block when resident
  std::vector<uint8_t> admitting_;   // [layer * E + expert] an admission is loading
  int num_layers_ = 0, num_experts_ = 0, capacity_ = 0, num_moe_layers_ = 0;
  int reserve_pages_ = 0;            // the KV reserve of the last boundary
  ResidencyStats stats_;
  std::vector<double> fetch_seconds_;
  std::vector<FetchTimes> fetch_phases_;
  std::vector<double> step_waits_;
  double step_wait_ = 0;  // this step's so far
};

}  // namespace pw::workers
