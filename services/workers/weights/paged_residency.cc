#include "services/workers/weights/paged_residency.h"

#include <chrono>

#include "kernels/anyprec/anyprec.h"
#include "policies/misses/trace_replay.h"

namespace pw::workers {

namespace {
constexpr ExpertProj kProjs[] = {ExpertProj::kGateUp, ExpertProj::kDown};
}  // namespace

Result<std::unique_ptr<PagedResidency>> PagedResidency::Create(const misses::MissSettings& settings,
                                                               const ModelConfig& config,
                                                               PagedWeights* weights,
                                                               memory::PagePool* pool, int initial_bits) {
  if (!settings.residency && !settings.residency_bytes) {
    return InvalidArgument("expert residency: a budget (residency or residency_bytes) is required");
  }
  if (initial_bits < anyprec::kMinBits || initial_bits > anyprec::kMaxBits) {
    return InvalidArgument("expert residency: initial width " + std::to_string(initial_bits) + " is not 3..8");
  }
  // The budget is over the MoE layers (GLM-4.5's and DeepSeek-V3's dense first layers hold no
  // expert blocks): a byte budget is shared by them alone, and a dense layer never reaches the
  // policy (the engine routes MoE layers only), so its resident set stays empty.
  int moe_layers = 0;
  for (int64_t l = 0; l < config.num_layers; ++l) moe_layers += config.IsMoeLayer(l) ? 1 : 0;
  PW_ASSIGN_OR_RETURN(misses::MissConfig mc, misses::ToMissConfig(settings));
  misses::Budget budget;
  budget.fraction = settings.residency.value_or(0);
  budget.bytes = settings.residency_bytes.value_or(0);
  const auto& t = weights->table();
  const double expert_bytes = 3.0 * config.hidden_size * config.moe_intermediate_size * 2.0;
  const int top_k = static_cast<int>(config.num_experts_per_tok);
  PW_ASSIGN_OR_RETURN(const int capacity,
                      misses::CapacityFor(budget, moe_layers, t.num_experts(), top_k, expert_bytes));
  std::unique_ptr<PagedResidency> r(new PagedResidency());
  PW_ASSIGN_OR_RETURN(r->policy_, misses::MissPolicy::Create(mc, t.num_layers(), t.num_experts(), top_k, capacity));
  r->policy_->SetExternalAdmission(true);
  r->hook_ = std::make_unique<engine::MissRoutingHook>(r->policy_.get());
  r->weights_ = weights;
  r->pool_ = pool;
  r->num_layers_ = t.num_layers();
  r->num_experts_ = t.num_experts();
  r->capacity_ = capacity;
  r->num_moe_layers_ = moe_layers;
  r->plan_bits_.assign(static_cast<size_t>(t.num_blocks()), static_cast<uint8_t>(initial_bits));
  r->admitting_.assign(static_cast<size_t>(r->num_layers_) * static_cast<size_t>(r->num_experts_), 0);
  r->Follow();
  return r;
}

void PagedResidency::Install(engine::RoutingHook* before, engine::MoeHooks* hooks) {
  hooks->routing_hook = engine::ComposeRouting(before, hook_.get(), &chain_);
  hooks->residency = hook_.get();
  hooks->fetcher = this;
}

Status PagedResidency::SetPlanWidths(const std::vector<std::pair<size_t, int>>& changes) {
  for (const auto& [i, bits] : changes) {
    if (i >= plan_bits_.size()) return InvalidArgument("no block " + std::to_string(i));
    if (bits != 0 && (bits < anyprec::kMinBits || bits > anyprec::kMaxBits)) {
      return InvalidArgument("block " + std::to_string(i) + ": width " + std::to_string(bits) + " is not 0 or 3..8");
    }
  }
  for (const auto& [i, bits] : changes) plan_bits_[i] = static_cast<uint8_t>(bits);
  return Status::Ok();
}

int PagedResidency::PlanBits(size_t block) const {
  // A plan of 0 for a block the policy holds: the provider reads it at its minimum width.
  return plan_bits_[block];
}

bool PagedResidency::Wanted(int layer, int expert) const {
  return policy_->IsResident(layer, expert) ||
         admitting_[static_cast<size_t>(layer) * static_cast<size_t>(num_experts_) + static_cast<size_t>(expert)];
}

void PagedResidency::Follow() {
  std::vector<std::pair<size_t, int>> desired;
  desired.reserve(plan_bits_.size());
  for (int l = 0; l < num_layers_; ++l) {
    for (int e = 0; e < num_experts_; ++e) {
      const bool want = Wanted(l, e);
      for (ExpertProj p : kProjs) {
        const size_t i = Block(l, e, p);
        desired.emplace_back(i, want ? PlanBits(i) : 0);
      }
    }
  }
  PW_CHECK(weights_->SetDesired(desired).ok());  // widths validated on the way in
}

Status PagedResidency::Fetch(int layer, int expert) {
  const auto t0 = std::chrono::steady_clock::now();
  bool to_pages = true;
  FetchTimes phases;
  for (ExpertProj p : kProjs) {
    const size_t i = Block(layer, expert, p);
    const int bits = PlanBits(i);
    const auto& t = weights_->table();
    // Desired at once: the scratch path reads a block at 0 at its desired width.
    PW_RETURN_IF_ERROR(weights_->SetDesired({{i, bits}}));
    const auto& e = t.entry(i);
    if (e.committed > 0) continue;  // evicted earlier in this step, not yet dropped
    if (bits == 0 || e.target >= 0 || pool_->num_free() - t.PagesToBegin(i, bits) < reserve_pages_) {
      to_pages = false;
      continue;
    }
    Status st = weights_->FetchBlockNow(i, bits, &stats_.fetch_bytes, &phases);
    if (st.code() == StatusCode::kResourceExhausted) {
      to_pages = false;
      continue;
    }
    PW_RETURN_IF_ERROR(st.WithContext("fetching expert " + std::to_string(expert) + " of layer " +
                                      std::to_string(layer)));
  }
  if (to_pages) {
    stats_.fetches++;
    fetch_phases_.push_back(phases);
  } else {
    stats_.scratch_fetches++;
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fetch_seconds_.push_back(took);
  step_wait_ += took;
  return Status::Ok();
}

Status PagedResidency::Admit(int layer, int expert) {
  admitting_[static_cast<size_t>(layer) * static_cast<size_t>(num_experts_) + static_cast<size_t>(expert)] = 1;
  stats_.admissions_started++;
  for (ExpertProj p : kProjs) {
    const size_t i = Block(layer, expert, p);
    PW_RETURN_IF_ERROR(weights_->SetDesired({{i, PlanBits(i)}}));
  }
  return Status::Ok();
}

void PagedResidency::Evict(int, int) {
  // Nothing moves during the step: an earlier token of it may still read the expert (from its
  // pages or, at 0, from scratch at its desired width). The next boundary's Follow sets its
  // blocks' desired width to 0 and Poll returns their pages.
}

std::vector<WidthChange> PagedResidency::Boundary(int reserve_pages) {
  reserve_pages_ = reserve_pages;
  if (step_wait_ > 0) step_waits_.push_back(std::exchange(step_wait_, 0.0));
  Follow();
  std::vector<WidthChange> committed = weights_->Poll(reserve_pages);
  const auto& t = weights_->table();
  bool admitted = false;
  for (int l = 0; l < num_layers_; ++l) {
    for (int e = 0; e < num_experts_; ++e) {
      uint8_t& a = admitting_[static_cast<size_t>(l) * static_cast<size_t>(num_experts_) + static_cast<size_t>(e)];
      if (!a) continue;
      const auto& g = t.entry(Block(l, e, ExpertProj::kGateUp));
      const auto& d = t.entry(Block(l, e, ExpertProj::kDown));
      if (g.committed == 0 || d.committed == 0 || g.target >= 0 || d.target >= 0) continue;
      a = 0;
      const bool was = policy_->IsResident(l, e);
      policy_->AdmissionDone(l, e);
      if (!was && policy_->IsResident(l, e)) stats_.admissions_committed++;
      admitted = true;
    }
  }
  if (admitted) {
    policy_->ClearEvents();  // counted in the policy's stats
    // Victims drop now: the pages go back at this boundary.
    Follow();
    std::vector<WidthChange> more = weights_->Poll(reserve_pages);
    committed.insert(committed.end(), more.begin(), more.end());
  }
  return committed;
}

int PagedResidency::resident_experts() const {
  int n = 0;
  for (int l = 0; l < num_layers_; ++l) n += policy_->cache().ResidentCount(l);
  return n;
}

Status PagedResidency::Check(bool settled) const {
  const auto& t = weights_->table();
  for (int l = 0; l < num_layers_; ++l) {
    for (int e = 0; e < num_experts_; ++e) {
      const bool want = Wanted(l, e), resident = policy_->IsResident(l, e);
      for (ExpertProj p : kProjs) {
        const size_t i = Block(l, e, p);
        const auto& entry = t.entry(i);
        const int expect = want ? PlanBits(i) : 0;
        std::string what = "expert " + std::to_string(e) + " of layer " + std::to_string(l) + ", block " +
                           std::to_string(i) + ": ";
        if (entry.desired != expect) {
          return Internal(what + "desired " + std::to_string(entry.desired) + ", the policy wants " +
                          std::to_string(expect));
        }
        if (settled && resident && entry.committed != expect) {
          return Internal(what + "resident for the policy, committed at " + std::to_string(entry.committed));
        }
        if (settled && !want && entry.committed != 0) {
          return Internal(what + "not resident for the policy, committed at " + std::to_string(entry.committed));
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace pw::workers
