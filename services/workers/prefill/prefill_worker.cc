#include "services/workers/prefill/prefill_worker.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "common/formats/checkpoint_experts.h"
#include "common/formats/model_hash_cache.h"
#include "common/formats/width_map.h"
#include "common/logging.h"
#include "common/sampling_check.h"
#include "engine/models/model.h"
#include "services/transport/control_connect.h"
#include "services/common/model_name.h"
#include "services/common/transferable_kv.h"
#include "services/workers/common/worker_common.h"

namespace pw::workers {

namespace {
// Copies an InMessage (handlers' readers do not outlive the frame).
Result<std::shared_ptr<proto::InMessage>> Keep(const proto::InMessage& m) {
  ::capnp::MallocMessageBuilder b;
  b.setRoot(m.envelope());
  auto flat = ::capnp::messageToFlatArray(b);
  auto bytes = flat.asBytes();
  PW_ASSIGN_OR_RETURN(auto in, proto::InMessage::Parse(std::string_view(
                                   reinterpret_cast<const char*>(bytes.begin()), bytes.size())));
  return std::shared_ptr<proto::InMessage>(std::move(in));
}
}  // namespace

PrefillWorker::PrefillWorker(PrefillWorkerOptions options, const Clock* clock)
    : options_(std::move(options)), clock_(clock) {}

PrefillWorker::~PrefillWorker() {
  stop_compute_.store(true);
  work_cv_.notify_all();
  if (compute_.joinable()) compute_.join();
  peers_.clear();
  ucx_ctx_.reset();
}

Result<std::unique_ptr<PrefillWorker>> PrefillWorker::Create(PrefillWorkerOptions options,
                                                             const Clock* clock) {
  if (options.router_endpoints.empty())
    return InvalidArgument("prefill worker: router is required (--router or the key router of --config)");
  if (options.model_dir.empty()) return InvalidArgument("prefill worker: model dir is required");
  if (options.max_batch_prompts < 1 || options.put_timeout_ms < 1) {
    return InvalidArgument("prefill worker: max_batch_prompts and put_timeout_ms must be >= 1");
  }
  options.id = DefaultWorkerId(options.id, "prefill");
  options.node = DefaultNodeName(options.node);
  if (options.model_name.empty()) options.model_name = service::ModelNameFromDir(options.model_dir);
  std::unique_ptr<PrefillWorker> w(
      new PrefillWorker(std::move(options), clock ? clock : SteadyClock::Get()));
  PW_RETURN_IF_ERROR(w->Setup());
  return w;
}

Status PrefillWorker::OpenStoreExperts() {
  const bool from_store = options_.expert_bits != anyprec::kBf16Bits;
  if (options_.store_path.empty() != !from_store) {
    return InvalidArgument("prefill worker: expert_bits " + std::to_string(options_.expert_bits) +
                           (from_store ? " needs a store" : " with store " + options_.store_path) +
                           ": give both store and expert_bits 3..8, or neither");
  }
  if (!from_store) return Status::Ok();
  if (options_.expert_bits < anyprec::kMinBits || options_.expert_bits > anyprec::kMaxBits) {
    return InvalidArgument("prefill worker: expert_bits " + std::to_string(options_.expert_bits) +
                           " outside 3..8 (16: the checkpoint's bf16 experts)");
  }
  // The hash of the checkpoint the store must have been made for: remembered beside pw serve's
  // store cache, or read from every expert byte.
  apw::ApwStore::Options so;
  if (options_.model_hash_cache.empty()) {
    PW_ASSIGN_OR_RETURN(so.expected_model_hash, ModelHash(options_.model_dir));
  } else {
    PW_ASSIGN_OR_RETURN(CachedModelHash cached, ModelHashCached(options_.model_dir, options_.model_hash_cache));
    so.expected_model_hash = cached.hash;
  }
  PW_ASSIGN_OR_RETURN(std::shared_ptr<const apw::ApwStore> store, apw::ApwStore::Open(options_.store_path, so));
  const apw::StoreInfo& info = store->info();
  PW_ASSIGN_OR_RETURN(anyprec::WidthMap widths,
                      anyprec::WidthMap::Uniform(options_.expert_bits, static_cast<int>(info.num_layers),
                                                 static_cast<int>(info.num_experts)));
  PW_ASSIGN_OR_RETURN(store_experts_, anyprec::ApwExpertProvider::Create(std::move(store), engine_->model(),
                                                                         std::move(widths), /*check_hash=*/false));
  return Status::Ok();
}

Status PrefillWorker::Setup() {
  engine::EngineOptions eo;
  eo.num_kv_blocks = options_.num_kv_blocks;
  eo.block_size = options_.block_size;
  eo.num_threads = WorkerThreads(options_.threads);
  eo.max_batch_tokens = options_.max_batch_tokens;
  eo.kv_dtype = options_.kv_dtype;
  eo.copy_weights = options_.copy_weights;
  eo.dense = options_.dense;
  eo.lm_head = options_.lm_head;
  PW_ASSIGN_OR_RETURN(engine_, engine::Engine::Create(options_.model_dir, eo));
  PW_RETURN_IF_ERROR(OpenStoreExperts());
  PW_LOG(INFO) << options_.id << ": " << eo.num_threads << " compute threads, dense matrices "
               << DenseFormatName(engine_->model().dense_format()) << ", lm_head "
               << DenseFormatName(engine_->model().lm_head_format()) << ", experts "
               << (store_experts_ ? std::to_string(options_.expert_bits) + "-bit from " + options_.store_path
                                  : std::string("bf16 from the checkpoint"));
  const auto& cfg = engine_->model().config();
  prompt_routing_ = std::make_unique<PromptRoutingRecorder>(static_cast<int>(cfg.num_layers),
                                                            static_cast<int>(cfg.num_experts));
  {
    engine::MoeHooks hooks;
    hooks.recorder = prompt_routing_.get();
    hooks.provider = store_experts_.get();  // null: the checkpoint's bf16 experts
    engine_->SetMoeHooks(hooks);
  }
  layout_hash_ =
      KvLayoutHash(engine_->kv_pool().layout(), engine_->kv_pool().specs(), cfg.hidden_size,
                   cfg.vocab_size, cfg.model_type);
  pool_blocks_ = static_cast<uint32_t>(engine_->kv_pool().num_blocks());
  free_blocks_.store(static_cast<uint32_t>(engine_->kv_pool().num_free()));
  PW_ASSIGN_OR_RETURN(metrics_, WorkerMetrics::Create(options_.metrics_bind, options_.id, options_.main_loop_stale_ms));
  compute_beat_ = std::make_unique<service::MainLoopBeat>(options_.main_loop_stale_ms, SteadyClock::Get(),
                                                          "compute loop");
  metrics_->beat->Watch(compute_beat_.get());
  PW_ASSIGN_OR_RETURN(ucx_ctx_, transport::ucx::Context::Create());
  // This process registers no memory of its own. Each decode peer is reached from a worker of
  // its own (Endpoint::ConnectOnOwnWorker), progressed by the puts while they wait: a decode
  // worker killed mid-transfer then cannot stall the transfers to the others.

  auto make_client =
      [&](const std::string& endpoint) -> Result<std::unique_ptr<transport::ControlClient>> {
    transport::ControlClient::Options o;
    o.id = options_.id;
    o.role = wire::Role::PREFILL;
    o.heartbeat_ms = options_.heartbeat_ms;
    PW_ASSIGN_OR_RETURN(auto c, transport::ConnectControlClient(endpoint, clock_, o));
    c->fill_register = [this](wire::Register::Builder r) { FillRegister(r); };
    c->fill_heartbeat = [this](wire::Heartbeat::Builder h) { FillHeartbeat(h); };
    return c;
  };
  // One link per router (router_links.h). Ready (/ready) while registered with at least one.
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
  if (!options_.broker_endpoint.empty()) {
    PW_ASSIGN_OR_RETURN(broker_, make_client(options_.broker_endpoint));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- control thread

void PrefillWorker::FillRegister(wire::Register::Builder r) {
  const auto& pool = engine_->kv_pool();  // layout and size only: fixed after Setup
  r.setModelName(options_.model_name);
  r.setNodeName(options_.node);
  auto kl = r.initKvLayout();
  kl.setNumBlocks(pool_blocks_);
  kl.setBlockTokens(static_cast<uint32_t>(pool.layout().block_size));
  kl.setBlockBytes(pool.bytes_per_block());
  kl.setLayoutHash(layout_hash_);
  kl.setPageBytes(pool.pages().page_bytes());
  kl.setLayerBytes(service::KvLayerBytes(pool.layout(), pool.specs()));
  kl.setNumLayers(static_cast<uint32_t>(pool.layout().num_layers));
  kl.setPagesPerBlock(static_cast<uint32_t>(pool.pages_per_block()));
  r.setMaxBatch(static_cast<uint32_t>(options_.max_batch_prompts));
  r.setMaxContext(static_cast<uint32_t>(engine_->max_context()));
  r.setMetricsPort(metrics_ ? metrics_->port() : 0);
}

void PrefillWorker::DropLink(size_t link) {
  // That router's requests died with it: drop them from the queue, cancel those in flight.
  // Other routers' requests go on.
  std::lock_guard<std::mutex> lk(mu_);
  size_t queued = 0, running = 0;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (KeyLink((*it)->request_id) == link) {
      queued_tokens_ -= (*it)->num_tokens;
      it = queue_.erase(it);
      ++queued;
    } else {
      ++it;
    }
  }
  for (auto& [key, job] : inflight_) {
    if (KeyLink(key) != link) continue;
    job->cancelled.store(true);
    ++running;
  }
  if (queued + running > 0) {
    PW_LOG(WARNING) << options_.id << ": router " << routers_.endpoint(link) << " lost; dropping " << queued
                    << " queued and " << running << " running prompts";
  }
}

void PrefillWorker::FillHeartbeat(wire::Heartbeat::Builder h) {
  const uint32_t free = free_blocks_.load();
  h.setFreeKvBlocks(free);
  h.setUsedKvBlocks(pool_blocks_ - std::min(free, pool_blocks_));
  std::lock_guard<std::mutex> lk(mu_);
  h.setWaitingRequests(static_cast<uint32_t>(queue_.size()));
  h.setRunningRequests(static_cast<uint32_t>(inflight_.size()));
  h.setQueuedPromptTokens(queued_tokens_ + active_remaining_tokens_.load());
  h.setDraining(draining_.load());
}

Status PrefillWorker::HandleRouter(const proto::InMessage& m, size_t link) {
  switch (m.which()) {
    case proto::Body::PREFILL_REQUEST: {
      auto req = m.body().getPrefillRequest();
      if (Status st = CheckRouterRequestId(req.getRequestId()); !st.ok()) {
        // No key holds it (router_links.h): refused on its link under the router's own id.
        proto::OutMessage out;
        auto kr = out.body().initKvReady();
        kr.setRequestId(req.getRequestId());
        kr.setOk(false);
        kr.setError("prefill worker " + options_.id + ": " + st.message());
        kr.setLeaseId(req.getLeaseId());
        kr.setDecodeWorkerId(req.getDecodeWorkerId());
        return routers_.at(link).Send(out);
      }
      const uint64_t key = RequestKey(link, req.getRequestId());
      if (draining_.load()) {
        Outcome o;
        o.request_id = key;
        o.lease_id = req.getLeaseId();
        o.decode_id = proto::ToString(req.getDecodeWorkerId());
        o.status = Unavailable("prefill worker " + options_.id + " is draining");
        SendKvReady(o);
        return Status::Ok();
      }
      PW_ASSIGN_OR_RETURN(auto kept, Keep(m));
      auto job = std::make_shared<Job>();
      job->msg = std::move(kept);
      job->request_id = key;
      job->lease_id = req.getLeaseId();
      job->decode_id = proto::ToString(req.getDecodeWorkerId());
      job->num_tokens = req.getTokens().size();
      job->received = std::chrono::steady_clock::now();
      {
        std::lock_guard<std::mutex> lk(mu_);
        queued_tokens_ += job->num_tokens;
        queue_.push_back(std::move(job));
      }
      work_cv_.notify_one();
      return Status::Ok();
    }
    case proto::Body::CANCEL: {
      auto c = m.body().getCancel();
      if (!CheckRouterRequestId(c.getRequestId()).ok()) return Status::Ok();  // no such request here
      const uint64_t id = RequestKey(link, c.getRequestId());
      const uint64_t lease = c.getLeaseId();
      auto matches = [&](const Job& j) {
        return j.request_id == id && (lease == 0 || j.lease_id == lease);
      };
      std::lock_guard<std::mutex> lk(mu_);
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (matches(**it)) {
          queued_tokens_ -= (*it)->num_tokens;
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      auto it = inflight_.find(id);
      if (it != inflight_.end() && matches(*it->second)) it->second->cancelled.store(true);
      return Status::Ok();
    }
    case proto::Body::DRAIN:
      draining_.store(true);
      return Status::Ok();
    default:
      return InvalidArgument("unexpected message " + proto::BodyName(m.which()) +
                             " for a prefill worker");
  }
}

void PrefillWorker::SendKvReady(const Outcome& o) {
  proto::OutMessage out;
  auto kr = out.body().initKvReady();
  kr.setRequestId(KeyRequest(o.request_id));
  kr.setOk(o.status.ok());
  if (!o.status.ok()) {
    kr.setError("prefill worker " + options_.id + ": " + o.status.message());
    if (!o.refused_param.empty()) {
      kr.setErrorKind(wire::ErrorKind::INVALID_REQUEST);
      kr.setErrorParam(o.refused_param);
    }
    PW_LOG(WARNING) << options_.id << ": request " << KeyName(o.request_id) << ": " << o.status.ToString();
    metrics_->requests_finished_error->Increment();
  } else {
    kr.setFirstToken(static_cast<uint32_t>(o.first_token));
    if (o.first_logprobs) ToWire(*o.first_logprobs, kr.initFirstLogprob());
    if (!o.prompt_logprobs.empty()) {
      auto list = kr.initPromptLogprobs(static_cast<unsigned>(o.prompt_logprobs.size()));
      for (size_t i = 0; i < o.prompt_logprobs.size(); ++i) {
        ToWire(o.prompt_logprobs[i], list[static_cast<unsigned>(i)]);
      }
    }
    if (!o.prompt_routing.empty()) {
      proto::FillU32([&](unsigned n) { return kr.initPromptRouting(n); }, o.prompt_routing);
    }
    metrics_->requests_finished_ok->Increment();
  }
  kr.setNumTokens(o.num_tokens);
  kr.setLeaseId(o.lease_id);
  kr.setDecodeWorkerId(o.decode_id);
  Status sst = routers_.Send(o.request_id, out);
  if (!sst.ok()) PW_LOG(WARNING) << options_.id << ": KvReady: " << sst.ToString();
}

void PrefillWorker::SendOutcomes() {
  std::vector<Outcome> out;
  {
    std::lock_guard<std::mutex> lk(mu_);
    out.swap(outbox_);
  }
  for (const Outcome& o : out) SendKvReady(o);
}

Status PrefillWorker::Run(const std::atomic<bool>& stop, int drain_timeout_ms) {
  PW_RETURN_IF_ERROR(routers_.Start());
  if (broker_) PW_RETURN_IF_ERROR(broker_->Start());
  PW_LOG(INFO) << options_.id << ": serving, routers " << routers_.Describe() << ", up to "
               << options_.max_batch_tokens << " tokens and " << options_.max_batch_prompts
               << " prompts per forward pass";
  stop_compute_.store(false);
  compute_ = std::thread([this] { ComputeLoop(); });
  auto handler = [this](size_t link, const proto::InMessage& m) -> Status { return HandleRouter(m, link); };
  auto broker_handler = [](const std::string&, const proto::InMessage&) -> Status {
    return Status::Ok();
  };
  uint64_t drain_deadline = 0;
  while (true) {
    metrics_->beat->Beat();
    if (stop.load() && !draining_.load()) draining_.store(true);
    bool idle;
    size_t waiting, running;
    {
      std::lock_guard<std::mutex> lk(mu_);
      idle = queue_.empty() && inflight_.empty() && outbox_.empty();
      waiting = queue_.size();
      running = inflight_.size();
    }
    if (draining_.load()) {
      if (drain_deadline == 0)
        drain_deadline = clock_->NowMs() + drain_timeout_ms;
      if (idle || clock_->NowMs() > drain_deadline) break;
    }
    // While prompts are in flight, wake every millisecond to pass on their KvReady promptly.
    routers_.Refresh();
    routers_.Poll(idle ? 10 : 1, handler);
    if (broker_) broker_->Poll(0, broker_handler);
    SendOutcomes();
    metrics_->requests_waiting->Set(static_cast<double>(waiting));
    metrics_->requests_running->Set(static_cast<double>(running));
  }
  stop_compute_.store(true);
  work_cv_.notify_all();
  compute_.join();
  SendOutcomes();
  routers_.Poll(0, handler);
  PW_LOG(INFO) << options_.id << ": stopped; " << shared_prompts_.load()
               << " prompts served from another's prefill; largest batch " << largest_batch_.load()
               << " prompts in one forward pass";
  return Status::Ok();
}

// ---------------------------------------------------------------- compute thread

Status PrefillWorker::Prepare(Job* job) {
  auto req = job->msg->body().getPrefillRequest();
  const auto& pool_layout = engine_->kv_pool().layout();
  auto dl = req.getDecodeLayout();
  job->tokens.clear();
  // A router before protocol 1.3 forwards no pagesPerBlock: it cannot place a hybrid's state;
  // one before 1.4 does not know an MLA model's latent layout.
  PW_RETURN_IF_ERROR(service::CheckPeerCarriesKv(engine_->kv_pool().specs(), options_.model_name,
                                                 "the router", job->msg->version_minor()));
  const uint64_t layer_bytes = service::KvLayerBytes(pool_layout, engine_->kv_pool().specs());
  if (dl.getLayoutHash() != layout_hash_ ||
      dl.getBlockTokens() != static_cast<uint32_t>(pool_layout.block_size) ||
      dl.getBlockBytes() != engine_->kv_pool().bytes_per_block() ||
      dl.getLayerBytes() != layer_bytes ||
      dl.getNumLayers() != static_cast<uint32_t>(pool_layout.num_layers) ||
      dl.getPageBytes() < layer_bytes) {
    return InvalidArgument("decode worker '" + job->decode_id +
                           "' has another KV layout (version/dtype/hash/block tokens/page bytes differ)");
  }
  for (uint32_t t : req.getTokens()) job->tokens.push_back(static_cast<int32_t>(t));
  if (job->tokens.empty()) return InvalidArgument("empty prompt");
  const int n_blocks =
      engine::BlocksForTokens(static_cast<int>(job->tokens.size()), pool_layout.block_size);
  auto dst = req.getBlockIds();
  if (dst.size() < static_cast<unsigned>(n_blocks)) {
    return InvalidArgument(std::to_string(dst.size()) + " reserved blocks for " +
                           std::to_string(job->tokens.size()) + " tokens (" +
                           std::to_string(n_blocks) + " needed)");
  }
  std::set<uint32_t> distinct;
  for (int i = 0; i < n_blocks; ++i) {
    const uint32_t b = dst[static_cast<unsigned>(i)];
    if (b >= dl.getNumBlocks() || !distinct.insert(b).second) {
      return InvalidArgument("reserved block id " + std::to_string(b) + " invalid or repeated");
    }
  }
  // Every page of every reserved block (layer after layer, a recurrent state over as many pages
  // as the decode worker's page size needs) is a page of the decode worker's pool.
  auto pages = req.getPageIds();
  const uint64_t page_bytes = dl.getPageBytes();
  const auto mem = req.getDecodeMemory();
  PW_ASSIGN_OR_RETURN(job->decode_first_page,
                      memory::BlockPageOffsets(engine_->kv_pool().specs(), pool_layout, page_bytes));
  const uint32_t block_pages = dl.getPagesPerBlock() != 0 ? dl.getPagesPerBlock() : dl.getNumLayers();
  if (block_pages != static_cast<uint32_t>(job->decode_first_page.back())) {
    return InvalidArgument("decode worker '" + job->decode_id + "' has " + std::to_string(block_pages) +
                           " pages a KV block, this model's blocks take " +
                           std::to_string(job->decode_first_page.back()) + " of " +
                           std::to_string(page_bytes) + " bytes");
  }
  const size_t n_pages = static_cast<size_t>(n_blocks) * block_pages;
  if (pages.size() < n_pages) {
    return InvalidArgument(std::to_string(pages.size()) + " reserved pages for " +
                           std::to_string(n_blocks) + " blocks (" + std::to_string(n_pages) + " needed)");
  }
  std::set<uint32_t> distinct_pages;
  for (size_t i = 0; i < n_pages; ++i) {
    const uint32_t p = pages[static_cast<unsigned>(i)];
    if (!distinct_pages.insert(p).second || (static_cast<uint64_t>(p) + 1) * page_bytes > mem.getBytes()) {
      return InvalidArgument("reserved page " + std::to_string(p) + " repeated or outside the decode pool");
    }
  }
  job->work.params = FromWire(req.getSampling());
  // The sampled token is output number generatedSoFar: the engine draws it as that index of
  // the request's seeded stream.
  const uint32_t g = req.getGeneratedSoFar();
  if (static_cast<int64_t>(g) >= job->work.params.max_tokens) {
    return InvalidArgument("generatedSoFar >= maxTokens");
  }
  if (g >= job->tokens.size()) return InvalidArgument("generatedSoFar >= tokens");
  job->work.num_generated_before = static_cast<int>(g);
  job->work.prompt_logprobs = req.getPromptLogprobs();  // range checked by CheckPrefill
  job->work.prompt = job->tokens;
  // Checked without blocks first (the blocks come from Admit).
  if (n_blocks > engine_->kv_pool().num_blocks()) {
    return OutOfRange("prompt of " + std::to_string(job->tokens.size()) + " tokens needs " +
                      std::to_string(n_blocks) + " KV blocks, this worker's pool has " +
                      std::to_string(engine_->kv_pool().num_blocks()));
  }
  return Status::Ok();
}

void PrefillWorker::Admit(std::vector<std::shared_ptr<Job>>* active) {
  const auto& pool = engine_->kv_pool();
  while (true) {
    uint64_t remaining = 0;
    for (const auto& j : *active) remaining += j->tokens.size() - j->work.num_computed;
    if (remaining >= static_cast<uint64_t>(options_.max_batch_tokens) ||
        static_cast<int>(active->size()) >= options_.max_batch_prompts) {
      return;
    }
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (queue_.empty()) return;
      job = queue_.front();
    }
    Status st = proto::GuardWire("PrefillRequest", [&]() -> Status { return Prepare(job.get()); });
    // An equal prompt being prefilled, or just prefilled: share its forward passes.
    std::shared_ptr<Job> leader;
    bool from_recent = false;
    // The request's own sampling values first (the router's check, common/sampling_check.h): a
    // refusal is the request's fault, not this worker's (KvReady.errorKind invalidRequest).
    std::string refused_param;
    if (st.ok()) {
      if (auto e = CheckSampling(engine::ValuesOf(job->work.params))) {
        st = InvalidArgument("sampling: " + e->message);
        refused_param = e->param;
      } else {
        st = engine::ValidateSamplingParams(job->work.params, engine_->vocab_size());
      }
    }
    if (st.ok()) {
      for (const auto& a : *active) {
        if (!a->work.done() &&
            SameWork(*a, job->tokens, job->work.num_generated_before, job->work.prompt_logprobs)) {
          leader = a;
          break;
        }
      }
      from_recent = leader == nullptr && recent_ && recent_->tokens == job->tokens &&
                    recent_->num_generated_before == job->work.num_generated_before &&
                    recent_->prompt_logprobs == job->work.prompt_logprobs;
    }
    if (st.ok() && (leader || from_recent)) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = std::find(queue_.begin(), queue_.end(), job);
        if (it == queue_.end()) continue;  // cancelled meanwhile
        queue_.erase(it);
        queued_tokens_ -= job->num_tokens;
        inflight_[job->request_id] = job;
      }
      if (leader) {
        leader->followers.push_back(std::move(job));
      } else {
        recent_->at_ms = clock_->NowMs();
        ServeShared(job.get(), recent_->own, recent_->result);
      }
      continue;
    }
    if (st.ok()) {
      const int need =
          engine::BlocksForTokens(static_cast<int>(job->tokens.size()), pool.layout().block_size);
      if (need > pool.num_free() && recent_) DropRecent();  // the kept KV gives way
      if (need > pool.num_free()) {
        if (!active->empty()) return;  // waits for blocks of the running prompts
        st = ResourceExhausted("no room in the prefill KV pool");  // cannot happen: pool is free
      } else {
        auto got = engine_->LeaseKvBlocks(need);
        st = got.status();
        if (st.ok()) job->own = std::move(*got);
      }
    }
    if (st.ok()) {
      job->work.block_ids = job->own;
      st = engine_->CheckPrefill(job->work);
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      // A cancel may have removed it from the queue meanwhile.
      auto it = std::find(queue_.begin(), queue_.end(), job);
      if (it == queue_.end()) {
        if (!job->own.empty()) (void)engine_->ReturnKvBlocks(job->own);
        job->own.clear();
        continue;
      }
      queue_.erase(it);
      queued_tokens_ -= job->num_tokens;
      if (st.ok()) {
        inflight_[job->request_id] = job;
        job->admitted = std::chrono::steady_clock::now();
        metrics_->request_queue_time->Observe(
            std::chrono::duration<double>(job->admitted - job->received).count());
      }
    }
    if (!st.ok()) {
      if (!job->own.empty()) (void)engine_->ReturnKvBlocks(job->own);
      job->own.clear();
      Outcome o;
      o.request_id = job->request_id;
      o.lease_id = job->lease_id;
      o.decode_id = job->decode_id;
      o.num_tokens = job->num_tokens;
      o.status = st;
      o.refused_param = std::move(refused_param);
      std::lock_guard<std::mutex> lk(mu_);
      outbox_.push_back(std::move(o));
      continue;
    }
    active->push_back(std::move(job));
  }
}

Result<PrefillWorker::Peer*> PrefillWorker::PeerFor(const std::string& decode_id,
                                                    wire::UcxMemory::Reader mem) {
  const std::string address = proto::ToBytes(mem.getWorkerAddress());
  const std::string rkey = proto::ToBytes(mem.getRkey());
  auto it = peers_.find(decode_id);
  if (it != peers_.end()) {
    Peer& p = it->second;
    if (p.address == address && p.rkey == rkey && p.base == mem.getBaseAddr() &&
        p.bytes == mem.getBytes() && p.ep->healthy()) {
      return &p;
    }
    // A restarted decode worker (new address or region) or a failed endpoint: close without
    // waiting for the old peer, then reconnect.
    p.region.reset();
    if (p.ep->healthy()) p.ep->Fail("decode worker re-registered");
    peers_.erase(it);
  }
  Peer p;
  p.address = address;
  p.rkey = rkey;
  p.base = mem.getBaseAddr();
  p.bytes = mem.getBytes();
  PW_ASSIGN_OR_RETURN(p.ep, transport::ucx::Endpoint::ConnectOnOwnWorker(
                                *ucx_ctx_, address, transport::ucx::Endpoint::ErrorMode::kNone));
  PW_ASSIGN_OR_RETURN(p.region, p.ep->OpenRegion(rkey, p.base, p.bytes));
  // Which transport UCX chose (tcp between pods, shared memory on one host): the label of
  // pagedweight_kv_transfer_bytes_total, so a deployment can see its KV crossing the network.
  auto transports = p.ep->Transports();
  p.transport = transports.ok() ? *transports : "unknown";
  PW_LOG(INFO) << options_.id << ": KV transfers to " << decode_id << " over UCX transport " << p.transport
               << (transports.ok() ? "" : " (" + transports.status().message() + ")");
  auto [ins, ok] = peers_.emplace(decode_id, std::move(p));
  return &ins->second;
}

Status PrefillWorker::Transfer(Job* job) {
  auto req = job->msg->body().getPrefillRequest();
  const auto& pool = engine_->kv_pool();
  const int L = pool.layout().num_layers;
  const uint64_t page_bytes = req.getDecodeLayout().getPageBytes();
  const uint64_t own_page_bytes = pool.pages().page_bytes();
  const std::vector<int>& first = job->decode_first_page;  // Prepare checked it against the pages
  const uint64_t block_pages = static_cast<uint64_t>(first.back());
  auto pages = req.getPageIds();
  // One put per page's data, runs contiguous on both sides merged into one.
  std::vector<transport::ucx::RemoteRegion::Segment> segs;
  uint64_t total = 0;
  auto put = [&](uint64_t off, const uint8_t* src, uint64_t bytes) {
    total += bytes;
    if (!segs.empty()) {
      auto& last = segs.back();
      if (last.offset + last.bytes == off && static_cast<const uint8_t*>(last.local) + last.bytes == src) {
        last.bytes += bytes;
        return;
      }
    }
    segs.push_back({off, src, bytes});
  };
  for (size_t i = 0; i < job->own.size(); ++i) {
    for (int l = 0; l < L; ++l) {
      const uint64_t at = i * block_pages + static_cast<uint64_t>(first[static_cast<size_t>(l)]);
      const memory::KvLayerSpec& spec = pool.specs()[static_cast<size_t>(l)];
      if (spec.kind != memory::KvKind::kRecurrentState) {
        // One page of the block: K and V, or an MLA layer's latent rows, at the start of the
        // page on both sides whatever either pool's page size (Prepare checked it holds them).
        put(static_cast<uint64_t>(pages[static_cast<unsigned>(at)]) * page_bytes,
            pool.LayerPage(job->own[i], l), memory::LayerBlockBytes(spec, pool.layout()));
        continue;
      }
      // The sequence's state is in its first block's pages of the layer (memory/kv_spec.h); the
      // other blocks' are unused. Its bytes in order, split at both pools' page boundaries.
      if (i != 0) continue;
      for (uint64_t o = 0; o < spec.state_bytes;) {
        const uint64_t in_src = o % own_page_bytes, in_dst = o % page_bytes;
        const uint64_t n = std::min({own_page_bytes - in_src, page_bytes - in_dst, spec.state_bytes - o});
        const uint64_t dst_page = pages[static_cast<unsigned>(at + o / page_bytes)];
        put(dst_page * page_bytes + in_dst,
            pool.LayerPage(job->own[i], l, static_cast<int>(o / own_page_bytes)) + in_src, n);
        o += n;
      }
    }
  }
  PW_ASSIGN_OR_RETURN(Peer * peer, PeerFor(job->decode_id, req.getDecodeMemory()));
  PW_RETURN_IF_ERROR(peer->region->PutAll(segs, options_.put_timeout_ms, &job->cancelled));
  PW_RETURN_IF_ERROR(peer->ep->Flush(options_.put_timeout_ms, &job->cancelled));
  metrics_->ucx_put_bytes->Increment(static_cast<double>(total));
  metrics_->KvTransferBytes(peer->transport).Increment(static_cast<double>(total));
  return Status::Ok();
}

void PrefillWorker::Retire(Job* job, Status st) {
  if (!job->own.empty()) {
    Status fst = engine_->ReturnKvBlocks(job->own);
    if (!fst.ok()) PW_LOG(ERROR) << options_.id << ": freeing own blocks: " << fst.ToString();
    job->own.clear();
  }
  std::lock_guard<std::mutex> lk(mu_);
  auto it = inflight_.find(job->request_id);
  if (it != inflight_.end() && it->second.get() == job) inflight_.erase(it);
  if (job->cancelled.load()) {  // the router has moved on: no KvReady
    metrics_->requests_cancelled->Increment();
    return;
  }
  if (st.ok()) {
    metrics_->request_prefill_time->Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job->admitted).count());
  }
  Outcome o;
  o.request_id = job->request_id;
  o.lease_id = job->lease_id;
  o.decode_id = job->decode_id;
  o.num_tokens = job->num_tokens;
  o.status = std::move(st);
  o.first_token = job->work.result.first_token;
  if (job->work.params.logprobs >= 0) o.first_logprobs = job->work.result.first_logprobs;
  o.prompt_logprobs = std::move(job->work.result.prompt_logprobs);
  if (o.status.ok()) o.prompt_routing = std::move(job->routing);
  outbox_.push_back(std::move(o));
}

bool PrefillWorker::SameWork(const Job& a, const std::vector<int32_t>& tokens,
                             int num_generated_before, int prompt_logprobs) {
  return a.tokens == tokens && a.work.num_generated_before == num_generated_before &&
         a.work.prompt_logprobs == prompt_logprobs;
}

void PrefillWorker::ServeShared(Job* f, const std::vector<int32_t>& blocks,
                                const engine::PrefillResult& r) {
  if (f->cancelled.load()) {
    Retire(f, Cancelled("cancelled"));
    return;
  }
  const int V = engine_->vocab_size();
  f->work.num_computed = static_cast<int>(f->tokens.size());
  f->work.result.prompt_logprobs = r.prompt_logprobs;
  // Its own first token: its own seed, its own draw number.
  f->work.result.first_token =
      engine::SampleToken(r.last_logits.data(), V, f->work.params,
                          static_cast<uint64_t>(f->work.num_generated_before), &sample_scratch_);
  if (f->work.params.logprobs >= 0) {
    f->work.result.first_logprobs = engine::ComputeLogprobs(
        r.last_logits.data(), V, f->work.result.first_token, f->work.params.logprobs);
  }
  shared_prompts_.fetch_add(1);
  f->own = blocks;  // borrowed for the transfer; not freed by Retire
  Status st = Transfer(f);
  if (!st.ok()) st = st.WithContext("writing KV to '" + f->decode_id + "'");
  f->own.clear();
  Retire(f, st);
}

void PrefillWorker::DropRecent() {
  if (!recent_) return;
  Status st = engine_->ReturnKvBlocks(recent_->own);
  if (!st.ok()) PW_LOG(ERROR) << options_.id << ": freeing kept blocks: " << st.ToString();
  recent_.reset();
  free_blocks_.store(static_cast<uint32_t>(engine_->kv_pool().num_free()));
}

void PrefillWorker::FinishJob(const std::shared_ptr<Job>& j) {
  metrics_->prompt_tokens->Increment(static_cast<double>(j->tokens.size()));
  Status st = Status::Ok();
  if (!j->cancelled.load()) {
    st = Transfer(j.get());
    if (!st.ok()) st = st.WithContext("writing KV to '" + j->decode_id + "'");
  }
  for (auto& f : j->followers) {
    compute_beat_->Beat();  // each transfer is bounded by put_timeout_ms, not all of them
    ServeShared(f.get(), j->own, j->work.result);
  }
  j->followers.clear();
  // Keep the KV for an equal prompt arriving next (the blocks leave Retire's hands).
  DropRecent();
  Recent rec;
  rec.tokens = j->tokens;
  rec.num_generated_before = j->work.num_generated_before;
  rec.prompt_logprobs = j->work.prompt_logprobs;
  rec.own = std::move(j->own);
  j->own.clear();
  rec.result = j->work.result;
  rec.at_ms = clock_->NowMs();
  recent_ = std::move(rec);
  Retire(j.get(), j->cancelled.load() ? Cancelled("cancelled") : st);
}

void PrefillWorker::PublishLoad(const std::vector<std::shared_ptr<Job>>& active) {
  uint64_t remaining = 0;
  for (const auto& j : active) remaining += j->tokens.size() - j->work.num_computed;
  active_remaining_tokens_.store(remaining);
  free_blocks_.store(static_cast<uint32_t>(engine_->kv_pool().num_free()));
  // The prompts' pages until their transfer (and the kept last prompt's): every layer's, since
  // the transfer reads them all.
  metrics_->SetKvPages(engine_->kv_pool());
}

void PrefillWorker::ComputeLoop() {
  pthread_setname_np(pthread_self(), "pw-compute");  // named for debuggers and the /live test
  std::vector<std::shared_ptr<Job>> active;
  std::vector<engine::PrefillJob> batch;
  while (true) {
    // Every iteration, the idle ones (a wait of at most 100 ms) included: /live.
    compute_beat_->Beat();
    if (active.empty()) {
      std::unique_lock<std::mutex> lk(mu_);
      work_cv_.wait_for(lk, std::chrono::milliseconds(100),
                        [&] { return stop_compute_.load() || !queue_.empty(); });
    }
    if (stop_compute_.load()) break;
    if (recent_ && clock_->NowMs() - recent_->at_ms > kRecentMs) {
      DropRecent();
    }
    Admit(&active);
    // Drop what was cancelled (between passes; a transfer checks its flag itself). A cancelled
    // prompt that others wait for keeps running for them.
    for (auto it = active.begin(); it != active.end();) {
      Job& j = **it;
      auto& fs = j.followers;
      for (auto f = fs.begin(); f != fs.end();) {
        if ((*f)->cancelled.load()) {
          Retire(f->get(), Cancelled("cancelled"));
          f = fs.erase(f);
        } else {
          ++f;
        }
      }
      if (j.cancelled.load() && fs.empty()) {
        Retire(it->get(), Cancelled("cancelled"));
        it = active.erase(it);
      } else {
        ++it;
      }
    }
    PublishLoad(active);
    if (active.empty()) continue;
    // One forward pass over the next chunks of the running prompts.
    batch.clear();
    for (const auto& j : active) batch.push_back(j->work);
    prompt_routing_->BeginPass();
    auto ran = engine_->PrefillPass(batch);
    int in_pass = 0;
    for (size_t i = 0; i < active.size(); ++i) {
      if (batch[i].num_computed != active[i]->work.num_computed) {
        // The pass's sequences appear in the order of its jobs that ran.
        const size_t k = static_cast<size_t>(in_pass);
        if (ran.ok() && k < prompt_routing_->num_sequences()) {
          AddRoutingCounts(prompt_routing_->counts(k), &active[i]->routing);
        }
        ++in_pass;
      }
      active[i]->work.num_computed = batch[i].num_computed;
      active[i]->work.result = std::move(batch[i].result);
    }
    if (in_pass > largest_batch_.load()) largest_batch_.store(in_pass);
    std::vector<std::shared_ptr<Job>> next;
    for (auto& j : active) {
      if (!ran.ok()) {
        for (auto& f : j->followers) Retire(f.get(), ran.status());
        j->followers.clear();
        Retire(j.get(), ran.status());
        continue;
      }
      if (!j->work.done()) {
        next.push_back(std::move(j));
        continue;
      }
      FinishJob(j);
    }
    active.swap(next);
    PublishLoad(active);
  }
  for (auto& j : active) {
    for (auto& f : j->followers) {
      f->cancelled.store(true);
      Retire(f.get(), Cancelled("stopping"));
    }
    j->followers.clear();
    j->cancelled.store(true);
    Retire(j.get(), Cancelled("stopping"));
  }
  DropRecent();
  PublishLoad({});
}

}  // namespace pw::workers
