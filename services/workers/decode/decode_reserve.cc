// The decode worker's KV reservations (DecodeWorker members, decode_worker.h): KvReserve
// answered at once or held for a lowering (reserve_wait.h), and the KV demand the requests
// here will still need (kv_demand.h), which Telemetry reports and raises leave free.
#include <algorithm>

#include "common/logging.h"
#include "services/common/transferable_kv.h"
#include "services/workers/decode/decode_worker.h"

namespace pw::workers {

namespace {

// The pool's sliding-window layers (memory/kv_spec.h) counted as such by `d`.
void CountSlidingLayers(const memory::KvBlockPool& pool, KvDemand* d) {
  int layers = 0, window = 0;
  for (const memory::KvLayerSpec& s : pool.specs()) {
    if (s.kind != memory::KvKind::kSlidingWindow) continue;
    ++layers;
    window = window == 0 ? s.window : std::max(window, s.window);
  }
  if (layers > 0) d->SetSlidingLayers(layers, window);
}

}  // namespace

KvDemand DecodeWorker::Demand() const {
  const auto& kv = engine_->kv_pool().layout();
  KvDemand d(kv.block_size, engine_->kv_pool().pages_per_block(), engine_->max_context(),
             options_.demand_horizon_tokens);
  CountSlidingLayers(engine_->kv_pool(), &d);
  for (const auto& [id, l] : leases_.all()) d.AddLease(static_cast<int64_t>(l.blocks.size()), l.max_tokens);
  for (const auto& [id, run] : running_) {
    d.AddRunning(static_cast<int64_t>(run.prompt.size() + run.generated.size()),
                 static_cast<int64_t>(run.prompt.size()) + 1 + run.params.max_tokens, !run.preempted);
  }
  for (const auto& h : reserve_wait_.held()) d.AddWaiting(h.num_tokens, h.max_tokens);
  return d;
}

void DecodeWorker::UpdateLowerablePages() {
  lowerable_pages_ = options_.planner_lowers && weights_->paged()
                         ? ReserveWait::LowerablePages(weights_->paged()->table(), options_.lower_floors)
                         : 0;
}

uint32_t DecodeWorker::KvCapacityBlocks() const {
  const auto& kv = engine_->kv_pool();
  const int64_t pages = pool_->Count(memory::Tenant::kKv) + pool_->Count(memory::Tenant::kFree) + lowerable_pages_;
  return static_cast<uint32_t>(std::min<int64_t>(kv.num_blocks(), pages / std::max(1, kv.pages_per_block())));
}

void DecodeWorker::OnRenew(wire::KvRenew::Reader r, size_t link) {
  const auto requests = r.getRequestIds();
  const auto leases = r.getLeaseIds();
  const uint64_t lease_ms = std::min<uint64_t>(r.getLeaseMs() == 0 ? 30000 : r.getLeaseMs(), options_.max_lease_ms);
  for (unsigned i = 0; i < std::min(requests.size(), leases.size()); ++i) {
    if (requests[i] > kMaxRouterRequestId) continue;  // no request of a router: no lease of one
    // One ended meanwhile: nothing to renew.
    (void)leases_.Renew(leases[i], RequestKey(link, requests[i]), lease_ms);
  }
}

void DecodeWorker::OnReserve(wire::KvReserve::Reader r, uint16_t router_minor, size_t link) {
  HeldReserve h{RequestKey(link, r.getRequestId()), r.getNumTokens(), r.getMaxTokens(), r.getLeaseMs(), clock_->NowMs(), 0};
  if (draining_) return AnswerReserve(h, "decode worker " + options_.id + " is draining");
  if (Status st = service::CheckPeerCarriesKv(engine_->kv_pool().specs(), options_.model_name, "the router",
                                              router_minor);
      !st.ok()) {
    return AnswerReserve(h, "decode worker " + options_.id + ": " + st.message());
  }
  if (h.num_tokens == 0 || h.num_tokens >= static_cast<uint32_t>(engine_->max_context())) {
    return AnswerReserve(h, "numTokens " + std::to_string(h.num_tokens) + " outside [1, " +
                                std::to_string(engine_->max_context()) + ")");
  }
  // Pool-aware admission (reserve_wait.h): hold it while a lowering can make room.
  KvDemand need(engine_->kv_pool().layout().block_size, engine_->kv_pool().pages_per_block(),
                engine_->max_context(), options_.demand_horizon_tokens);
  CountSlidingLayers(engine_->kv_pool(), &need);
  need.AddWaiting(h.num_tokens, h.max_tokens);
  h.need_pages = need.pages();
  // Room a wait can make: what a lowering within the planner's floors frees, and the KV pages
  // held now (running requests, leases), which come back as those requests finish.
  const int64_t lowerable =
      weights_->paged() ? ReserveWait::LowerablePages(weights_->paged()->table(), options_.lower_floors) : 0;
  const auto admit = reserve_wait_.Decide(h.need_pages, pool_->Count(memory::Tenant::kFree), Demand().reserve_pages(),
                                          lowerable + pool_->Count(memory::Tenant::kKv));
  if (admit == ReserveWait::Admit::kHold) {
    metrics_->reserve_held->Increment();
    return reserve_wait_.Hold(h);
  }
  AnswerReserve(h, "");
}

void DecodeWorker::AnswerHeldReserves() {
  if (draining_) {
    for (const auto& h : reserve_wait_.TakeAll()) AnswerReserve(h, "decode worker " + options_.id + " is draining");
  }
  if (reserve_wait_.size() == 0) return;
  // Oldest first; a grant's lease counts in the reserve at once.
  while (auto due = reserve_wait_.Next(clock_->NowMs(), pool_->Count(memory::Tenant::kFree),
                                       Demand().reserve_pages())) {
    (due->fits ? metrics_->reserve_held_fit : metrics_->reserve_held_waited_out)->Increment();
    AnswerReserve(due->reserve, "");
  }
}

void DecodeWorker::AnswerReserve(const HeldReserve& h, const std::string& error) {
  proto::OutMessage out;
  auto reply = out.body().initKvReserveReply();
  reply.setRequestId(KeyRequest(h.request_id));
  auto blocks = error.empty() ? engine_->LeaseKvBlocks(engine::BlocksForTokens(
                                    static_cast<int>(h.num_tokens), engine_->kv_pool().layout().block_size))
                              : Result<std::vector<int32_t>>(InvalidArgument(error));
  if (!blocks.ok()) {
    reply.setOk(false);
    reply.setError(error.empty() ? "decode worker " + options_.id + ": " + blocks.status().message() : error);
  } else {
    const uint64_t lease_ms = std::min<uint64_t>(h.lease_ms == 0 ? 30000 : h.lease_ms, options_.max_lease_ms);
    const auto& ids = *blocks;
    const uint64_t lease = leases_.Add(h.request_id, ids, lease_ms, h.max_tokens);
    reply.setOk(true);
    reply.setLeaseId(lease);
    auto list = reply.initBlockIds(static_cast<unsigned>(ids.size()));
    for (size_t i = 0; i < ids.size(); ++i) list.set(static_cast<unsigned>(i), static_cast<uint32_t>(ids[i]));
    const auto& kv = engine_->kv_pool();
    // Every page of every block (KvLayout.pagesPerBlock each, layer after layer): a hybrid's
    // recurrent state is written into the first block's.
    std::vector<uint32_t> page_ids;
    page_ids.reserve(ids.size() * static_cast<size_t>(kv.pages_per_block()));
    for (int32_t b : ids) {
      for (int l = 0; l < kv.layout().num_layers; ++l) {
        for (int k = 0; k < kv.LayerPages(l); ++k) {
          page_ids.push_back(static_cast<uint32_t>(kv.PageOf(b, l, k)));
        }
      }
    }
    proto::FillU32([&](unsigned n) { return reply.initPageIds(n); }, page_ids);
    reply.setLeaseExpiresMs(clock_->NowMs() + lease_ms);
  }
  Status st = routers_.Send(h.request_id, out);
  if (!st.ok()) PW_LOG(WARNING) << options_.id << ": KvReserveReply: " << st.ToString();
}

}  // namespace pw::workers
