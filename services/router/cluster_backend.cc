#include "services/router/cluster_backend.h"

#include <algorithm>
#include <chrono>
#include <pthread.h>
#include <random>

#include "common/logging.h"
#include "policies/placement/placement.h"
#include "services/transport/zmq_transport.h"

namespace pw::router {

namespace {

// Routing id of the DEALER that wakes the backend thread.
constexpr const char* kWakePeer = "pw-router-wake";

// Passes frames through, except those from the wake-up peer: for them Recv reports "nothing
// received", which ends ControlServer::Poll so the backend thread sees its commands at once.
class WakeFilterTransport final : public transport::Transport {
 public:
  explicit WakeFilterTransport(std::unique_ptr<transport::Transport> inner)
      : inner_(std::move(inner)) {}
  Status Send(std::string_view peer, std::string_view bytes) override {
    return inner_->Send(peer, bytes);
  }
  Result<std::optional<transport::Frame>> Recv(int timeout_ms) override {
    auto r = inner_->Recv(timeout_ms);
    if (r.ok() && r->has_value() && (*r)->peer == kWakePeer) {
      return std::optional<transport::Frame>();
    }
    return r;
  }
  std::string Describe() const override { return inner_->Describe(); }
  Status Reconnect() override { return inner_->Reconnect(); }

 private:
  std::unique_ptr<transport::Transport> inner_;
};

std::vector<uint32_t> AllTokens(const GenerationRequest& req, const std::vector<int32_t>& gen) {
  std::vector<uint32_t> out;
  out.reserve(req.prompt.size() + gen.size());
  for (int32_t t : req.prompt) out.push_back(static_cast<uint32_t>(t));
  for (int32_t t : gen) out.push_back(static_cast<uint32_t>(t));
  return out;
}

void FillSampling(wire::SamplingParams::Builder b, const SamplingOptions& s) {
  b.setTemperature(s.temperature);
  b.setTopP(s.top_p);
  b.setTopK(static_cast<uint32_t>(std::max(0, s.top_k)));
  b.setSeed(s.seed);
  b.setMaxTokens(static_cast<uint32_t>(s.max_tokens));
  b.setIgnoreEos(s.ignore_eos);
  b.setLogprobs(s.logprobs);
  auto stops = b.initStopTokenIds(static_cast<unsigned>(s.stop_token_ids.size()));
  for (size_t i = 0; i < s.stop_token_ids.size(); ++i) {
    stops.set(static_cast<unsigned>(i), static_cast<uint32_t>(s.stop_token_ids[i]));
  }
}

TokenLogprob FromWire(wire::TokenLogprob::Reader r) {
  TokenLogprob t;
  t.token = static_cast<int32_t>(r.getToken());
  t.logprob = r.getLogprob();
  auto ids = r.getTopTokens();
  auto lps = r.getTopLogprobs();
  const unsigned n = std::min(ids.size(), lps.size());
  t.top.reserve(n);
  for (unsigned i = 0; i < n; ++i) t.top.emplace_back(static_cast<int32_t>(ids[i]), lps[i]);
  return t;
}

}  // namespace

Result<std::unique_ptr<ClusterBackend>> ClusterBackend::Create(ClusterBackendOptions options) {
  auto router = transport::ZmqRouterTransport::Bind(options.bind);
  if (!router.ok()) return router.status();
  std::string endpoint = (*router)->endpoint();
  auto waker = transport::ZmqDealerTransport::Connect(endpoint, kWakePeer);
  if (!waker.ok()) return waker.status();
  return Create(std::move(options), std::make_unique<WakeFilterTransport>(std::move(*router)),
                std::move(*waker), SteadyClock::Get(), std::move(endpoint));
}

std::unique_ptr<ClusterBackend> ClusterBackend::Create(
    ClusterBackendOptions options, std::unique_ptr<transport::Transport> control,
    std::unique_ptr<transport::Transport> waker, const Clock* clock,
    std::string endpoint) {
  std::unique_ptr<ClusterBackend> b(
      new ClusterBackend(std::move(options), std::move(endpoint), clock));
  transport::ControlServer::Options copts;
  copts.id = b->options_.id;
  copts.heartbeat_ms = b->options_.heartbeat_ms;
  copts.dead_after_beats = b->options_.dead_after_beats;
  b->server_ = std::make_unique<transport::ControlServer>(std::move(control), clock, copts);
  ClusterBackend* self = b.get();
  b->server_->on_register = [self](const std::string& peer, wire::Register::Reader reg,
                                   uint16_t minor) {
    std::string model = proto::ToString(reg.getModelName());
    if (!model.empty() && !self->options_.model_name.empty() &&
        model != self->options_.model_name) {
      return InvalidArgument("worker serves model '" + model + "', this router serves '" +
                             self->options_.model_name + "'");
    }
    auto role = reg.getRole();
    if (role != wire::Role::PREFILL && role != wire::Role::DECODE && role != wire::Role::CLIENT) {
      return InvalidArgument("the router takes prefill and decode workers only");
    }
    // Before anything acts on it: a refused Register leaves the router as it was.
    PW_RETURN_IF_ERROR(service::CheckRegistration(reg, self->options_.registration, minor));
    if (const transport::PeerInfo* known = self->server_->FindPeer(peer);
        known != nullptr && known->pid == reg.getPid()) {
      // The same process registering again lost this router for a while and dropped its
      // requests (a new process is reported through on_peer_dead).
      self->OnPeerLost(peer, "worker '" + peer + "' registered again");
    }
    PW_LOG(INFO) << "router: worker '" << peer << "' registered as "
                 << (role == wire::Role::PREFILL  ? "prefill"
                     : role == wire::Role::DECODE ? "decode"
                                                  : "client");
    return Status::Ok();
  };
  b->server_->on_peer_dead = [self](const std::string& peer, const transport::PeerInfo&) {
    self->OnPeerLost(peer, "worker '" + peer + "' died");
  };
  b->waker_ = std::move(waker);
  return b;
}

ClusterBackend::ClusterBackend(ClusterBackendOptions options, std::string endpoint,
                               const Clock* clock)
    : options_(std::move(options)), endpoint_(std::move(endpoint)), clock_(clock),
      beat_(options_.main_loop_stale_ms) {}

ClusterBackend::~ClusterBackend() { Stop(); }

void ClusterBackend::Start() {
  PW_CHECK(events_ != nullptr);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "pw-backend");  // named for debuggers and the /live test
    Run();
  });
}

void ClusterBackend::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    (void)waker_->Send("", "wake");
  }
  thread_.join();
}

uint64_t ClusterBackend::NowMs() const { return clock_->NowMs(); }

Status ClusterBackend::Submit(GenerationRequest request) {
  if (request.prompt.empty()) return InvalidArgument("empty prompt");
  if (!request.sampling.has_seed) {
    // One seed for the whole life of the request, so a re-placement samples from the same seed.
    static thread_local std::mt19937_64 rng(std::random_device{}());
    request.sampling.seed = rng();
    request.sampling.has_seed = true;
  }
  std::lock_guard<std::mutex> lock(cmd_mu_);
  commands_.push_back({Command::kSubmit, std::move(request), 0});
  if (!wake_pending_) {
    wake_pending_ = true;
    (void)waker_->Send("", "wake");
  }
  return Status::Ok();
}

void ClusterBackend::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(cmd_mu_);
  commands_.push_back({Command::kCancel, {}, id});
  if (!wake_pending_) {
    wake_pending_ = true;
    (void)waker_->Send("", "wake");
  }
}

BackendLoad ClusterBackend::Load() const {
  std::lock_guard<std::mutex> lock(load_mu_);
  return load_;
}

void ClusterBackend::Run() {
  while (!stop_.load()) RunOnce(100);
  // Free what the workers hold for requests still in flight.
  for (auto& [id, r] : reqs_) {
    if (!r.decode_peer.empty()) SendCancel(r.decode_peer, id, r.lease_id);
    if (r.phase == Phase::kPrefilling) SendCancel(r.prefill_peer, id, r.lease_id);
  }
  reqs_.clear();
}

void ClusterBackend::RunOnce(int max_poll_ms) {
  beat_.Beat();
  DrainCommands();
  CheckPhaseTimeouts();
  CheckFences();
  RenewLeases();
  DispatchPending();
  StartReady();
  PublishLoad();
  // Pending requests waiting for a backoff or capacity: look again soon.
  bool pending = false;
  for (const auto& [id, r] : reqs_) pending |= r.phase == Phase::kPending;
  server_->Poll(
      pending ? std::min(max_poll_ms, 10) : max_poll_ms,
      [this](const std::string& peer, const proto::InMessage& msg) { return Handle(peer, msg); });
}

void ClusterBackend::DrainCommands() {
  std::vector<Command> cmds;
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    cmds.swap(commands_);
    wake_pending_ = false;
  }
  for (auto& c : cmds) {
    if (c.kind == Command::kSubmit) {
      uint64_t id = c.request.id;
      Req r;
      r.request = std::move(c.request);
      reqs_[id] = std::move(r);
    } else {
      auto it = reqs_.find(c.id);
      if (it == reqs_.end()) continue;
      Req& r = it->second;
      ReleasePlacement(c.id, r);
      reqs_.erase(it);
    }
  }
}

const ClusterBackend::WorkerStatic* ClusterBackend::StaticOf(const transport::PeerInfo& info) {
  auto it = statics_.find(info.id);
  if (it != statics_.end() && it->second.pid == info.pid) return &it->second;
  if (!info.registration) return nullptr;
  WorkerStatic ws;
  Status st = proto::GuardWire("registration of '" + info.id + "'", [&]() -> Status {
    auto reg = info.registration->body().getRegister();
    ws.pid = reg.getPid();
    ws.role = reg.getRole();
    ws.max_batch = reg.getMaxBatch();
    auto layout = reg.getKvLayout();
    ws.layout_hash = layout.getLayoutHash();
    ws.block_tokens = layout.getBlockTokens();
    ws.num_blocks = layout.getNumBlocks();
    ws.block_bytes = layout.getBlockBytes();
    ws.page_bytes = layout.getPageBytes();
    ws.layer_bytes = layout.getLayerBytes();
    ws.num_layers = layout.getNumLayers();
    ws.pages_per_block = layout.getPagesPerBlock();
    auto mem = reg.getKvMemory();
    ws.worker_address = proto::ToBytes(mem.getWorkerAddress());
    ws.rkey = proto::ToBytes(mem.getRkey());
    ws.base_addr = mem.getBaseAddr();
    ws.region_bytes = mem.getBytes();
    ws.node = reg.getNodeName();
    return Status::Ok();
  });
  if (!st.ok()) {
    PW_LOG(WARNING) << "router: " << st.ToString();
    return nullptr;
  }
  if (ws.max_batch == 0) ws.max_batch = options_.default_max_batch;
  return &(statics_[info.id] = ws);
}

void ClusterBackend::DispatchPending() {
  const uint64_t now = NowMs();
  for (auto& [id, r] : reqs_) {
    if (r.phase != Phase::kPending || r.not_before_ms > now) continue;
    if (!Place(id, r)) break;  // no capacity now; keep FIFO order
  }
}

bool ClusterBackend::Place(uint64_t id, Req& r) {
  const int64_t n_tokens = static_cast<int64_t>(r.request.prompt.size() + r.generated.size());
  // Our requests per decode worker; blocks of those placed too recently for the worker's last
  // heartbeat to show them; prompt tokens being prefilled per prefill worker.
  const uint64_t now = NowMs();
  std::map<std::string, int64_t> assigned, recent_blocks, prefilling_tokens;
  for (const auto& [oid, o] : reqs_) {
    if (o.phase == Phase::kPending) continue;
    ++assigned[o.decode_peer];
    int64_t toks = static_cast<int64_t>(o.request.prompt.size() + o.generated.size());
    if (now - o.placed_at_ms < 2 * options_.heartbeat_ms) {
      auto ws = statics_.find(o.decode_peer);
      int64_t bt = ws != statics_.end() && ws->second.block_tokens ? ws->second.block_tokens : 16;
      recent_blocks[o.decode_peer] += toks / bt + 1;
    }
    if (o.phase == Phase::kPrefilling) prefilling_tokens[o.prefill_peer] += toks;
  }
  // The prefill worker another request of this one's group (same prompt) went to: it computes
  // the prompt once for all of them when they meet there (docs/router.md, n and best_of).
  std::string group_peer;
  if (r.request.share_group != 0 && r.generated.empty()) {
    for (const auto& [oid, o] : reqs_) {
      if (oid != id && o.phase != Phase::kPending && o.generated.empty() &&
          o.request.share_group == r.request.share_group) {
        group_peer = o.prefill_peer;
        break;
      }
    }
  }
  // Workers this request already failed on rank after all others.
  auto failed_before = [&](const std::string& peer) {
    return std::find(r.failed_on.begin(), r.failed_on.end(), peer) != r.failed_on.end();
  };
  std::vector<placement::DecodeCandidate> decode;
  std::vector<placement::PrefillCandidate> prefill;
  std::vector<const transport::PeerInfo*> decode_info, prefill_info;
  for (const auto& [peer, info] : server_->peers()) {
    if (info.role != wire::Role::DECODE && info.role != wire::Role::PREFILL) continue;
    const WorkerStatic* ws = StaticOf(info);
    if (ws == nullptr) continue;
    if (info.role == wire::Role::DECODE) {
      placement::DecodeCandidate c;
      c.id = peer;
      c.draining = info.load.draining;
      c.reachable = Reachable(info);
      c.failed_before = failed_before(peer);
      c.assigned = assigned[peer];
      c.max_assigned = static_cast<int64_t>(ws->max_batch) + AheadOf(*ws);
      // Until its first heartbeat a decode worker's load is unknown, not zero: it is ranked by
      // its registered pool (nothing runs on it yet), so a burst right after it registers is
      // spread over it too instead of going to the workers heard from.
      c.free_kv_blocks = info.heartbeats == 0 ? static_cast<int64_t>(ws->num_blocks)
                                              : static_cast<int64_t>(info.load.free_kv_blocks);
      c.recent_blocks = recent_blocks[peer];
      c.layout_hash = ws->layout_hash;
      c.node = ws->node;
      decode.push_back(std::move(c));
      decode_info.push_back(&info);
    } else {
      placement::PrefillCandidate c;
      c.id = peer;
      c.draining = info.load.draining;
      c.reachable = Reachable(info);
      c.failed_before = failed_before(peer);
      c.group_peer = !group_peer.empty() && peer == group_peer;
      c.queued_tokens = static_cast<int64_t>(info.load.queued_prompt_tokens) + prefilling_tokens[peer];
      c.layout_hash = ws->layout_hash;
      c.node = ws->node;
      prefill.push_back(std::move(c));
      prefill_info.push_back(&info);
    }
  }
  const std::optional<placement::Choice> choice = placement::Place(decode, prefill);
  if (!choice) return false;
  const transport::PeerInfo* best_d = decode_info[choice->decode];
  const transport::PeerInfo* best_p = prefill_info[choice->prefill];

  proto::OutMessage m;
  auto kr = m.body().initKvReserve();
  kr.setRequestId(id);
  kr.setNumTokens(static_cast<uint32_t>(n_tokens));
  kr.setLeaseMs(options_.lease_ms);
  kr.setMaxTokens(static_cast<uint32_t>(
      std::max<int64_t>(0, int64_t{r.request.sampling.max_tokens} - static_cast<int64_t>(r.generated.size()))));
  uint64_t reserve_seq = 0;
  Status st = server_->Send(best_d->id, m, &reserve_seq);
  if (!st.ok()) {
    PW_LOG(WARNING) << "router: KvReserve to '" << best_d->id << "': " << st.ToString();
    MarkUnreachable(best_d->id);
    return true;  // placed again at the next pass, on another worker or once this one is back
  }
  r.phase = Phase::kReserving;
  r.placed_at_ms = NowMs();
  r.reserve_seq = reserve_seq;
  r.phase_deadline_ms = r.placed_at_ms + options_.phase_timeout_ms;
  r.decode_peer = best_d->id;
  r.decode_pid = best_d->pid;
  r.prefill_peer = best_p->id;
  r.lease_id = 0;
  r.block_ids.clear();
  r.page_ids.clear();
  ++r.attempts;
  return true;
}

Status ClusterBackend::Handle(const std::string& peer, const proto::InMessage& msg) {
  auto body = msg.body();
  switch (msg.which()) {
    case proto::Body::KV_RESERVE_REPLY:
      OnReserveReply(peer, body.getKvReserveReply(), msg.envelope().getAckSeq());
      break;
    case proto::Body::KV_READY:
      OnKvReady(peer, body.getKvReady());
      break;
    case proto::Body::TOKEN_CHUNK:
      OnTokenChunk(peer, body.getTokenChunk());
      break;
    case proto::Body::FINISH:
      OnFinish(peer, body.getFinish());
      break;
    case proto::Body::TELEMETRY:
      break;  // per-worker metrics are scraped from the workers themselves
    default:
      return InvalidArgument("the router does not take '" + proto::BodyName(msg.which()) + "'");
  }
  return Status::Ok();
}

void ClusterBackend::OnReserveReply(const std::string& peer, wire::KvReserveReply::Reader m,
                                   uint64_t ack_seq) {
  const uint64_t id = m.getRequestId();
  auto it = reqs_.find(id);
  // A reply sent before the worker had handled the current placement's KvReserve answers an
  // earlier placement of the request on the same worker (given up while its reply was on the
  // way; the worker has since quarantined that lease on our Cancel). ackSeq 0: not known.
  if (it == reqs_.end() || it->second.phase != Phase::kReserving ||
      it->second.decode_peer != peer || (ack_seq != 0 && ack_seq < it->second.reserve_seq)) {
    // Late reply for a request cancelled or moved: give the lease back (no prefill worker
    // ever had it).
    if (m.getOk()) SendCancel(peer, id, m.getLeaseId(), /*writer_done=*/true);
    return;
  }
  Req& r = it->second;
  if (!m.getOk()) {
    // Most often: not enough free KV right now. Wait and place again (not counted).
    PW_LOG(DEBUG) << "router: KV reservation for " << id << " refused by '" << peer
                  << "': " << proto::ToString(m.getError());
    r.phase = Phase::kPending;
    r.decode_peer.clear();
    r.prefill_peer.clear();
    --r.attempts;
    r.not_before_ms = NowMs() + 50;
    return;
  }
  r.lease_id = m.getLeaseId();
  r.block_ids = proto::ToVector<uint32_t>(m.getBlockIds());
  r.page_ids = proto::ToVector<uint32_t>(m.getPageIds());
  const transport::PeerInfo* d = server_->FindPeer(peer);
  const transport::PeerInfo* p = server_->FindPeer(r.prefill_peer);
  const WorkerStatic* ds = d ? StaticOf(*d) : nullptr;
  if (ds == nullptr || p == nullptr) {
    SendCancel(peer, id, r.lease_id, /*writer_done=*/true);  // not handed to a prefill worker
    Retry(id, r, "a worker left during placement");
    return;
  }
  proto::OutMessage out;
  auto pr = out.body().initPrefillRequest();
  pr.setRequestId(id);
  // The prompt only, also when the request is placed again with tokens already streamed: the
  // decode worker computes their KV itself (StartDecode.uncachedTokens), with its own experts,
  // as the worker that generated them had.
  auto tokens = AllTokens(r.request, {});
  proto::FillU32([&](unsigned n) { return pr.initTokens(n); }, tokens);
  FillSampling(pr.initSampling(), r.request.sampling);
  pr.setDecodeWorkerId(peer);
  auto mem = pr.initDecodeMemory();
  mem.setWorkerAddress(proto::AsData(ds->worker_address));
  mem.setRkey(proto::AsData(ds->rkey));
  mem.setBaseAddr(ds->base_addr);
  mem.setBytes(ds->region_bytes);
  auto layout = pr.initDecodeLayout();
  layout.setNumBlocks(ds->num_blocks);
  layout.setBlockTokens(ds->block_tokens);
  layout.setBlockBytes(ds->block_bytes);
  layout.setLayoutHash(ds->layout_hash);
  layout.setPageBytes(ds->page_bytes);
  layout.setLayerBytes(ds->layer_bytes);
  layout.setNumLayers(ds->num_layers);
  layout.setPagesPerBlock(ds->pages_per_block);
  proto::FillU32([&](unsigned n) { return pr.initBlockIds(n); }, r.block_ids);
  proto::FillU32([&](unsigned n) { return pr.initPageIds(n); }, r.page_ids);
  pr.setLeaseId(r.lease_id);
  // Prompt log-probabilities are asked for until they were delivered (with the first token).
  if (r.generated.empty()) pr.setPromptLogprobs(r.request.sampling.prompt_logprobs);
  r.prefill_epoch = p->epoch;
  Status st = server_->Send(r.prefill_peer, out);
  if (!st.ok()) {
    SendCancel(peer, id, r.lease_id, /*writer_done=*/true);  // the request never left
    MarkUnreachable(r.prefill_peer);
    Retry(id, r, "PrefillRequest to '" + r.prefill_peer + "': " + st.ToString(),
          /*counted=*/false);
    return;
  }
  r.phase = Phase::kPrefilling;
  r.phase_deadline_ms = NowMs() + options_.phase_timeout_ms;
}

void ClusterBackend::OnKvReady(const std::string& peer, wire::KvReady::Reader m) {
  const uint64_t id = m.getRequestId();
  auto it = reqs_.find(id);
  if (it == reqs_.end() || it->second.phase != Phase::kPrefilling ||
      it->second.prefill_peer != peer || it->second.lease_id != m.getLeaseId()) {
    // Stale: the request was cancelled or placed again. Not started; but its writer is done.
    WriterDone(proto::ToString(m.getDecodeWorkerId()), id, m.getLeaseId());
    return;
  }
  Req& r = it->second;
  if (!m.getOk()) {
    SendCancel(r.decode_peer, id, r.lease_id, /*writer_done=*/true);
    if (m.getErrorKind() == wire::ErrorKind::INVALID_REQUEST) {
      // The request's own values: not the worker's failure, and no other worker would differ.
      Finish(id, FinishReason::kError, InvalidArgument(proto::ToString(m.getError())),
             proto::ToString(m.getErrorParam()));
      return;
    }
    Retry(id, r, "prefill on '" + peer + "' failed: " + proto::ToString(m.getError()));
    return;
  }
  r.prompt_routing.clear();
  for (uint32_t c : m.getPromptRouting()) r.prompt_routing.push_back(c);
  // Placed again with tokens already streamed: the first token sampled now was streamed at
  // the first placement; StartDecode hands the decode worker what was streamed.
  if (r.generated.empty() && !DeliverFirstToken(id, r, peer, m)) return;
  // The decode batch is full: the first token has streamed; StartDecode once a slot frees.
  auto ws = statics_.find(r.decode_peer);
  if (ws != statics_.end() && DecodingOn(r.decode_peer) >= ws->second.max_batch) {
    r.phase = Phase::kReady;
    return;
  }
  StartDecode(id, r);
}

bool ClusterBackend::DeliverFirstToken(uint64_t id, Req& r, const std::string& peer,
                                       wire::KvReady::Reader m) {
  const int32_t first = static_cast<int32_t>(m.getFirstToken());
  if (r.request.sampling.prompt_logprobs >= 0) {
    // Counted before anything is built: a list of empty structs costs its sender no bytes per
    // entry, and this side 40.
    auto wire_lps = m.getPromptLogprobs();
    if (wire_lps.size() + size_t{1} != r.request.prompt.size()) {
      SendCancel(r.decode_peer, id, r.lease_id, /*writer_done=*/true);
      Retry(id, r,
            "prefill on '" + peer + "' sent " + std::to_string(wire_lps.size()) +
                " prompt log-probabilities for " + std::to_string(r.request.prompt.size()) +
                " prompt tokens");
      return false;
    }
    for (auto lp : wire_lps) {
      if (lp.getTopTokens().size() > unsigned(r.request.sampling.prompt_logprobs)) {
        SendCancel(r.decode_peer, id, r.lease_id, /*writer_done=*/true);
        Retry(id, r, "prefill on '" + peer + "' sent more prompt log-probability alternatives " +
                         "than the " + std::to_string(r.request.sampling.prompt_logprobs) +
                         " asked for");
        return false;
      }
    }
    std::vector<TokenLogprob> prompt_lps;
    prompt_lps.reserve(wire_lps.size());
    for (auto lp : wire_lps) prompt_lps.push_back(FromWire(lp));
    events_->OnPromptLogprobs(id, std::move(prompt_lps));
  }
  r.generated.push_back(first);
  std::vector<TokenLogprob> first_lp;
  if (r.request.sampling.logprobs >= 0) {
    if (m.getFirstLogprob().getTopTokens().size() > unsigned(r.request.sampling.logprobs)) {
      r.generated.pop_back();
      SendCancel(r.decode_peer, id, r.lease_id, /*writer_done=*/true);
      Retry(id, r, "prefill on '" + peer + "' sent more log-probability alternatives than the " +
                       std::to_string(r.request.sampling.logprobs) + " asked for");
      return false;
    }
    first_lp.push_back(FromWire(m.getFirstLogprob()));
    first_lp.back().token = first;
  }
  events_->OnTokens(id, 0, {first}, std::move(first_lp));
  const auto& stops = r.request.sampling.stop_token_ids;
  const bool is_stop = std::find(stops.begin(), stops.end(), first) != stops.end();
  const bool at_length = static_cast<int32_t>(r.generated.size()) >= r.request.sampling.max_tokens;
  if (is_stop || at_length) {
    // The reserved blocks are not needed, and their writer is done.
    SendCancel(r.decode_peer, id, r.lease_id, /*writer_done=*/true);
    Finish(id, is_stop ? FinishReason::kStop : FinishReason::kLength, Status::Ok());
    return false;
  }
  return true;
}

int64_t ClusterBackend::AheadOf(const WorkerStatic& ws) const {
  return options_.prefill_ahead >= 0 ? options_.prefill_ahead : ws.max_batch / 4;
}

int64_t ClusterBackend::DecodingOn(const std::string& peer) const {
  int64_t n = 0;
  for (const auto& [id, r] : reqs_) n += r.phase == Phase::kDecoding && r.decode_peer == peer;
  return n;
}

void ClusterBackend::StartReady() {
  std::map<std::string, int64_t> decoding;
  bool any = false;
  for (const auto& [id, r] : reqs_) {
    if (r.phase == Phase::kDecoding) ++decoding[r.decode_peer];
    any |= r.phase == Phase::kReady;
  }
  if (!any) return;
  std::vector<uint64_t> start;
  for (auto& [id, r] : reqs_) {  // ids grow with submission: oldest first
    if (r.phase != Phase::kReady) continue;
    auto ws = statics_.find(r.decode_peer);
    if (ws == statics_.end() || decoding[r.decode_peer] >= ws->second.max_batch) continue;
    ++decoding[r.decode_peer];
    start.push_back(id);
  }
  for (uint64_t id : start) StartDecode(id, reqs_[id]);
}

void ClusterBackend::StartDecode(uint64_t id, Req& r) {
  proto::OutMessage out;
  auto sd = out.body().initStartDecode();
  sd.setRequestId(id);
  sd.setLeaseId(r.lease_id);
  std::vector<uint32_t> tokens = AllTokens(r.request, r.generated);
  tokens.pop_back();  // the KV holds everything before the first new token
  proto::FillU32([&](unsigned n) { return sd.initTokens(n); }, tokens);
  sd.setFirstToken(static_cast<uint32_t>(r.generated.back()));
  FillSampling(sd.initSampling(), r.request.sampling);
  sd.setGeneratedSoFar(static_cast<uint32_t>(r.generated.size()));
  // The prefill worker wrote the prompt's KV only (OnReserveReply).
  sd.setUncachedTokens(static_cast<uint32_t>(r.generated.size() - 1));
  if (!r.prompt_routing.empty()) {
    proto::FillU32([&](unsigned n) { return sd.initPromptRouting(n); }, r.prompt_routing);
  }
  Status st = server_->Send(r.decode_peer, out);
  if (!st.ok()) {
    SendCancel(r.decode_peer, id, r.lease_id, /*writer_done=*/true);
    MarkUnreachable(r.decode_peer);
    Retry(id, r, "StartDecode to '" + r.decode_peer + "': " + st.ToString(),
          /*counted=*/false);
    return;
  }
  r.phase = Phase::kDecoding;
}

void ClusterBackend::OnTokenChunk(const std::string& peer, wire::TokenChunk::Reader m) {
  const uint64_t id = m.getRequestId();
  auto it = reqs_.find(id);
  if (it == reqs_.end() || it->second.phase != Phase::kDecoding || it->second.decode_peer != peer) {
    return;
  }
  Req& r = it->second;
  const uint32_t start = m.getStartIndex();
  auto tokens = m.getTokens();
  PW_LOG(DEBUG) << "router: trace: request " << id << " token " << start << " received";
  if (start > r.generated.size()) {
    Retry(id, r,
          "token gap from '" + peer + "': expected index " + std::to_string(r.generated.size()) +
              ", got " + std::to_string(start));
    return;
  }
  auto lps = m.getLogprobs();
  const bool want_lps = r.request.sampling.logprobs >= 0;
  if (want_lps && lps.size() != tokens.size()) {
    Retry(id, r,
          "TokenChunk from '" + peer + "' without the log-probabilities the request asked for");
    return;
  }
  if (want_lps) {
    for (auto lp : lps) {
      if (lp.getTopTokens().size() > unsigned(r.request.sampling.logprobs)) {
        SendCancel(peer, id, r.lease_id, /*writer_done=*/false);
        Retry(id, r, "TokenChunk from '" + peer + "' with more log-probability alternatives " +
                         "than the " + std::to_string(r.request.sampling.logprobs) + " asked for");
        return;
      }
    }
  }
  // A worker never sends past max_tokens (it ends the request there); tokens beyond it are
  // not the client's: the request ends at max_tokens and the worker is told to stop.
  const size_t max_tokens = static_cast<size_t>(std::max(r.request.sampling.max_tokens, 0));
  std::vector<int32_t> fresh;
  std::vector<TokenLogprob> fresh_lps;
  for (unsigned i = 0; i < tokens.size() && r.generated.size() < max_tokens; ++i) {
    if (start + i < r.generated.size()) continue;  // already delivered
    fresh.push_back(static_cast<int32_t>(tokens[i]));
    r.generated.push_back(static_cast<int32_t>(tokens[i]));
    if (want_lps) {
      fresh_lps.push_back(FromWire(lps[i]));
      fresh_lps.back().token = fresh.back();
    }
  }
  if (!fresh.empty()) {
    const auto first_index = static_cast<uint32_t>(r.generated.size() - fresh.size());
    events_->OnTokens(id, first_index, std::move(fresh), std::move(fresh_lps));
  }
  if (r.generated.size() >= max_tokens && start + tokens.size() > max_tokens) {
    PW_LOG(WARNING) << "router: '" << peer << "' sent request " << id << " tokens past its "
                    << max_tokens << " max_tokens; ended there";
    SendCancel(peer, id, r.lease_id, /*writer_done=*/false);
    Finish(id, FinishReason::kLength, Status::Ok());
  }
}

void ClusterBackend::OnFinish(const std::string& peer, wire::Finish::Reader m) {
  const uint64_t id = m.getRequestId();
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return;
  Req& r = it->second;
  // While a reservation is in progress the only valid answer is KvReserveReply: a Finish then is
  // the echo of a Cancel this router sent for an earlier placement on the same worker.
  const bool from_current = (r.phase == Phase::kDecoding && r.decode_peer == peer) ||
                            (r.phase == Phase::kPrefilling && r.prefill_peer == peer);
  if (!from_current) return;
  switch (m.getReason()) {
    case wire::FinishReason::STOP:
      Finish(id, FinishReason::kStop, Status::Ok());
      break;
    case wire::FinishReason::LENGTH:
      Finish(id, FinishReason::kLength, Status::Ok());
      break;
    case wire::FinishReason::CANCELLED:
      // The worker gave the request up (drain, preemption it could not recompute): move it.
      if (r.phase == Phase::kPrefilling) ReleasePlacement(id, r);
      Retry(id, r, "cancelled by '" + peer + "': " + proto::ToString(m.getError()));
      break;
    case wire::FinishReason::ERROR:
    default:
      if (r.phase == Phase::kPrefilling) ReleasePlacement(id, r);
      if (m.getReason() == wire::FinishReason::ERROR &&
          m.getErrorKind() == wire::ErrorKind::INVALID_REQUEST) {
        // The request's own values: not the worker's failure, and no other worker would differ.
        Finish(id, FinishReason::kError, InvalidArgument(proto::ToString(m.getError())),
               proto::ToString(m.getErrorParam()));
        break;
      }
      Retry(id, r, "error on '" + peer + "': " + proto::ToString(m.getError()));
      break;
  }
}

void ClusterBackend::CheckPhaseTimeouts() {
  const uint64_t now = NowMs();
  std::vector<uint64_t> late;
  for (auto& [id, r] : reqs_) {
    if ((r.phase == Phase::kReserving || r.phase == Phase::kPrefilling) &&
        now >= r.phase_deadline_ms) {
      late.push_back(id);
    }
  }
  for (uint64_t id : late) {
    Req& r = reqs_[id];
    const bool prefilling = r.phase == Phase::kPrefilling;
    std::string who = prefilling ? r.prefill_peer : r.decode_peer;
    ReleasePlacement(id, r);
    Retry(id, r,
          std::string(prefilling ? "no KvReady" : "no KvReserveReply") + " from '" + who +
              "' within " + std::to_string(options_.phase_timeout_ms) + " ms");
  }
}

void ClusterBackend::RenewLeases() {
  const uint64_t now = NowMs();
  const uint64_t every = std::max<uint64_t>(options_.lease_ms / 3, 1);
  if (now < last_renew_ms_ + every) return;
  last_renew_ms_ = now;
  // Leases whose requests are on their way: queued behind other prompts at the prefill worker,
  // or prefilled and waiting for a decode slot. Their time is the queue's, not a lost message's.
  std::map<std::string, std::pair<std::vector<uint64_t>, std::vector<uint64_t>>> by_peer;
  for (const auto& [id, r] : reqs_) {
    if (r.lease_id == 0 || (r.phase != Phase::kPrefilling && r.phase != Phase::kReady)) continue;
    auto& [requests, leases] = by_peer[r.decode_peer];
    requests.push_back(id);
    leases.push_back(r.lease_id);
  }
  for (const auto& [peer, ids] : by_peer) {
    proto::OutMessage m;
    auto kr = m.body().initKvRenew();
    kr.setLeaseMs(options_.lease_ms);
    auto req = kr.initRequestIds(static_cast<unsigned>(ids.first.size()));
    auto lease = kr.initLeaseIds(static_cast<unsigned>(ids.second.size()));
    for (size_t i = 0; i < ids.first.size(); ++i) {
      req.set(static_cast<unsigned>(i), ids.first[i]);
      lease.set(static_cast<unsigned>(i), ids.second[i]);
    }
    Status st = server_->Send(peer, m);
    if (!st.ok()) PW_LOG(DEBUG) << "router: KvRenew to '" << peer << "': " << st.ToString();
  }
}

void ClusterBackend::OnPeerLost(const std::string& peer, const std::string& why) {
  statics_.erase(peer);
  unreachable_.erase(peer);
  std::vector<uint64_t> hit;
  for (auto& [id, r] : reqs_) {
    if (r.phase == Phase::kPending) continue;
    if (r.decode_peer == peer || (r.phase == Phase::kPrefilling && r.prefill_peer == peer) ||
        (r.phase == Phase::kReserving && r.prefill_peer == peer)) {
      hit.push_back(id);
    }
  }
  if (!hit.empty()) {
    PW_LOG(WARNING) << "router: " << why << "; placing its " << hit.size() << " requests again";
  }
  for (uint64_t id : hit) {
    Req& r = reqs_[id];
    // Free what the other side holds for it; a lease the lost prefill worker may still be
    // writing stays fenced until that worker is done or gone for writer_grace_ms.
    ReleasePlacement(id, r);
    Retry(id, r, why);
  }
}

void ClusterBackend::ReleasePlacement(uint64_t id, Req& r) {
  if (r.phase == Phase::kPrefilling) {
    Fence f;
    f.decode_peer = r.decode_peer;
    f.decode_pid = r.decode_pid;
    f.request_id = id;
    f.lease_id = r.lease_id;
    f.prefill_peer = r.prefill_peer;
    f.prefill_epoch = r.prefill_epoch;
    SendCancel(r.prefill_peer, id, r.lease_id, false, &f.cancel_seq);
    SendCancel(r.decode_peer, id, r.lease_id);  // quarantined there until WriterDone
    if (f.lease_id != 0) fences_.push_back(std::move(f));
    return;
  }
  if (r.decode_peer.empty()) return;
  // Reserving: no prefill worker has the lease (a reply still on its way is answered in
  // OnReserveReply). Decoding: the lease became a running sequence.
  // Ready: the prefill worker is done with the lease (its KvReady came).
  SendCancel(r.decode_peer, id, r.lease_id,
             /*writer_done=*/(r.phase == Phase::kReserving && r.lease_id != 0) ||
                 r.phase == Phase::kReady);
}

void ClusterBackend::WriterDone(const std::string& decode_peer, uint64_t id, uint64_t lease_id) {
  for (auto it = fences_.begin(); it != fences_.end(); ++it) {
    if (it->decode_peer == decode_peer && it->request_id == id && it->lease_id == lease_id) {
      Fence f = std::move(*it);
      fences_.erase(it);
      ReleaseFence(f);
      return;
    }
  }
}

void ClusterBackend::ReleaseFence(const Fence& f) {
  // A decode process that restarted under the same id numbers its leases anew: it never had
  // this lease, and the same number may now name a live one.
  const transport::PeerInfo* d = server_->FindPeer(f.decode_peer);
  if (d == nullptr || d->pid != f.decode_pid) return;
  SendCancel(f.decode_peer, f.request_id, f.lease_id, /*writer_done=*/true);
}

void ClusterBackend::CheckFences() {
  if (fences_.empty()) return;
  const uint64_t now = NowMs();
  std::vector<Fence> done;
  for (auto it = fences_.begin(); it != fences_.end();) {
    Fence& f = *it;
    const transport::PeerInfo* p = server_->FindPeer(f.prefill_peer);
    bool writer_done = false;
    if (p == nullptr) {
      // Declared dead (or never reachable): a slow process drops its work once it notices
      // this router's silence; a dead one writes nothing. Wait out the longest write.
      if (f.gone_since_ms == 0) f.gone_since_ms = now;
      writer_done = now - f.gone_since_ms >= options_.writer_grace_ms;
    } else if (p->epoch != f.prefill_epoch || (f.cancel_seq != 0 && p->acked_seq >= f.cancel_seq)) {
      // It handled our Cancel, or registered again (having cancelled all it had): a transfer
      // already posted may still land for a short, bounded time.
      if (f.stopped_since_ms == 0) f.stopped_since_ms = now;
      writer_done = now - f.stopped_since_ms >= options_.cancel_grace_ms;
    }
    if (writer_done) {
      done.push_back(std::move(f));
      it = fences_.erase(it);
    } else {
      ++it;
    }
  }
  for (const Fence& f : done) ReleaseFence(f);
}

void ClusterBackend::MarkUnreachable(const std::string& peer) {
  const transport::PeerInfo* info = server_->FindPeer(peer);
  if (info == nullptr) return;
  if (unreachable_.count(peer) == 0) {
    PW_LOG(WARNING) << "router: worker '" << peer
                    << "' cannot be reached; placing nothing there until it is heard from";
  }
  unreachable_[peer] = {info->epoch, info->heartbeats};
}

bool ClusterBackend::Reachable(const transport::PeerInfo& info) {
  auto it = unreachable_.find(info.id);
  if (it == unreachable_.end()) return true;
  if (it->second.epoch == info.epoch && it->second.heartbeats == info.heartbeats) return false;
  unreachable_.erase(it);  // heard from since (or registered again)
  return true;
}

void ClusterBackend::Retry(uint64_t id, Req& r, const std::string& why, bool counted) {
  if (!counted) --r.attempts;  // Place counted it; the worker never got it
  if (r.attempts >= options_.max_attempts) {
    PW_LOG(WARNING) << "router: request " << id << " failed after " << r.attempts
                    << " placements: " << why;
    Finish(id, FinishReason::kError,
           Unavailable(why + " (after " + std::to_string(r.attempts) + " placements)"));
    return;
  }
  // Remember where it failed, so the next placement prefers other workers.
  for (const std::string* p : {&r.decode_peer, &r.prefill_peer}) {
    if (!p->empty() && std::find(r.failed_on.begin(), r.failed_on.end(), *p) == r.failed_on.end()) {
      r.failed_on.push_back(*p);
    }
  }
  PW_LOG(INFO) << "router: request " << id << " placed again (" << why << "), "
               << r.generated.size() << " tokens already streamed";
  r.phase = Phase::kPending;
  r.decode_peer.clear();
  r.prefill_peer.clear();
  r.lease_id = 0;
  r.block_ids.clear();
  r.page_ids.clear();
  r.not_before_ms = 0;
  ++replaced_;
}

void ClusterBackend::SendCancel(const std::string& peer, uint64_t id, uint64_t lease_id,
                                bool writer_done, uint64_t* seq_out) {
  if (seq_out) *seq_out = 0;
  if (peer.empty() || server_->FindPeer(peer) == nullptr) return;
  proto::OutMessage m;
  auto c = m.body().initCancel();
  c.setRequestId(id);
  c.setLeaseId(lease_id);
  c.setWriterDone(writer_done);
  Status st = server_->Send(peer, m, seq_out);
  if (!st.ok()) PW_LOG(DEBUG) << "router: Cancel to '" << peer << "': " << st.ToString();
}

void ClusterBackend::Finish(uint64_t id, FinishReason reason, Status error, std::string param) {
  reqs_.erase(id);
  events_->OnFinished(id, reason, std::move(error), std::move(param));
}

void ClusterBackend::PublishLoad() {
  BackendLoad l;
  bool have_prefill = false;
  for (const auto& [peer, info] : server_->peers()) {
    if (info.load.draining || !Reachable(info)) continue;
    if (info.role == wire::Role::DECODE) {
      const WorkerStatic* ws = StaticOf(info);
      ++l.decode_workers;
      l.capacity += ws ? static_cast<int32_t>(ws->max_batch + AheadOf(*ws)) : 0;
      l.free_kv_blocks += info.load.free_kv_blocks;
      l.used_kv_blocks += info.load.used_kv_blocks;
      if (ws != nullptr && ws->block_tokens != 0) {
        l.kv_block_tokens = l.kv_block_tokens == 0 ? static_cast<int32_t>(ws->block_tokens)
                                                   : std::min<int32_t>(l.kv_block_tokens, ws->block_tokens);
        l.kv_capacity_pending |= info.heartbeats == 0;
        l.kv_capacity_blocks += info.load.kv_capacity_blocks;
        l.kv_capacity_max_blocks = std::max<int64_t>(l.kv_capacity_max_blocks, info.load.kv_capacity_blocks);
      }
    } else if (info.role == wire::Role::PREFILL) {
      ++l.prefill_workers;
      have_prefill = true;
    }
  }
  if (!have_prefill) l.capacity = 0;
  l.requests_replaced = replaced_;
  std::lock_guard<std::mutex> lock(load_mu_);
  load_ = l;
}

}  // namespace pw::router
