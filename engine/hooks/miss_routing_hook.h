// MissRoutingHook: runs an expert-miss policy (policies/misses) as the engine's routing hook
// (moe.h, seam (c)) and its residency (seam (b)).
//
// For each token of the layer, in batch order, the policy decides every selected expert:
// resident (kept), fetched (kept; the fetch goes through ctx.fetcher when the engine has one,
// moe.h seam (e)), or substituted (the entry names the substitute, keeps the missed expert's
// gate weight, rank -1). Admission requests and evictions go to the fetcher too. It may run
// after LYNX in a chain (routing_hook_chain.h): it takes whatever entries the hooks before it
// left, provided each token's entries are contiguous (kInternal otherwise).
//
// The per-token substituted gate mass m of the last call is kept (last_masses(), [T]) for
// export; the policy's MissStats sum it. Driving thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "policies/misses/miss_policy.h"
#include "engine/experts/moe.h"

namespace pw::engine {

class MissRoutingHook final : public RoutingHook, public ExpertResidency {
 public:
  // `policy` is borrowed and must outlive the hook.
  explicit MissRoutingHook(misses::MissPolicy* policy) : policy_(policy) {}
  Status Rewrite(const RoutingContext& ctx, std::vector<ExpertAssignment>* assignments) override;
  bool IsResident(int layer, int expert) const override { return policy_->IsResident(layer, expert); }

  const misses::MissStats& stats() const { return policy_->stats(); }
  const std::vector<float>& last_masses() const { return masses_; }
  double seconds() const { return seconds_; }  // wall time inside Rewrite

 private:
  misses::MissPolicy* policy_;
  std::vector<float> biased_;  // [E] a sigmoid gate's scores + selection bias, one token
  std::vector<misses::MissSlot> slots_;
  std::vector<misses::SlotAction> actions_;
  std::vector<float> masses_;
  double seconds_ = 0;
};

}  // namespace pw::engine
