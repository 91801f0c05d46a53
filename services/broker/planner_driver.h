// PlannerDriver: runs the quality-aware planner (policies/planner/planner.h) from the broker's
// loop and turns its decisions into PlanBook changes (DESIGN.md 5.1).
//
// Every interval_ms, when every decode worker the book mirrors has committed the desired map
// (a worker that has not acknowledged the last plan is not planned for again until it does)
// and has sent Telemetry, it plans for the worker with the fewest free pages. One exception to
// waiting for the ack: when what a worker still has to make includes a raise, a decision to
// lower goes out at once, and it also takes back every pending raise it does not touch (desired
// back to the committed width). A raise needs free pages; when KV has taken them since it was
// planned it cannot finish, and waiting for its ack would hold back the lowering the KV needs.
// Inputs:
//   - committed widths: that worker's mirror;
//   - pages per width: WeightPageTable::PagesFor with the worker's page size;
//   - damage D_i[b]: the .apw store's table;
//   - pool pages: the worker's last Telemetry;
//   - KV demand: the worker's kvDemandPages (running growth, leases, held reservations);
//   - routing mass: the worker's expertMass EMA (services/workers/decode/routing_stats.h), unless
//     the routing ablation is on or the worker has not seen a decode step yet (then every
//     expert is average);
//   - prompt residuals: with residual heads set (SetResidualHeads) and the prompt-residual
//     ablation off, each block's log_residual is its (layer, proj) head applied to the
//     worker's promptFeatures (services/workers/common/prompt_features.h), when those cover every
//     (layer, expert) and are not all zero; otherwise 0 (a factor of 1).
// Changes go to the book as one Apply (a new epoch); the broker sends them as plans.
// Loop thread only, like the book.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/formats/apw_store.h"
#include "common/formats/residual_heads.h"
#include "common/status.h"
#include "policies/planner/planner.h"
#include "services/broker/plan_book.h"

namespace pw::broker {

class PlannerDriver {
 public:
  // The store must have the book's layers and experts.
  static Result<std::unique_ptr<PlannerDriver>> Create(const apw::ApwStore& store,
                                                       const planner::PlannerParams& params);

  struct Outcome {
    std::string worker;                  // planned for
    planner::PlannerDecision decision;
    uint64_t epoch = 0;                  // the book's epoch after the changes (0: none applied)
    // exp(residual) per (layer, proj), index layer * 2 + proj, the decision used; empty: none
    std::vector<double> prompt_residuals;
    int raises_taken_back = 0;           // pending raises the plan returned to the committed width
  };
  // One decision when due and possible (see the file comment), else nullopt. `workers`: the
  // decode workers plans go to. Errors: a bad input or a change the book refused.
  Result<std::optional<Outcome>> Tick(uint64_t now_ms, PlanBook* book,
                                      const std::vector<std::string>& workers);

  const planner::PlannerParams& params() const { return params_; }
  // The prompt residual heads (null: none). InvalidArgument unless their layers and experts
  // are the store's.
  Status SetResidualHeads(std::shared_ptr<const ResidualHeads> heads);
  const ResidualHeads* residual_heads() const { return heads_.get(); }
  // The last decision made (for logs and pw-ctl show); null before the first.
  const Outcome* last() const { return last_ ? &*last_ : nullptr; }

 private:
  PlannerDriver(const apw::ApwStore& store, const planner::PlannerParams& params);
  // Pages per width of every block for a page size (cached).
  Result<const std::vector<std::array<uint32_t, anyprec::kMaxBits + 1>>*> PagesFor(uint64_t page_bytes);

  const apw::ApwStore& store_;
  std::vector<double> calib_share_;  // apw::CalibrationShares(store_), per block
  planner::PlannerParams params_;
  std::shared_ptr<const ResidualHeads> heads_;
  std::map<uint64_t, std::vector<std::array<uint32_t, anyprec::kMaxBits + 1>>> pages_;
  int64_t last_tick_ms_ = -1;
  int64_t last_change_ms_ = -1;
  std::optional<Outcome> last_;
};

}  // namespace pw::broker
