#include "services/workers/prefill_worker.h"

#include <set>

#include "common/logging.h"
#include "services/engine/model.h"
#include "services/transport/zmq_transport.h"
#include "services/workers/worker_common.h"

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

PrefillWorker::PrefillWorker(PrefillWorkerOptions options, const transport::Clock* clock)
    : options_(std::move(options)), clock_(clock) {}

PrefillWorker::~PrefillWorker() {
  peers_.clear();
  ucx_worker_.reset();
  ucx_ctx_.reset();
}

Result<std::unique_ptr<PrefillWorker>> PrefillWorker::Create(PrefillWorkerOptions options,
                                                             const transport::Clock* clock) {
  if (options.router_endpoint.empty()) return InvalidArgument("prefill worker: router endpoint is required");
  if (options.model_dir.empty()) return InvalidArgument("prefill worker: model dir is required");
  options.id = DefaultWorkerId(options.id, "prefill");
  if (options.model_name.empty()) options.model_name = ModelNameFromDir(options.model_dir);
  std::unique_ptr<PrefillWorker> w(
      new PrefillWorker(std::move(options), clock ? clock : transport::SteadyClock::Get()));
  PW_RETURN_IF_ERROR(w->Setup());
  return w;
}

Status PrefillWorker::Setup() {
  engine::EngineOptions eo;
  eo.num_kv_blocks = options_.num_kv_blocks;
  eo.block_size = options_.block_size;
  eo.num_threads = options_.threads;
  eo.max_batch_tokens = options_.max_batch_tokens;
  PW_ASSIGN_OR_RETURN(engine_, engine::Engine::Create(options_.model_dir, eo));
  const auto& cfg = engine_->model().config();
  layout_hash_ = KvLayoutHash(engine_->kv_pool().layout(), cfg.hidden_size, cfg.vocab_size,
                              cfg.model_type);
  PW_ASSIGN_OR_RETURN(metrics_, WorkerMetrics::Create(options_.metrics_bind, options_.id));
  PW_ASSIGN_OR_RETURN(ucx_ctx_, transport::ucx::Context::Create());
  PW_ASSIGN_OR_RETURN(ucx_worker_, transport::ucx::Worker::Create(*ucx_ctx_));
  // This process registers no memory of its own; its puts progress the worker while they wait.

  auto make_client = [&](const std::string& endpoint) -> Result<std::unique_ptr<transport::ControlClient>> {
    PW_ASSIGN_OR_RETURN(auto t, transport::ZmqDealerTransport::Connect(endpoint, options_.id));
    transport::ControlClient::Options o;
    o.id = options_.id;
    o.role = wire::Role::PREFILL;
    o.heartbeat_ms = options_.heartbeat_ms;
    auto c = std::make_unique<transport::ControlClient>(std::move(t), clock_, o);
    c->fill_register = [this](wire::Register::Builder r) { FillRegister(r); };
    c->fill_heartbeat = [this](wire::Heartbeat::Builder h) { FillHeartbeat(h); };
    return c;
  };
  PW_ASSIGN_OR_RETURN(router_, make_client(options_.router_endpoint));
  router_->on_server_lost = [this] {
    if (!queue_.empty()) PW_LOG(WARNING) << options_.id << ": router lost; dropping " << queue_.size() << " queued prompts";
    queue_.clear();
    queued_tokens_ = 0;
  };
  if (!options_.broker_endpoint.empty()) {
    PW_ASSIGN_OR_RETURN(broker_, make_client(options_.broker_endpoint));
  }
  return Status::Ok();
}

void PrefillWorker::FillRegister(wire::Register::Builder r) {
  const auto& pool = engine_->kv_pool();
  r.setModelName(options_.model_name);
  auto kl = r.initKvLayout();
  kl.setNumBlocks(static_cast<uint32_t>(pool.num_blocks()));
  kl.setBlockTokens(static_cast<uint32_t>(pool.layout().block_size));
  kl.setBlockBytes(pool.bytes_per_block());
  kl.setLayoutHash(layout_hash_);
  r.setMaxBatch(1);
  r.setMaxContext(static_cast<uint32_t>(engine_->max_context()));
  r.setMetricsPort(metrics_ ? metrics_->port() : 0);
}

void PrefillWorker::FillHeartbeat(wire::Heartbeat::Builder h) {
  const auto& pool = engine_->kv_pool();
  h.setFreeKvBlocks(static_cast<uint32_t>(pool.num_free()));
  h.setUsedKvBlocks(static_cast<uint32_t>(pool.num_blocks() - pool.num_free()));
  h.setWaitingRequests(static_cast<uint32_t>(queue_.size()));
  h.setQueuedPromptTokens(queued_tokens_);
  h.setDraining(draining_);
}

Status PrefillWorker::HandleRouter(const proto::InMessage& m) {
  switch (m.which()) {
    case proto::Body::PREFILL_REQUEST: {
      auto req = m.body().getPrefillRequest();
      if (draining_) {
        proto::OutMessage out;
        auto kr = out.body().initKvReady();
        kr.setRequestId(req.getRequestId());
        kr.setOk(false);
        kr.setError("prefill worker " + options_.id + " is draining");
        kr.setLeaseId(req.getLeaseId());
        kr.setDecodeWorkerId(req.getDecodeWorkerId());
        return router_->Send(out);
      }
      PW_ASSIGN_OR_RETURN(auto kept, Keep(m));
      queued_tokens_ += req.getTokens().size();
      queue_.push_back(std::move(kept));
      return Status::Ok();
    }
    case proto::Body::CANCEL: {
      const uint64_t id = m.body().getCancel().getRequestId();
      for (auto it = queue_.begin(); it != queue_.end();) {
        auto req = (*it)->body().getPrefillRequest();
        if (req.getRequestId() == id) {
          queued_tokens_ -= req.getTokens().size();
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      return Status::Ok();
    }
    case proto::Body::DRAIN:
      draining_ = true;
      return Status::Ok();
    default:
      return InvalidArgument("unexpected message " + proto::BodyName(m.which()) +
                             " for a prefill worker");
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
    peers_.erase(it);  // restarted or failed peer: reconnect
  }
  Peer p;
  p.address = address;
  p.rkey = rkey;
  p.base = mem.getBaseAddr();
  p.bytes = mem.getBytes();
  PW_ASSIGN_OR_RETURN(p.ep, transport::ucx::Endpoint::Connect(*ucx_worker_, address));
  PW_ASSIGN_OR_RETURN(p.region, p.ep->OpenRegion(rkey, p.base, p.bytes));
  auto [ins, ok] = peers_.emplace(decode_id, std::move(p));
  return &ins->second;
}

Status PrefillWorker::Serve(const proto::InMessage& m, int32_t* first_token) {
  auto req = m.body().getPrefillRequest();
  const auto& pool_layout = engine_->kv_pool().layout();
  auto dl = req.getDecodeLayout();
  if (dl.getLayoutHash() != layout_hash_ || dl.getBlockTokens() != static_cast<uint32_t>(pool_layout.block_size) ||
      dl.getBlockBytes() != engine_->kv_pool().bytes_per_block()) {
    return InvalidArgument("decode worker '" + proto::ToString(req.getDecodeWorkerId()) +
                           "' has another KV layout (hash/block tokens/block bytes differ)");
  }
  std::vector<int32_t> tokens;
  for (uint32_t t : req.getTokens()) tokens.push_back(static_cast<int32_t>(t));
  if (tokens.empty()) return InvalidArgument("empty prompt");
  const int n_blocks = engine::BlocksForTokens(static_cast<int>(tokens.size()), pool_layout.block_size);
  auto dst = req.getBlockIds();
  if (dst.size() < static_cast<unsigned>(n_blocks)) {
    return InvalidArgument(std::to_string(dst.size()) + " reserved blocks for " +
                           std::to_string(tokens.size()) + " tokens (" + std::to_string(n_blocks) +
                           " needed)");
  }
  std::set<uint32_t> distinct;
  const uint64_t block_bytes = engine_->kv_pool().bytes_per_block();
  auto mem = req.getDecodeMemory();
  for (int i = 0; i < n_blocks; ++i) {
    const uint32_t b = dst[static_cast<unsigned>(i)];
    if (b >= dl.getNumBlocks() || !distinct.insert(b).second) {
      return InvalidArgument("reserved block id " + std::to_string(b) + " invalid or repeated");
    }
    if ((static_cast<uint64_t>(b) + 1) * block_bytes > mem.getBytes()) {
      return InvalidArgument("reserved block " + std::to_string(b) + " outside the decode pool");
    }
  }
  engine::SamplingParams params = FromWire(req.getSampling());
  // The sampled token is output number generatedSoFar; the engine's limit counts from here.
  const uint32_t g = req.getGeneratedSoFar();
  if (static_cast<int64_t>(g) >= params.max_tokens) return InvalidArgument("generatedSoFar >= maxTokens");
  params.max_tokens -= static_cast<int>(g);
  PW_ASSIGN_OR_RETURN(auto own, engine_->kv_pool().Allocate(n_blocks));
  auto result = engine_->Prefill(tokens, own, params);
  Status st = result.status();
  if (st.ok()) {
    *first_token = result->first_token;
    metrics_->prompt_tokens->Increment(static_cast<double>(tokens.size()));
    auto peer = PeerFor(proto::ToString(req.getDecodeWorkerId()), mem);
    st = peer.status();
    for (int i = 0; st.ok() && i < n_blocks; ++i) {
      const uint64_t off = static_cast<uint64_t>(dst[static_cast<unsigned>(i)]) * block_bytes;
      st = (*peer)->region->Put(off, engine_->kv_pool().BlockAddress(own[static_cast<size_t>(i)]),
                                block_bytes, options_.put_timeout_ms);
    }
    if (st.ok()) st = (*peer)->ep->Flush(options_.put_timeout_ms);
    if (st.ok()) metrics_->ucx_put_bytes->Increment(static_cast<double>(n_blocks * block_bytes));
    if (!st.ok()) st = st.WithContext("writing KV to '" + proto::ToString(req.getDecodeWorkerId()) + "'");
  }
  Status fst = engine_->kv_pool().Free(own);
  if (!fst.ok()) PW_LOG(ERROR) << options_.id << ": freeing own blocks: " << fst.ToString();
  return st;
}

Status PrefillWorker::Run(const std::atomic<bool>& stop, int drain_timeout_ms) {
  PW_RETURN_IF_ERROR(router_->Start());
  if (broker_) PW_RETURN_IF_ERROR(broker_->Start());
  PW_LOG(INFO) << options_.id << ": serving, router " << options_.router_endpoint;
  auto handler = [this](const std::string&, const proto::InMessage& m) -> Status {
    return HandleRouter(m);
  };
  auto broker_handler = [](const std::string&, const proto::InMessage&) -> Status {
    return Status::Ok();
  };
  uint64_t drain_deadline = 0;
  while (true) {
    if (stop.load() && !draining_) draining_ = true;
    if (draining_) {
      if (drain_deadline == 0) drain_deadline = transport::SteadyClock::Get()->NowMs() + drain_timeout_ms;
      if (queue_.empty() || transport::SteadyClock::Get()->NowMs() > drain_deadline) break;
    }
    router_->Poll(queue_.empty() ? 10 : 0, handler);
    if (broker_) broker_->Poll(0, broker_handler);
    metrics_->requests_waiting->Set(static_cast<double>(queue_.size()));
    if (queue_.empty()) continue;
    std::shared_ptr<proto::InMessage> m = std::move(queue_.front());
    queue_.pop_front();
    auto req = m->body().getPrefillRequest();
    queued_tokens_ -= req.getTokens().size();
    int32_t first = -1;
    Status st = proto::GuardWire("PrefillRequest", [&]() -> Status { return Serve(*m, &first); });
    proto::OutMessage out;
    auto kr = out.body().initKvReady();
    kr.setRequestId(req.getRequestId());
    kr.setOk(st.ok());
    if (!st.ok()) {
      kr.setError("prefill worker " + options_.id + ": " + st.message());
      PW_LOG(WARNING) << options_.id << ": request " << req.getRequestId() << ": " << st.ToString();
      metrics_->requests_finished_error->Increment();
    } else {
      kr.setFirstToken(static_cast<uint32_t>(first));
      metrics_->requests_finished_ok->Increment();
    }
    kr.setNumTokens(req.getTokens().size());
    kr.setLeaseId(req.getLeaseId());
    kr.setDecodeWorkerId(req.getDecodeWorkerId());
    Status sst = router_->Send(out);
    if (!sst.ok()) PW_LOG(WARNING) << options_.id << ": KvReady: " << sst.ToString();
  }
  router_->Poll(0, handler);
  PW_LOG(INFO) << options_.id << ": stopped";
  return Status::Ok();
}

}  // namespace pw::workers
