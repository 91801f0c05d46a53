// RoutingHookChain: several routing hooks run as one, in a fixed order (DESIGN.md 5.4):
// the batch remap (LYNX or piggyback) first, then the expert-miss policy, so the miss policy
// decides the experts the batch will actually read. A null member is skipped; the first
// error stops the chain.
#pragma once

#include <memory>
#include <vector>

#include "engine/experts/moe.h"

namespace pw::engine {

class RoutingHookChain final : public RoutingHook {
 public:
  // `remap` and `misses` are borrowed (either may be null).
  RoutingHookChain(RoutingHook* remap, RoutingHook* misses) : remap_(remap), misses_(misses) {}
  Status Rewrite(const RoutingContext& ctx, std::vector<ExpertAssignment>* assignments) override {
    if (remap_ != nullptr) PW_RETURN_IF_ERROR(remap_->Rewrite(ctx, assignments));
    if (misses_ != nullptr) PW_RETURN_IF_ERROR(misses_->Rewrite(ctx, assignments));
    return Status::Ok();
  }

 private:
  RoutingHook* remap_;
  RoutingHook* misses_;
};

// The hook to install for an optional remap and an optional miss policy: one of them alone,
// or `chain` (filled in here) when both are given; null when neither.
inline RoutingHook* ComposeRouting(RoutingHook* remap, RoutingHook* misses,
                                   std::unique_ptr<RoutingHookChain>* chain) {
  if (remap != nullptr && misses != nullptr) {
    *chain = std::make_unique<RoutingHookChain>(remap, misses);
    return chain->get();
  }
  return remap != nullptr ? remap : misses;
}

}  // namespace pw::engine
