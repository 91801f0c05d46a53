#include "services/workers/decode/decode_worker.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "common/logging.h"
#include "common/sampling_check.h"
#include "engine/models/model.h"
#include "services/transport/control_connect.h"
#include "services/common/model_name.h"
#include "services/common/transferable_kv.h"
#include "services/workers/common/worker_common.h"

namespace pw::workers {
DecodeWorker::DecodeWorker(DecodeWorkerOptions options, const Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      reserve_wait_(options_.reserve_wait_ms, static_cast<size_t>(options_.max_batch)),
      leases_(clock) {}

DecodeWorker::~DecodeWorker() {
  if (keepalive_.joinable()) {  // Run stops it; this covers a Run that never got there
    {
      std::lock_guard<std::mutex> lk(control_mu_);
      keepalive_stop_ = true;
    }
    keepalive_cv_.notify_all();
    keepalive_.join();
  }
  // Drop the engine's hooks before the providers go, give the engine's and the table's pages
  // back, and stop UCX before freeing the pool.
  if (engine_) engine_->SetMoeHooks({});
  trace_.reset();  // writes the trace's end record
  weights_.reset();
  engine_.reset();
  kv_region_.reset();
  ucx_worker_.reset();
  ucx_ctx_.reset();
  pool_.reset();
}

Result<std::unique_ptr<DecodeWorker>> DecodeWorker::Create(DecodeWorkerOptions options,
                                                           const Clock* clock) {
  if (options.router_endpoints.empty()) return InvalidArgument("decode worker: router is required (--router or the key router of --config)");
  if (options.model_dir.empty()) return InvalidArgument("decode worker: model dir is required");
  options.id = DefaultWorkerId(options.id, "decode");
  options.node = DefaultNodeName(options.node);
  if (options.model_name.empty()) options.model_name = service::ModelNameFromDir(options.model_dir);
  std::unique_ptr<DecodeWorker> w(
      new DecodeWorker(std::move(options), clock ? clock : SteadyClock::Get()));
  PW_RETURN_IF_ERROR(w->Setup());
  return w;
}

Status DecodeWorker::Setup() {
  // The page pool: pages sized to one layer of one KV block unless configured (an MLA model's
  // layer is its latent rows: memory::MinPageBytes).
  PW_ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(options_.model_dir + "/config.json"));
  engine::KvLayout kl;
  kl.num_layers = static_cast<int>(mc.num_layers);
  kl.num_kv_heads = static_cast<int>(mc.num_kv_heads);
  kl.head_dim = static_cast<int>(mc.head_dim);
  kl.block_size = options_.block_size;
  kl.dtype = options_.kv_dtype;
  const std::vector<memory::KvLayerSpec> specs = memory::ModelKvSpecs(mc);
  const uint64_t min_page = memory::MinPageBytes(kl, specs);
  const uint64_t page_bytes = options_.page_bytes != 0 ? options_.page_bytes : min_page;
  if (page_bytes < min_page || page_bytes % 64 != 0) {
    return InvalidArgument("decode worker: page_bytes " + std::to_string(page_bytes) +
                           " must be a multiple of 64 and hold one layer of a KV block (" +
                           std::to_string(min_page) + " bytes)");
  }
  // Pages one KV block takes: one per attention layer, a hybrid's recurrent state more.
  PW_ASSIGN_OR_RETURN(const std::vector<int> offsets,
                      memory::BlockPageOffsets(specs, kl, page_bytes));
  const uint64_t block_pages = static_cast<uint64_t>(offsets.back());
  uint64_t pages = 0;
  if (options_.pool_bytes != 0) {
    pages = options_.pool_bytes / page_bytes;
  } else {
    pages = static_cast<uint64_t>(options_.num_kv_blocks) * block_pages;
    if (!options_.broker_endpoint.empty() && mc.num_experts > 0) {
      const int g = memory::WeightPageTable::PagesFor(static_cast<int>(2 * mc.moe_intermediate_size),
                                                      static_cast<int>(mc.hidden_size), 8, page_bytes);
      const int d = memory::WeightPageTable::PagesFor(static_cast<int>(mc.hidden_size),
                                                      static_cast<int>(mc.moe_intermediate_size), 8, page_bytes);
      if (g > 0 && d > 0) pages += static_cast<uint64_t>(g + d) * mc.num_layers * mc.num_experts;
    }
  }
  if (pages < block_pages || pages > (1ull << 31) - 1) {
    return InvalidArgument("decode worker: a pool of " + std::to_string(pages) + " pages of " +
                           std::to_string(page_bytes) + " bytes cannot hold one KV block");
  }
  PW_ASSIGN_OR_RETURN(pool_, memory::PagePool::Create(page_bytes, static_cast<int>(pages)));
  engine::EngineOptions eo;
  eo.num_kv_blocks = static_cast<int>(pages / block_pages);
  if (options_.pool_bytes == 0) eo.num_kv_blocks = options_.num_kv_blocks;
  eo.block_size = options_.block_size;
  eo.num_threads = WorkerThreads(options_.threads);
  eo.max_batch_tokens = options_.max_batch_tokens;
  eo.kv_dtype = options_.kv_dtype;
  eo.kv_pages = pool_.get();
  eo.copy_weights = options_.copy_weights;
  eo.dense = options_.dense;
  eo.lm_head = options_.lm_head;
  // Experts from the checkpoint (no broker): the engine's provider holds them as asked; with a
  // broker, its copies are the worker's (DecodeWeights) and the checkpoint's are not multiplied.
  eo.bf16_experts = options_.broker_endpoint.empty() ? options_.bf16_experts : engine::Bf16ExpertForm::kPlain;
  PW_ASSIGN_OR_RETURN(engine_, engine::Engine::Create(options_.model_dir, eo));
  PW_LOG(INFO) << options_.id << ": " << eo.num_threads << " compute threads, dense matrices "
               << DenseFormatName(engine_->model().dense_format()) << ", lm_head "
               << DenseFormatName(engine_->model().lm_head_format())
               << (engine_->model().packed_expert_bytes() > 0 ? ", bf16 experts packed" : "");
  const auto& cfg = engine_->model().config();
  layout_hash_ = KvLayoutHash(engine_->kv_pool().layout(), engine_->kv_pool().specs(), cfg.hidden_size, cfg.vocab_size,
                              cfg.model_type);
  PW_ASSIGN_OR_RETURN(metrics_, WorkerMetrics::Create(options_.metrics_bind, options_.id, options_.main_loop_stale_ms));
  if (options_.lynx) {
    lynx_ = std::make_unique<lynx::LynxRemapper>(options_.lynx_options);
    lynx_hook_ = std::make_unique<engine::LynxRoutingHook>(lynx_.get());
    lynx_hook_->Reserve(std::max(options_.max_batch_tokens, options_.max_batch),
                        static_cast<int>(cfg.num_experts), static_cast<int>(cfg.num_experts_per_tok));
    lynx_metrics_ = LynxMetrics::Register(*metrics_->registry, options_.id);
  }
  routing_ = std::make_unique<RoutingStats>(static_cast<int>(cfg.num_layers), static_cast<int>(cfg.num_experts));
  prompt_features_ =
      std::make_unique<PromptFeatures>(static_cast<int>(cfg.num_layers), static_cast<int>(cfg.num_experts));
  if (!options_.trace.path.empty()) {
    PW_ASSIGN_OR_RETURN(trace_, DecodeTrace::Create(options_.trace, cfg, routing_.get()));
    trace_metrics_ = TraceMetrics::Register(*metrics_->registry, options_.id);
    PW_LOG(INFO) << options_.id << ": recording router logits to " << options_.trace.path << " (every "
                 << options_.trace.sample_every << ". forward pass, at most " << options_.trace.max_bytes << " bytes)";
  }
  engine::MoeHooks hooks;
  hooks.routing_hook = lynx_hook_.get();
  hooks.recorder = recorder();
  engine_->SetMoeHooks(hooks);

  // UCX: register the KV pool, progress it from a thread (prefill workers put into it).
  PW_ASSIGN_OR_RETURN(ucx_ctx_, transport::ucx::Context::Create());
  PW_ASSIGN_OR_RETURN(ucx_worker_, transport::ucx::Worker::Create(*ucx_ctx_));
  PW_ASSIGN_OR_RETURN(kv_region_,
                      transport::ucx::MemoryRegion::Register(*ucx_ctx_, pool_->base(), pool_->total_bytes()));
  ucx_worker_->StartProgressThread();

  auto make_client =
      [&](const std::string& endpoint) -> Result<std::unique_ptr<transport::ControlClient>> {
    transport::ControlClient::Options o;
    o.id = options_.id;
    o.role = wire::Role::DECODE;
    o.heartbeat_ms = options_.heartbeat_ms;
    PW_ASSIGN_OR_RETURN(auto c, transport::ConnectControlClient(endpoint, clock_, o));
    c->fill_register = [this](wire::Register::Builder r) { FillRegister(r); };
    c->fill_heartbeat = [this](wire::Heartbeat::Builder h) { FillHeartbeat(TakeLoad(), h); };
    return c;
  };
  if (!options_.broker_endpoint.empty()) {
    PW_ASSIGN_OR_RETURN(broker_, make_client(options_.broker_endpoint));
    broker_->on_registered = [this] { weights_->OnBrokerRegistered(); };
    broker_->on_server_lost = [this] { weights_->OnBrokerLost(); };
  }
  DecodeWeightsOptions wo;
  wo.worker_id = options_.id;
  wo.model_name = options_.model_name;
  wo.timeout_ms = options_.weights_timeout_ms;
  wo.stop = options_.stop;
  wo.paged.max_bytes_per_s = options_.weight_bytes_per_s;
  wo.paged.max_in_flight = options_.weight_max_in_flight;
  wo.paged.pacing = options_.weight_pacing;
  wo.bf16_experts = options_.bf16_experts;
  wo.misses = options_.misses;
  weights_ = std::make_unique<DecodeWeights>(wo, cfg, pool_.get(), ucx_worker_.get(), broker_.get(),
                                             *metrics_->registry);
  if (broker_) {
    metrics_->SetNotReady("waiting for the broker's expert weights");
    PW_RETURN_IF_ERROR(weights_->Load().WithContext("broker " + options_.broker_endpoint));
    metrics_->ucx_get_bytes->Increment(static_cast<double>(weights_->bytes_loaded()));
    engine::MoeHooks hooks;
    hooks.routing_hook = lynx_hook_.get();
    hooks.recorder = recorder();
    weights_->AddHooks(&hooks);  // the provider; with a residency budget its policy after LYNX
    engine_->SetMoeHooks(hooks);
  }
  UpdateLowerablePages();

  // One link per router (router_links.h). Ready (/ready) while registered with at least one
  // (the weights are resident from here on).
  metrics_->SetNotReady("not registered with a router");
  auto make_router_link = [this, make_client](const std::string& endpoint,
                                              size_t link) -> Result<std::unique_ptr<transport::ControlClient>> {
    PW_ASSIGN_OR_RETURN(auto c, make_client(endpoint));
    c->on_registered = [this] { metrics_->SetReady(); };
    c->on_server_lost = [this, link] {
      if (routers_.registered() == 0) metrics_->SetNotReady("every router lost; registering again");
      DropLink(link);
    };
    return c;
  };
  PW_ASSIGN_OR_RETURN(routers_, RouterLinks::Create(options_.router_endpoints, make_router_link,
                                                    options_.router_resolve_ms, clock_));
  return Status::Ok();
}

void DecodeWorker::SendTelemetry() {
  if (!broker_ || !broker_->registered()) return;
  proto::OutMessage m;
  auto t = m.body().initTelemetry();
  const auto& pool = engine_->kv_pool();
  t.setKvBlocksFree(static_cast<uint32_t>(pool.num_free()));
  t.setKvBlocksUsed(static_cast<uint32_t>(pool.num_used()));
  t.setTokensGenerated(static_cast<uint64_t>(metrics_->tokens_generated->Value()));
  t.setPageBytes(pool_->page_bytes());
  t.setPoolPagesKv(static_cast<uint32_t>(pool_->Count(memory::Tenant::kKv)));
  t.setPoolPagesWeights(static_cast<uint32_t>(pool_->Count(memory::Tenant::kWeights)));
  t.setPoolPagesFree(static_cast<uint32_t>(pool_->Count(memory::Tenant::kFree)));
  weights_->FillTelemetry(t);
  t.setKvDemandPages(static_cast<uint32_t>(std::min<int64_t>(Demand().pages(), UINT32_MAX)));
  const auto& mass = routing_->mass();
  auto list = t.initExpertMass(static_cast<unsigned>(mass.size()));
  for (size_t i = 0; i < mass.size(); ++i) list.set(static_cast<unsigned>(i), mass[i]);
  if (prompt_features_->requests() > 0) {
    const auto& pf = prompt_features_->features();
    auto fl = t.initPromptFeatures(static_cast<unsigned>(pf.size()));
    for (size_t i = 0; i < pf.size(); ++i) fl.set(static_cast<unsigned>(i), pf[i]);
  }
  (void)broker_->Send(m);
}

void DecodeWorker::WeightsBoundary() {
  bool boundary = true;
  if (options_.plans_at_request_boundaries) {
    request_boundary_.Begin();
    for (const auto& [id, run] : running_) request_boundary_.Add(id);
    boundary = request_boundary_.Crossed();
  }
  if (weights_->paged() != nullptr && boundary) {
    // Raises never take the KV running requests and leases will still need (kv_demand.h), so
    // they wait for KV to come back rather than force a preemption.
    weights_->Boundary(static_cast<int>(std::min<int64_t>(Demand().reserve_pages(), pool_->num_pages())));
  }
  AnswerHeldReserves();
  const uint64_t now = clock_->NowMs();
  if (now - last_telemetry_ms_ >= std::min<uint64_t>(options_.heartbeat_ms, 200)) {
    last_telemetry_ms_ = now;
    UpdateLowerablePages();
    weights_->ExportMetrics();
    if (trace_metrics_) trace_metrics_->Export(*trace_);
    SendTelemetry();
  }
}

void DecodeWorker::FillRegister(wire::Register::Builder r) {
  const auto& pool = engine_->kv_pool();
  r.setModelName(options_.model_name);
  r.setNodeName(options_.node);
  auto kl = r.initKvLayout();
  kl.setNumBlocks(static_cast<uint32_t>(pool.num_blocks()));
  kl.setBlockTokens(static_cast<uint32_t>(pool.layout().block_size));
  kl.setBlockBytes(pool.bytes_per_block());
  kl.setLayoutHash(layout_hash_);
  kl.setPageBytes(pool_->page_bytes());
  kl.setLayerBytes(service::KvLayerBytes(pool.layout(), pool.specs()));
  kl.setNumLayers(static_cast<uint32_t>(pool.layout().num_layers));
  kl.setPagesPerBlock(static_cast<uint32_t>(pool.pages_per_block()));
  auto km = r.initKvMemory();
  km.setWorkerAddress(proto::AsData(ucx_worker_->Address()));
  km.setRkey(proto::AsData(kv_region_->PackedRkey()));
  km.setBaseAddr(kv_region_->base());
  km.setBytes(kv_region_->size());
  r.setMaxBatch(static_cast<uint32_t>(options_.max_batch));
  r.setMaxContext(static_cast<uint32_t>(engine_->max_context()));
  r.setMetricsPort(metrics_port());
  weights_->FillWeightTable(r);
}

DecodeWorker::LoadSnapshot DecodeWorker::TakeLoad() const {
  const auto& pool = engine_->kv_pool();
  LoadSnapshot l;
  l.free_kv_blocks = static_cast<uint32_t>(pool.num_free());
  l.used_kv_blocks = static_cast<uint32_t>(pool.num_used());
  l.reserved_kv_blocks = static_cast<uint32_t>(leases_.reserved_blocks() + quarantined_blocks());
  l.running = static_cast<uint32_t>(running_.size());
  l.waiting = static_cast<uint32_t>(leases_.size());
  l.kv_capacity_blocks = KvCapacityBlocks();
  l.draining = draining_;
  return l;
}

void DecodeWorker::FillHeartbeat(const LoadSnapshot& load, wire::Heartbeat::Builder h) {
  h.setFreeKvBlocks(load.free_kv_blocks);
  h.setUsedKvBlocks(load.used_kv_blocks);
  h.setReservedKvBlocks(load.reserved_kv_blocks);
  h.setRunningRequests(load.running);
  h.setWaitingRequests(load.waiting);
  h.setKvCapacityBlocks(load.kv_capacity_blocks);
  h.setDraining(load.draining);
}

void DecodeWorker::UpdateMetrics() {
  const auto& pool = engine_->kv_pool();
  metrics_->kv_blocks_free->Set(pool.num_free());
  const double reserved = static_cast<double>(leases_.reserved_blocks() + quarantined_blocks());
  metrics_->kv_blocks_reserved->Set(reserved);
  metrics_->kv_blocks_used->Set(pool.num_used() - reserved);
  metrics_->SetKvPages(pool);
  metrics_->requests_running->Set(static_cast<double>(running_.size()));
  metrics_->requests_waiting->Set(static_cast<double>(leases_.size()));
  const auto c = routers_.counters();
  metrics_->frames_dropped->Set(static_cast<double>(c.malformed + c.wrong_version + c.unregistered));
}

void DecodeWorker::FreeBlocks(const std::vector<int32_t>& blocks, const char* why) {
  Status st = engine_->ReturnKvBlocks(blocks);
  if (!st.ok()) PW_LOG(ERROR) << options_.id << ": freeing blocks (" << why << "): " << st.ToString();
}

void DecodeWorker::Quarantine(KvLease lease, const char* why) {
  PW_LOG(INFO) << options_.id << ": lease " << lease.lease_id << " of request " << KeyName(lease.request_id)
               << " ended (" << why << "); " << lease.blocks.size()
               << " blocks quarantined until its writer is done";
  Quarantined q;
  q.request_id = lease.request_id;
  q.blocks = std::move(lease.blocks);
  q.since_ms = clock_->NowMs();
  q.max_ms = options_.quarantine_max_ms;
  quarantine_[lease.lease_id] = std::move(q);
}

bool DecodeWorker::ReleaseQuarantined(uint64_t lease_id, uint64_t request_id, const char* why) {
  auto it = quarantine_.find(lease_id);
  if (it == quarantine_.end() || it->second.request_id != request_id) return false;
  FreeBlocks(it->second.blocks, why);
  PW_LOG(DEBUG) << options_.id << ": lease " << lease_id << ": " << it->second.blocks.size()
                << " quarantined blocks freed (" << why << ")";
  quarantine_.erase(it);
  return true;
}

void DecodeWorker::ExpireQuarantine() {
  const uint64_t now = clock_->NowMs();
  for (auto it = quarantine_.begin(); it != quarantine_.end();) {
    if (now - it->second.since_ms < it->second.max_ms) {
      ++it;
      continue;
    }
    PW_LOG(WARNING) << options_.id << ": lease " << it->first << " of request "
                    << KeyName(it->second.request_id) << ": no word on its writer for "
                    << it->second.max_ms << " ms; " << it->second.blocks.size()
                    << " quarantined blocks freed";
    FreeBlocks(it->second.blocks, "quarantine over");
    it = quarantine_.erase(it);
  }
}

size_t DecodeWorker::quarantined_blocks() const {
  size_t n = 0;
  for (const auto& [id, q] : quarantine_) n += q.blocks.size();
  return n;
}

void DecodeWorker::SendFinish(uint64_t request_id, wire::FinishReason reason,
                              const std::string& error, uint32_t num_generated,
                              const std::string& refused_param) {
  proto::OutMessage m;
  auto f = m.body().initFinish();
  f.setRequestId(KeyRequest(request_id));
  f.setReason(reason);
  f.setError(error);
  f.setNumGenerated(num_generated);
  if (!refused_param.empty()) {
    f.setErrorKind(wire::ErrorKind::INVALID_REQUEST);
    f.setErrorParam(refused_param);
  }
  Status st = routers_.Send(request_id, m);
  if (!st.ok()) PW_LOG(WARNING) << options_.id << ": Finish " << KeyName(request_id) << ": " << st.ToString();
  if (reason == wire::FinishReason::ERROR) metrics_->requests_finished_error->Increment();
  if (reason == wire::FinishReason::CANCELLED) metrics_->requests_cancelled->Increment();
  if (reason == wire::FinishReason::STOP || reason == wire::FinishReason::LENGTH) {
    metrics_->requests_finished_ok->Increment();
  }
}

void DecodeWorker::DropLink(size_t link) {
  const char* why = "router lost";
  auto of_link = [link](uint64_t key) { return KeyLink(key) == link; };
  size_t n = reserve_wait_.TakeIf([&](const HeldReserve& h) { return of_link(h.request_id); }).size();
  for (auto it = running_.begin(); it != running_.end();) {
    if (!of_link(it->first)) {
      ++it;
      continue;
    }
    (void)engine_->RemoveSequence(it->first);
    it = running_.erase(it);
    ++n;
  }
  admit_order_.erase(std::remove_if(admit_order_.begin(), admit_order_.end(), of_link), admit_order_.end());
  // A prefill worker may still be writing the leased blocks: they wait in quarantine.
  for (auto& l : leases_.TakeIf([&](const KvLease& l) { return of_link(l.request_id); })) {
    Quarantine(std::move(l), why);
    ++n;
  }
  // That router will not speak for its quarantined leases again, and the prefill workers that
  // may write them lose the same router and cancel its transfers: shorten those waits.
  const uint64_t now = clock_->NowMs();
  for (auto& [lease_id, q] : quarantine_) {
    if (!of_link(q.request_id)) continue;
    const uint64_t waited = now - q.since_ms;
    q.max_ms = std::min(q.max_ms, waited + options_.router_lost_quarantine_ms);
  }
  if (n > 0) {
    PW_LOG(WARNING) << options_.id << ": dropped " << n << " request(s) of router " << routers_.endpoint(link)
                    << ": " << why;
  }
}

Status DecodeWorker::HandleRouter(const proto::InMessage& m, size_t link) {
  switch (m.which()) {
    // A request id no key can hold (router_links.h) is refused on the link it came on, under
    // the router's own id; a Cancel of one has nothing to cancel.
    case proto::Body::KV_RESERVE:
      if (Status st = CheckRouterRequestId(m.body().getKvReserve().getRequestId()); !st.ok()) {
        proto::OutMessage out;
        auto reply = out.body().initKvReserveReply();
        reply.setRequestId(m.body().getKvReserve().getRequestId());
        reply.setOk(false);
        reply.setError("decode worker " + options_.id + ": " + st.message());
        return routers_.at(link).Send(out);
      }
      OnReserve(m.body().getKvReserve(), m.version_minor(), link);
      break;
    case proto::Body::START_DECODE:
      if (Status st = CheckRouterRequestId(m.body().getStartDecode().getRequestId()); !st.ok()) {
        proto::OutMessage out;
        auto f = out.body().initFinish();
        f.setRequestId(m.body().getStartDecode().getRequestId());
        f.setReason(wire::FinishReason::ERROR);
        f.setError("decode worker " + options_.id + ": " + st.message());
        return routers_.at(link).Send(out);
      }
      OnStartDecode(m.body().getStartDecode(), link);
      break;
    case proto::Body::KV_RENEW: OnRenew(m.body().getKvRenew(), link); break;
    case proto::Body::CANCEL:
      if (!CheckRouterRequestId(m.body().getCancel().getRequestId()).ok()) break;
      OnCancel(m.body().getCancel(), link);
      break;
    case proto::Body::DRAIN:
      PW_LOG(INFO) << options_.id << ": drain requested by the router";
      draining_ = true;
      break;
    default:
      return InvalidArgument("unexpected message " + proto::BodyName(m.which()) +
                             " for a decode worker");
  }
  return Status::Ok();
}

void DecodeWorker::OnStartDecode(wire::StartDecode::Reader r, size_t link) {
  const uint64_t id = RequestKey(link, r.getRequestId());
  auto lease = leases_.Take(r.getLeaseId(), id);
  if (!lease) {
    // StartDecode follows the writer's KvReady: a quarantined lease's writes are over.
    ReleaseQuarantined(r.getLeaseId(), id, "StartDecode after the lease ended");
    SendFinish(id, wire::FinishReason::ERROR,
               "decode worker " + options_.id + ": no lease " + std::to_string(r.getLeaseId()) +
                   " for request " + std::to_string(r.getRequestId()) + " (expired or cancelled)",
               r.getGeneratedSoFar());
    return;
  }
  // The prefill worker's puts into these blocks are done (its KvReady preceded this message);
  // order this thread after the progress thread that wrote them.
  ucx_worker_->SyncWithProgress();
  std::vector<int32_t> tokens;
  for (uint32_t t : r.getTokens()) tokens.push_back(static_cast<int32_t>(t));
  Running run;
  run.params = FromWire(r.getSampling());
  const uint32_t g = r.getGeneratedSoFar();
  // The request's own sampling values (the router's check, common/sampling_check.h): a refusal
  // is the request's fault, not this worker's (Finish.errorKind invalidRequest).
  if (auto e = CheckSampling(engine::ValuesOf(run.params))) {
    FreeBlocks(lease->blocks, "sampling values refused");
    SendFinish(id, wire::FinishReason::ERROR,
               "decode worker " + options_.id + ": sampling: " + e->message, g, e->param);
    return;
  }
  const uint32_t uncached = r.getUncachedTokens();
  // firstToken is output index g-1 and counts toward max_tokens, as in the engine; the g-1
  // tokens streamed before it end `tokens`, and the KV of the last `uncached` of them is ours
  // to compute.
  std::string bad;
  if (g == 0 || static_cast<int64_t>(g) > run.params.max_tokens) {
    bad = "generatedSoFar " + std::to_string(g) + " outside [1, maxTokens]";
  } else if (g - 1 >= tokens.size()) {
    bad = "generatedSoFar " + std::to_string(g) + " for " + std::to_string(tokens.size()) +
          " tokens";
  } else if (uncached > g - 1) {
    bad = "uncachedTokens " + std::to_string(uncached) + " > generatedSoFar - 1 (" +
          std::to_string(g - 1) + ")";
  }
  if (!bad.empty()) {
    FreeBlocks(lease->blocks, "bad StartDecode");
    SendFinish(id, wire::FinishReason::ERROR, bad, g);
    return;
  }
  const int32_t first = static_cast<int32_t>(r.getFirstToken());
  const auto prompt_end = tokens.end() - static_cast<std::ptrdiff_t>(g - 1);
  run.prompt.assign(tokens.begin(), prompt_end);
  run.generated.assign(prompt_end, tokens.end());
  run.generated.push_back(first);
  run.next_index = g;
  if (static_cast<int64_t>(g) >= run.params.max_tokens) {
    // The first token already used the whole budget.
    FreeBlocks(lease->blocks, "finished at the first token");
    SendFinish(id, wire::FinishReason::LENGTH, "", g);
    return;
  }
  // The seeded random stream continues at draw g (engine.h).
  Status st = engine_->AddPrefilledSequence(id, std::move(tokens), lease->blocks, first,
                                            run.params, static_cast<int>(g - 1),
                                            static_cast<int>(uncached));
  if (!st.ok()) {
    FreeBlocks(lease->blocks, "StartDecode refused");
    SendFinish(id, wire::FinishReason::ERROR, "decode worker " + options_.id + ": " + st.message(), g);
    return;
  }
  run.lease_id = lease->lease_id;
  {
    std::vector<uint32_t> counts;
    for (uint32_t c : r.getPromptRouting()) counts.push_back(c);
    prompt_features_->Add(counts);
  }
  running_[id] = std::move(run);
  admit_order_.push_back(id);
}

void DecodeWorker::OnCancel(wire::Cancel::Reader r, size_t link) {
  const uint64_t id = RequestKey(link, r.getRequestId());
  const uint64_t lease_id = r.getLeaseId();
  if (r.getWriterDone()) {
    // Only a named lease: the request may hold a newer lease or run here by now.
    if (lease_id == 0) return;
    if (auto live = leases_.Take(lease_id, id)) {
      FreeBlocks(live->blocks, "cancel, writer done");
      SendFinish(id, wire::FinishReason::CANCELLED, "", 0);
      return;
    }
    ReleaseQuarantined(lease_id, id, "writer done");
    return;
  }
  (void)reserve_wait_.Drop(id);  // held, not granted: nothing to finish
  bool found = false;
  std::vector<KvLease> ended;
  if (lease_id != 0) {
    if (auto l = leases_.Take(lease_id, id)) ended.push_back(std::move(*l));
  } else {
    ended = leases_.TakeByRequest(id);
  }
  for (auto& l : ended) {
    Quarantine(std::move(l), "cancelled");
    found = true;
  }
  auto it = running_.find(id);
  if (it != running_.end() && (lease_id == 0 || it->second.lease_id == lease_id)) {
    (void)engine_->RemoveSequence(id);
    const uint32_t n = it->second.next_index;
    running_.erase(it);
    admit_order_.erase(std::remove(admit_order_.begin(), admit_order_.end(), id), admit_order_.end());
    SendFinish(id, wire::FinishReason::CANCELLED, "", n);
    return;
  }
  if (found) SendFinish(id, wire::FinishReason::CANCELLED, "", 0);
}

bool DecodeWorker::Preempt() {
  // The most recently admitted sequence that still holds KV in the engine: blocks, not the
  // preempted mark, decide, since a sequence being recomputed holds blocks before it samples
  // again (a recompute chunk cut one token short by the free blocks leaves it decoding, still
  // marked), and when only such sequences hold the blocks a decode step needs, one of them
  // must give them back.
  std::map<engine::SeqId, int> held;
  for (const engine::SequenceInfo& s : engine_->Sequences()) held[s.id] = s.num_blocks;
  for (auto it = admit_order_.rbegin(); it != admit_order_.rend(); ++it) {
    auto rit = running_.find(*it);
    if (rit == running_.end() || held[*it] == 0) continue;
    Running& run = rit->second;
    if (!engine_->RemoveSequence(*it).ok()) continue;
    // Requeue with what was generated: the engine recomputes the KV when blocks free up.
    Status st = engine_->AddSequence(*it, run.prompt, run.params, run.generated);
    metrics_->preemptions->Increment();
    if (!st.ok()) {
      SendFinish(*it, wire::FinishReason::ERROR, "preempted and could not be requeued: " + st.message(),
                 run.next_index);
      running_.erase(rit);
      return true;
    }
    run.preempted = true;
    PW_LOG(INFO) << options_.id << ": preempted request " << KeyName(*it) << " (KV pool full), will recompute";
    return true;
  }
  return false;
}

void DecodeWorker::KeepaliveLoop() {
  // Checks a few times per interval, so a due heartbeat leaves at most a quarter late.
  const auto period = std::chrono::milliseconds(std::max<uint64_t>(1, options_.heartbeat_ms / 4));
  auto fill = [this](wire::Heartbeat::Builder h) { FillHeartbeat(step_load_, h); };
  std::unique_lock<std::mutex> lk(control_mu_);
  while (!keepalive_stop_) {
    // Outside a step the loop holds control_mu_: this thread gets it during a step, or around
    // Run's start and end, when in_step_ is false.
    if (in_step_) {
      for (size_t i = 0; i < routers_.size(); ++i) {
        if (routers_.at(i).HeartbeatIfDue(fill)) ++keepalive_beats_;
      }
      if (broker_ && broker_->HeartbeatIfDue(fill)) ++keepalive_beats_;
    }
    keepalive_cv_.wait_for(lk, period, [this] { return keepalive_stop_; });
  }
}

void DecodeWorker::StepOnce(std::unique_lock<std::mutex>& control) {
  // The engine is this thread's alone; the control clients are the keepalive's while it runs.
  step_load_ = TakeLoad();
  in_step_ = true;
  control.unlock();
  weights_->BeginStep();
  const auto step_begin = std::chrono::steady_clock::now();
  auto step = engine_->Step();
  // The serving path's trace at PW_LOG_LEVEL=debug (docs/benchmarks.md, "Serving on one
  // machine"): the step's end here, each chunk's send below, the router's receipt and write.
  PW_LOG(DEBUG) << options_.id << ": trace: step end, "
                << std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::steady_clock::now() - step_begin).count()
                << " us";
  weights_->EndStep();
  control.lock();
  in_step_ = false;
  if (lynx_metrics_) lynx_metrics_->Export(lynx_hook_->stats());
  if (!step.ok()) {
    if (step.status().code() == StatusCode::kResourceExhausted) {
      if (Preempt()) return;
    }
    PW_LOG(ERROR) << options_.id << ": engine step failed: " << step.status().ToString();
    for (auto& [id, run] : running_) {
      (void)engine_->RemoveSequence(id);
      SendFinish(id, wire::FinishReason::ERROR, "decode step failed: " + step.status().message(),
                 run.next_index);
    }
    running_.clear();
    admit_order_.clear();
    return;
  }
  for (const auto& u : step->updates) {
    auto it = running_.find(u.id);
    if (it == running_.end()) continue;
    Running& run = it->second;
    if (!u.new_tokens.empty()) {
      run.preempted = false;
      proto::OutMessage m;
      auto tc = m.body().initTokenChunk();
      tc.setRequestId(KeyRequest(u.id));
      tc.setStartIndex(run.next_index);
      auto list = tc.initTokens(static_cast<unsigned>(u.new_tokens.size()));
      for (size_t i = 0; i < u.new_tokens.size(); ++i) {
        list.set(static_cast<unsigned>(i), static_cast<uint32_t>(u.new_tokens[i]));
        run.generated.push_back(u.new_tokens[i]);
      }
      if (!u.logprobs.empty() && u.logprobs.size() == u.new_tokens.size()) {  // asked for
        auto lps = tc.initLogprobs(static_cast<unsigned>(u.logprobs.size()));
        for (size_t i = 0; i < u.logprobs.size(); ++i) {
          ToWire(u.logprobs[i], lps[static_cast<unsigned>(i)]);
        }
      }
      run.next_index += static_cast<uint32_t>(u.new_tokens.size());
      metrics_->tokens_generated->Increment(static_cast<double>(u.new_tokens.size()));
      Status st = routers_.Send(u.id, m);
      if (!st.ok()) PW_LOG(WARNING) << options_.id << ": TokenChunk: " << st.ToString();
      PW_LOG(DEBUG) << options_.id << ": trace: request " << KeyName(u.id) << " token "
                    << run.next_index - u.new_tokens.size() << " sent";
    }
    if (u.finished) {
      SendFinish(u.id,
                 u.reason == engine::FinishReason::kStop ? wire::FinishReason::STOP
                                                         : wire::FinishReason::LENGTH,
                 "", run.next_index);
      running_.erase(it);
      admit_order_.erase(std::remove(admit_order_.begin(), admit_order_.end(), u.id),
                         admit_order_.end());
    }
  }
}

Status DecodeWorker::Run(const std::atomic<bool>& stop, int drain_timeout_ms) {
  std::unique_lock<std::mutex> control(control_mu_);
  PW_RETURN_IF_ERROR(routers_.Start());
  keepalive_stop_ = false;
  keepalive_ = std::thread([this] { KeepaliveLoop(); });
  PW_LOG(INFO) << options_.id << ": serving; page pool " << pool_->num_pages() << " pages of "
               << pool_->page_bytes() << " bytes (" << pool_->Count(memory::Tenant::kWeights)
               << " weights, " << pool_->num_free() << " free), KV up to "
               << engine_->kv_pool().num_blocks() << " blocks of " << engine_->kv_pool().layout().num_layers
               << " pages (" << engine::KvDtypeName(engine_->kv_pool().layout().dtype) << "), routers "
               << routers_.Describe();
  uint64_t drain_deadline = 0;
  auto router_handler = [this](size_t link, const proto::InMessage& m) -> Status { return HandleRouter(m, link); };
  auto broker_handler = [this](const std::string&, const proto::InMessage& m) -> Status {
    return weights_->Handle(m);
  };
  while (true) {
    metrics_->beat->Beat();
    if (stop.load() && !draining_) {
      draining_ = true;
      PW_LOG(INFO) << options_.id << ": draining (" << running_.size() << " running, "
                   << leases_.size() << " leased)";
    }
    if (draining_ && drain_deadline == 0) {
      drain_deadline = clock_->NowMs() + static_cast<uint64_t>(drain_timeout_ms);
    }
    if (draining_ && running_.empty() && leases_.size() == 0) break;
    if (draining_ && clock_->NowMs() > drain_deadline) {
      PW_LOG(WARNING) << options_.id << ": drain timed out";
      for (auto& [id, run] : running_) {
        (void)engine_->RemoveSequence(id);
        SendFinish(id, wire::FinishReason::ERROR, "decode worker shut down", run.next_index);
      }
      running_.clear();
      break;
    }
    const bool busy = engine_->HasWork();
    routers_.Refresh();
    routers_.Poll(busy ? 0 : 10, router_handler);
    if (broker_) broker_->Poll(0, broker_handler);
    for (auto& l : leases_.TakeExpired()) {
      PW_LOG(WARNING) << options_.id << ": lease " << l.lease_id << " of request " << l.request_id
                      << " expired";
      Quarantine(std::move(l), "expired");
      metrics_->leases_expired->Increment();
    }
    ExpireQuarantine();
    WeightsBoundary();
    if (engine_->HasWork()) StepOnce(control);
    UpdateMetrics();
  }
  for (const auto& h : reserve_wait_.TakeAll()) AnswerReserve(h, "decode worker " + options_.id + " shut down");
  for (auto& l : leases_.TakeAll()) FreeBlocks(l.blocks, "shutdown");
  for (auto& [lease, q] : quarantine_) FreeBlocks(q.blocks, "shutdown");
  quarantine_.clear();
  // Tell the router once more (heartbeat carries draining) before leaving.
  routers_.Poll(0, router_handler);
  keepalive_stop_ = true;
  const uint64_t keepalive_beats = keepalive_beats_;
  control.unlock();
  keepalive_cv_.notify_all();
  keepalive_.join();
  PW_LOG(INFO) << options_.id << ": stopped (" << keepalive_beats
               << " heartbeats sent during engine steps)";
  return Status::Ok();
}

}  // namespace pw::workers
