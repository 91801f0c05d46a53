#include "services/broker/planner_driver.h"

#include <algorithm>
#include <cmath>

#include "memory/weight_page_table.h"

namespace pw::broker {
namespace {

// Whether what `worker` still has to make includes a raise of a resident block (a block at 0
// under a residency budget is not resident: taking its width is not a raise).
bool RaisePending(const PlanBook& book, const std::string& worker) {
  const std::vector<int>* committed = book.Committed(worker);
  if (committed == nullptr) return false;
  for (const BlockWidth& b : book.PendingFor(worker)) {
    const size_t i = ExpertBlockIndex(b.layer, b.expert, b.proj, book.num_experts());
    if (i < committed->size() && (*committed)[i] != 0 && b.bits > (*committed)[i]) return true;
  }
  return false;
}

}  // namespace

PlannerDriver::PlannerDriver(const apw::ApwStore& store, const planner::PlannerParams& params)
    : store_(store), calib_share_(apw::CalibrationShares(store)), params_(params) {}

Result<std::unique_ptr<PlannerDriver>> PlannerDriver::Create(const apw::ApwStore& store,
                                                             const planner::PlannerParams& params) {
  PW_RETURN_IF_ERROR(params.Validate());
  return std::unique_ptr<PlannerDriver>(new PlannerDriver(store, params));
}

Status PlannerDriver::SetResidualHeads(std::shared_ptr<const ResidualHeads> heads) {
  if (heads && (heads->num_layers() != static_cast<int>(store_.info().num_layers) ||
                heads->num_experts() != static_cast<int>(store_.info().num_experts))) {
    return InvalidArgument("planner: residual heads for " + std::to_string(heads->num_layers()) + " layers x " +
                           std::to_string(heads->num_experts()) + " experts do not fit the store (" +
                           std::to_string(store_.info().num_layers) + " x " +
                           std::to_string(store_.info().num_experts) + ")");
  }
  heads_ = std::move(heads);
  return Status::Ok();
}

Result<const std::vector<std::array<uint32_t, anyprec::kMaxBits + 1>>*> PlannerDriver::PagesFor(
    uint64_t page_bytes) {
  auto it = pages_.find(page_bytes);
  if (it != pages_.end()) return &it->second;
  std::vector<std::array<uint32_t, anyprec::kMaxBits + 1>> table(static_cast<size_t>(store_.num_blocks()));
  for (int i = 0; i < store_.num_blocks(); ++i) {
    const apw::BlockData& b = store_.block(i);
    auto& row = table[static_cast<size_t>(i)];
    for (int w = anyprec::kMinBits; w <= anyprec::kMaxBits; ++w) {
      const int n = memory::WeightPageTable::PagesFor(static_cast<int>(b.rows), static_cast<int>(b.cols), w,
                                                      page_bytes);
      if (n < 0) {
        return InvalidArgument("planner: a page of " + std::to_string(page_bytes) + " bytes cannot hold a row of " +
                               store_.BlockName(i) + " at " + std::to_string(w) + " bits");
      }
      row[w] = static_cast<uint32_t>(n);
    }
  }
  return &pages_.emplace(page_bytes, std::move(table)).first->second;
}

Result<std::optional<PlannerDriver::Outcome>> PlannerDriver::Tick(uint64_t now_ms, PlanBook* book,
                                                                   const std::vector<std::string>& workers) {
  const int64_t now = static_cast<int64_t>(now_ms);
  if (last_tick_ms_ >= 0 && now - last_tick_ms_ < params_.interval_ms) return std::optional<Outcome>();
  last_tick_ms_ = now;
  // The tightest worker, and only when every worker has committed the desired map, or when
  // what a worker still has to make includes a raise (see the header: a lowering may then take
  // it back).
  const std::string* tightest = nullptr;
  const WorkerPool* pool = nullptr;
  bool raises_pending = false;
  for (const std::string& w : workers) {
    const WorkerPool* p = book->Pool(w);
    if (p == nullptr || p->page_bytes == 0) return std::optional<Outcome>();
    if (p->pending != 0 || !book->PendingFor(w).empty()) {
      if (!RaisePending(*book, w)) return std::optional<Outcome>();
      raises_pending = true;
    }
    if (pool == nullptr || p->free < pool->free) {
      tightest = &w;
      pool = p;
    }
  }
  if (tightest == nullptr) return std::optional<Outcome>();
  const std::vector<int>* committed = book->Committed(*tightest);
  // The mirror is in the model's block numbering (dense layers' slots included); the planner
  // sees the store's blocks only, so a dense layer is never planned nor counted.
  const size_t model_blocks =
      static_cast<size_t>(store_.info().num_layers) * store_.info().num_experts * kProjsPerExpert;
  if (committed == nullptr || committed->size() != model_blocks) {
    return std::optional<Outcome>();
  }
  PW_ASSIGN_OR_RETURN(auto* pages, PagesFor(pool->page_bytes));

  planner::PlannerInputs in;
  in.num_layers = book->num_layers();
  in.num_experts = book->num_experts();
  in.blocks.reserve(static_cast<size_t>(store_.num_blocks()));
  for (int i = 0; i < store_.num_blocks(); ++i) {
    const apw::BlockData& b = store_.block(i);
    planner::BlockInput bi;
    bi.layer = static_cast<int>(b.layer);
    bi.expert = static_cast<int>(b.expert);
    bi.proj = b.kind;
    bi.committed = (*committed)[ExpertBlockIndex(b.layer, b.expert, b.kind, in.num_experts)];
    bi.pages = (*pages)[static_cast<size_t>(i)];
    for (int w : {0, 3, 4, 5, 6, 7, 8}) bi.damage[w] = b.damage[w];
    // Widths 1..2 do not exist; give them the damage of dropping the block so the table is
    // monotone (the planner never moves a block there).
    bi.damage[1] = bi.damage[2] = b.damage[0];
    bi.calib_share = calib_share_[static_cast<size_t>(i)];
    in.blocks.push_back(bi);
  }
  in.pool.page_bytes = pool->page_bytes;
  in.pool.free = pool->free;
  in.pool.kv = pool->kv;
  in.pool.weights = pool->weights;
  in.kv_demand_pages = pool->kv_demand;
  // Routing mass as the worker measured it, when it covers every (layer, expert) and says
  // something (all zero: no decode step seen yet).
  if (params_.use_routing && pool->mass.size() == static_cast<size_t>(in.num_layers) * in.num_experts &&
      std::any_of(pool->mass.begin(), pool->mass.end(), [](float m) { return m > 0.f; })) {
    in.routing_mass.assign(pool->mass.begin(), pool->mass.end());
  }
  // Prompt residuals from the worker's prompt features (see the header).
  const size_t cells = static_cast<size_t>(in.num_layers) * in.num_experts;
  std::vector<double> residuals;
  if (params_.use_prompt_residuals && heads_ && pool->prompt_features.size() == cells &&
      std::any_of(pool->prompt_features.begin(), pool->prompt_features.end(), [](float f) { return f > 0.f; })) {
    residuals.resize(static_cast<size_t>(in.num_layers) * kProjsPerExpert);
    for (int l = 0; l < in.num_layers; ++l) {
      for (auto proj : {ExpertProj::kGateUp, ExpertProj::kDown}) {
        residuals[static_cast<size_t>(l) * kProjsPerExpert + static_cast<int>(proj)] =
            heads_->Predict(l, proj, pool->prompt_features.data() + static_cast<size_t>(l) * in.num_experts);
      }
    }
    for (planner::BlockInput& bi : in.blocks) {
      bi.log_residual = residuals[static_cast<size_t>(bi.layer) * kProjsPerExpert + static_cast<int>(bi.proj)];
    }
    for (double& r : residuals) r = std::exp(r);
  }
  in.now_ms = now;
  in.last_change_ms = last_change_ms_;
  PW_ASSIGN_OR_RETURN(planner::PlannerDecision d, planner::Plan(in, params_));
  // With raises still pending only a lowering goes out; otherwise wait for the ack as usual.
  if (raises_pending && d.action != planner::PlanAction::kLower) return std::optional<Outcome>();

  Outcome out;
  out.worker = *tightest;
  out.prompt_residuals = std::move(residuals);
  std::vector<PlanBook::Selection> sel;
  sel.reserve(d.changes.size());
  std::vector<bool> changed(in.blocks.size(), false);
  for (const auto& c : d.changes) {
    sel.push_back({c.to, c.layer, c.expert, static_cast<int>(c.proj)});
    changed[c.block] = true;
  }
  if (raises_pending) {  // a raise the lowering does not touch goes back to the committed width
    for (size_t i = 0; i < in.blocks.size(); ++i) {
      const planner::BlockInput& b = in.blocks[i];
      if (changed[i] || book->desired(ExpertBlockIndex(b.layer, b.expert, b.proj, in.num_experts)) <= b.committed) {
        continue;
      }
      sel.push_back({b.committed, b.layer, b.expert, static_cast<int>(b.proj)});
      ++out.raises_taken_back;
    }
  }
  if (!sel.empty()) {
    PW_ASSIGN_OR_RETURN(out.epoch, book->Apply(sel));
    last_change_ms_ = now;
  }
  out.decision = std::move(d);
  last_ = out;
  return std::optional<Outcome>(std::move(out));
}

}  // namespace pw::broker
