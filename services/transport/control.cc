#include "services/transport/control.h"

#include <unistd.h>

#include <algorithm>
#include <random>

#include "common/logging.h"
#include "common/peer_id.h"

namespace pw::transport {

namespace {

uint64_t RandomInstance() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v == 0 ? 1 : v;
}

// Validates a frame; logs and counts a refusal. Returns null when dropped.
// `from`: the sender's routing id, the peer's own choice until it registers (logged through
// LogSafe).
std::shared_ptr<proto::InMessage> ParseOrDrop(const Frame& frame, const std::string& from,
                                              ControlCounters* counters) {
  auto parsed = proto::InMessage::Parse(frame.bytes);
  if (!parsed.ok()) {
    if (parsed.status().code() == StatusCode::kUnsupported) {
      ++counters->wrong_version;
      PW_LOG(WARNING) << "refused frame from '" << LogSafe(from) << "': " << parsed.status().message();
    } else {
      ++counters->malformed;
      PW_LOG(WARNING) << "dropped malformed frame from '" << LogSafe(from) << "' (" << frame.bytes.size()
                      << " bytes): " << parsed.status().ToString();
    }
    return nullptr;
  }
  ++counters->received;
  return std::shared_ptr<proto::InMessage>(std::move(parsed).value().release());
}

// Applies per-link sequence rules. False when the frame must be dropped.
bool CheckSeq(uint64_t seq, uint64_t* last_seq, const std::string& from,
              ControlCounters* counters) {
  if (seq <= *last_seq) {
    ++counters->duplicates;
    PW_LOG(WARNING) << "dropped frame seq " << seq << " from '" << from << "' (last seen "
                    << *last_seq << ")";
    return false;
  }
  if (*last_seq != 0 && seq > *last_seq + 1) {
    counters->lost += seq - *last_seq - 1;
    PW_LOG(WARNING) << "lost " << (seq - *last_seq - 1) << " frame(s) from '" << from
                    << "' (seq " << *last_seq << " -> " << seq << ")";
  }
  *last_seq = seq;
  return true;
}

PeerLoad LoadFrom(wire::Heartbeat::Reader hb) {
  PeerLoad l;
  l.free_kv_blocks = hb.getFreeKvBlocks();
  l.used_kv_blocks = hb.getUsedKvBlocks();
  l.reserved_kv_blocks = hb.getReservedKvBlocks();
  l.running_requests = hb.getRunningRequests();
  l.waiting_requests = hb.getWaitingRequests();
  l.queued_prompt_tokens = hb.getQueuedPromptTokens();
  l.draining = hb.getDraining();
  l.kv_capacity_blocks = hb.getKvCapacityBlocks();
  return l;
}

// One endpoint's Poll: receives and dispatches frames for up to `timeout_ms` (at most 256, so
// timers run under a flood), never sleeping through the next timer (`next_timer_ms`, which
// `run_timers` moves). Frames still queued are signs of life not yet read: no peer is declared
// dead (`run_timers(true)`) before the queue has been drained.
int PollFrames(Transport& transport, const Clock& clock, const uint64_t& next_timer_ms,
               int timeout_ms, const std::function<void(bool sweep)>& run_timers,
               const std::function<void(Frame)>& handle) {
  int handled = 0;
  int wait = timeout_ms;
  bool drained = false;
  while (true) {
    uint64_t now = clock.NowMs();
    if (now >= next_timer_ms) {
      run_timers(/*sweep=*/false);
      now = clock.NowMs();
    }
    const int until_timer =
        next_timer_ms > now ? static_cast<int>(std::min<uint64_t>(next_timer_ms - now, 1u << 30))
                            : 0;
    const int w = wait < 0 ? until_timer : std::min(wait, until_timer);
    auto r = transport.Recv(w);
    if (!r.ok()) {
      PW_LOG(ERROR) << transport.Describe() << ": " << r.status().ToString();
      break;
    }
    if (!r->has_value()) {
      drained = true;
      break;
    }
    handle(std::move(**r));
    ++handled;
    wait = 0;
    if (handled >= 256) break;
  }
  run_timers(drained);
  return handled;
}

}  // namespace

// ---------------------------------------------------------------- server

ControlServer::ControlServer(std::unique_ptr<Transport> transport, const Clock* clock,
                             Options options)
    : transport_(std::move(transport)),
      clock_(clock),
      options_(std::move(options)),
      instance_(RandomInstance()),
      liveness_(clock, options_.heartbeat_ms, options_.dead_after_beats) {}

const PeerInfo* ControlServer::FindPeer(const std::string& peer) const {
  auto it = peers_.find(peer);
  return it == peers_.end() ? nullptr : &it->second;
}

Status ControlServer::Send(const std::string& peer, proto::OutMessage& msg, uint64_t* seq_out) {
  uint64_t seq;
  auto it = peers_.find(peer);
  if (it != peers_.end()) {
    seq = it->second.next_seq_out++;
  } else {
    seq = ++unregistered_seq_out_;
  }
  if (seq_out) *seq_out = seq;
  std::string bytes = proto::Encode(msg, seq, options_.id, clock_->NowMs());
  Status st = transport_->Send(peer, bytes);
  if (!st.ok()) ++counters_.send_errors;
  return st;
}

int ControlServer::Poll(int timeout_ms, const MessageHandler& handler) {
  return PollFrames(
      *transport_, *clock_, next_heartbeat_ms_, timeout_ms, [this](bool sweep) { RunTimers(sweep); },
      [&](Frame frame) { HandleFrame(std::move(frame), handler); });
}

void ControlServer::RunTimers(bool sweep) {
  const uint64_t now = clock_->NowMs();
  for (const PeerLiveness::Dead& d : sweep ? liveness_.TakeDead() : std::vector<PeerLiveness::Dead>{}) {
    const std::string& dead = d.peer;
    auto it = peers_.find(dead);
    if (it == peers_.end()) continue;
    PW_LOG(WARNING) << "peer '" << dead << "' silent for " << d.timeout_ms << " ms ("
                    << options_.dead_after_beats << " heartbeats of the longer interval): declared dead";
    PeerInfo info = std::move(it->second);
    peers_.erase(it);
    if (on_peer_dead) on_peer_dead(dead, info);
  }
  if (now >= next_heartbeat_ms_) {
    next_heartbeat_ms_ = now + options_.heartbeat_ms;
    std::vector<std::string> ids;
    for (const auto& [id, info] : peers_) ids.push_back(id);
    for (const std::string& id : ids) {
      proto::OutMessage m;
      auto hb = m.body().initHeartbeat();
      if (fill_heartbeat) fill_heartbeat(hb);
      hb.setServerInstance(instance_);
      Status st = Send(id, m);
      if (!st.ok()) PW_LOG(DEBUG) << "heartbeat to '" << id << "': " << st.ToString();
    }
  }
}

void ControlServer::HandleRegister(const std::string& peer,
                                   std::shared_ptr<proto::InMessage> msg) {
  proto::OutMessage ack_msg;
  auto ack = ack_msg.body().initRegisterAck();
  ack.setServerInstance(instance_);
  ack.setHeartbeatIntervalMs(static_cast<uint32_t>(options_.heartbeat_ms));
  bool accepted_new = false;  // a new registration (not a repeat), if st is Ok
  const std::string shown = LogSafe(peer);
  Status st = proto::GuardWire("register from '" + shown + "'", [&]() -> Status {
    if (std::string problem = PeerIdProblem(peer); !problem.empty()) {
      return InvalidArgument("routing id: " + problem);
    }
    auto reg = msg->body().getRegister();
    std::string claimed = proto::ToString(reg.getWorkerId());
    if (claimed != peer) {
      return InvalidArgument("workerId '" + LogSafe(claimed) + "' differs from routing id '" + shown + "'");
    }
    auto it = peers_.find(peer);
    if (it != peers_.end() && it->second.pid == reg.getPid() && it->second.frames == 0 &&
        msg->envelope().getAckSeq() < it->second.register_ack_seq) {
      // The same process repeating the Register we accepted, before it handled our ack (the
      // client repeats it every heartbeat until acknowledged; a Register's ackSeq is the seq
      // of the last RegisterAck the client accepted): acknowledge it again and keep the
      // registration. A process that saw our ack and registers again has lost us (and dropped
      // its work): it is registered afresh below.
      it->second.last_seq_in = std::max(it->second.last_seq_in, msg->seq());
      liveness_.Touch(peer);
      return Status::Ok();
    }
    accepted_new = true;
    if (on_register) PW_RETURN_IF_ERROR(on_register(peer, reg, msg->version_minor()));
    if (it != peers_.end() && it->second.pid != reg.getPid()) {
      PW_LOG(WARNING) << "peer '" << peer << "' re-registered from a new process (pid "
                      << it->second.pid << " -> " << reg.getPid() << ")";
      PeerInfo old = std::move(it->second);
      peers_.erase(it);
      if (on_peer_dead) on_peer_dead(peer, old);
    }
    PeerInfo& info = peers_[peer];
    bool fresh = info.id.empty();
    info.id = peer;
    info.role = reg.getRole();
    info.pid = reg.getPid();
    info.registration = msg;
    // A registration starts the link afresh: the client's numbering continues from this frame,
    // and what it acknowledges refers to this registration's frames only.
    info.last_seq_in = msg->seq();
    info.epoch = next_epoch_++;
    info.acked_seq = 0;
    info.frames = 0;
    if (fresh) {
      info.next_seq_out = unregistered_seq_out_ + 1;
      PW_LOG(INFO) << "peer '" << peer << "' registered (pid " << info.pid << ")";
    }
    liveness_.Touch(peer);
    liveness_.SetPeerInterval(peer, reg.getHeartbeatIntervalMs());
    return Status::Ok();
  });
  ack.setAccepted(st.ok());
  if (!st.ok()) {
    ack.setReason(st.message());
    PW_LOG(WARNING) << "refused registration of '" << shown << "': " << st.message();
  }
  uint64_t ack_seq = 0;
  Status sst = Send(peer, ack_msg, &ack_seq);
  if (!sst.ok()) PW_LOG(WARNING) << "register ack to '" << shown << "': " << sst.ToString();
  if (st.ok() && accepted_new) {
    auto it = peers_.find(peer);
    if (it != peers_.end()) it->second.register_ack_seq = ack_seq;
  }
}

void ControlServer::HandleFrame(Frame frame, const MessageHandler& handler) {
  const std::string peer = frame.peer;
  auto msg = ParseOrDrop(frame, peer, &counters_);
  if (!msg) return;
  if (msg->which() == proto::Body::REGISTER) {
    HandleRegister(peer, std::move(msg));
    return;
  }
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    ++counters_.unregistered;
    PW_LOG(INFO) << "frame '" << proto::BodyName(msg->which()) << "' from unregistered peer '"
                 << LogSafe(peer) << "': asking it to register";
    proto::OutMessage m;
    m.body().initNotRegistered().setReason("register first");
    (void)Send(peer, m);
    return;
  }
  if (!CheckSeq(msg->seq(), &it->second.last_seq_in, peer, &counters_)) return;
  liveness_.Touch(peer);
  ++it->second.frames;
  it->second.acked_seq = std::max(it->second.acked_seq, msg->envelope().getAckSeq());
  if (msg->which() == proto::Body::HEARTBEAT) {
    ++it->second.heartbeats;
    Status st = proto::GuardWire("heartbeat", [&]() -> Status {
      it->second.load = LoadFrom(msg->body().getHeartbeat());
      return Status::Ok();
    });
    if (!st.ok()) ++counters_.handler_errors;
    return;
  }
  if (!handler) return;
  Status st = proto::GuardWire(proto::BodyName(msg->which()) + " from '" + peer + "'",
                               [&]() -> Status { return handler(peer, *msg); });
  if (!st.ok()) {
    ++counters_.handler_errors;
    PW_LOG(WARNING) << "dropped " << proto::BodyName(msg->which()) << " from '" << peer
                    << "': " << st.ToString();
  }
}

// ---------------------------------------------------------------- client

ControlClient::ControlClient(std::unique_ptr<Transport> transport, const Clock* clock,
                             Options options)
    : transport_(std::move(transport)),
      clock_(clock),
      options_(std::move(options)),
      liveness_(clock, options_.heartbeat_ms, options_.dead_after_beats) {}

Status ControlClient::Send(proto::OutMessage& msg) {
  // A Register carries the seq of the last RegisterAck accepted, so the server can tell a
  // repeat (its ack not yet seen) from a registration after a loss.
  msg.envelope().setAckSeq(registered_            ? last_seq_in_
                           : msg.body().isRegister() ? last_ack_seq_
                                                     : 0);
  std::string bytes = proto::Encode(msg, next_seq_out_++, options_.id, clock_->NowMs());
  Status st = transport_->Send("", bytes);
  if (!st.ok()) ++counters_.send_errors;
  return st;
}

Status ControlClient::SendRegister() {
  proto::OutMessage m;
  auto reg = m.body().initRegister();
  if (fill_register) fill_register(reg);
  reg.setRole(options_.role);
  reg.setWorkerId(options_.id);
  reg.setPid(static_cast<uint32_t>(getpid()));
  reg.setHeartbeatIntervalMs(static_cast<uint32_t>(options_.heartbeat_ms));
  return Send(m);
}

Status ControlClient::Start() {
  next_timer_ms_ = clock_->NowMs() + options_.heartbeat_ms;
  liveness_.Touch("server");  // grace period: the server is given 3 beats to answer
  return SendRegister();
}

void ControlClient::MarkLost(const char* why) {
  if (registered_) {
    PW_LOG(WARNING) << options_.id << ": server " << why << "; registering again";
    registered_ = false;
    if (on_server_lost) on_server_lost();
  }
}

void ControlClient::RunTimers(bool sweep) {
  const uint64_t now = clock_->NowMs();
  if (sweep && !liveness_.TakeDead().empty()) {
    MarkLost("silent for 3 heartbeats");
    // Our connection may be one the server no longer reads (another connection took our
    // routing id over): register again on a new one.
    Status rc = transport_->Reconnect();
    if (!rc.ok()) PW_LOG(WARNING) << options_.id << ": reconnect: " << rc.ToString();
    liveness_.Touch("server");  // restart the grace period for the next registration
    next_timer_ms_ = now;       // register again at once
  }
  if (now < next_timer_ms_) return;
  next_timer_ms_ = now + options_.heartbeat_ms;
  if (!registered_) {
    Status st = SendRegister();
    if (!st.ok()) PW_LOG(DEBUG) << "register: " << st.ToString();
    return;
  }
  Status st = SendHeartbeat(fill_heartbeat);
  if (!st.ok()) PW_LOG(DEBUG) << "heartbeat: " << st.ToString();
}

Status ControlClient::SendHeartbeat(const std::function<void(wire::Heartbeat::Builder)>& fill) {
  proto::OutMessage m;
  auto hb = m.body().initHeartbeat();
  if (fill) fill(hb);
  return Send(m);
}

bool ControlClient::HeartbeatIfDue(const std::function<void(wire::Heartbeat::Builder)>& fill) {
  const uint64_t now = clock_->NowMs();
  if (!registered_ || now < next_timer_ms_) return false;
  next_timer_ms_ = now + options_.heartbeat_ms;
  Status st = SendHeartbeat(fill);
  if (!st.ok()) PW_LOG(DEBUG) << "heartbeat: " << st.ToString();
  return st.ok();
}

int ControlClient::Poll(int timeout_ms, const MessageHandler& handler) {
  return PollFrames(
      *transport_, *clock_, next_timer_ms_, timeout_ms, [this](bool sweep) { RunTimers(sweep); },
      [&](Frame frame) { HandleFrame(std::move(frame), handler); });
}

void ControlClient::HandleFrame(Frame frame, const MessageHandler& handler) {
  auto msg = ParseOrDrop(frame, "server", &counters_);
  if (!msg) return;
  const auto which = msg->which();
  if (which == proto::Body::REGISTER_ACK || which == proto::Body::HEARTBEAT) {
    uint64_t inst = 0;
    bool accepted = true;
    uint64_t server_heartbeat_ms = 0;
    std::string reason;
    Status st = proto::GuardWire("server frame", [&]() -> Status {
      if (which == proto::Body::REGISTER_ACK) {
        auto ack = msg->body().getRegisterAck();
        inst = ack.getServerInstance();
        accepted = ack.getAccepted();
        server_heartbeat_ms = ack.getHeartbeatIntervalMs();
        reason = proto::ToString(ack.getReason());
      } else {
        inst = msg->body().getHeartbeat().getServerInstance();
      }
      return Status::Ok();
    });
    if (!st.ok()) {
      ++counters_.handler_errors;
      return;
    }
    if (which == proto::Body::REGISTER_ACK) {
      // A registration starts the server's numbering to us afresh: a server that declared us
      // dead and forgot us numbers anew, a restarted one from 1. Take the ack's seq as the
      // last seen (frames before it in the queue belong to the previous registration).
      last_seq_in_ = msg->seq();
    } else if (inst != server_instance_) {
      last_seq_in_ = 0;  // a new server process numbers its frames from 1
      if (registered_) {
        MarkLost("restarted (new instance)");
        server_instance_ = inst;
        (void)CheckSeq(msg->seq(), &last_seq_in_, "server", &counters_);
        liveness_.Touch("server");
        (void)SendRegister();
        return;
      }
    }
    if (which == proto::Body::HEARTBEAT &&
        !CheckSeq(msg->seq(), &last_seq_in_, "server", &counters_)) {
      return;
    }
    liveness_.Touch("server");
    if (which == proto::Body::REGISTER_ACK) {
      server_instance_ = inst;
      if (!accepted) {
        PW_LOG(ERROR) << options_.id << ": registration refused: " << reason;
        return;
      }
      last_ack_seq_ = msg->seq();
      liveness_.SetPeerInterval("server", server_heartbeat_ms);
      if (!registered_) {
        registered_ = true;
        PW_LOG(INFO) << options_.id << ": registered with " << transport_->Describe();
        if (on_registered) on_registered();
      }
    }
    return;
  }
  if (which == proto::Body::NOT_REGISTERED) {
    // May come from a restarted server whose numbering started again: no seq check.
    liveness_.Touch("server");
    // One Register per lost registration: the server answers every frame it got from us while
    // it did not know us, and answering each NotRegistered of such a burst would send as many
    // Registers (the timer repeats ours every heartbeat until it is acknowledged).
    if (registered_) {
      MarkLost("does not know us");
      (void)SendRegister();
    }
    return;
  }
  if (!CheckSeq(msg->seq(), &last_seq_in_, "server", &counters_)) return;
  liveness_.Touch("server");
  if (!handler) return;
  Status st = proto::GuardWire(proto::BodyName(which) + " from server",
                               [&]() -> Status { return handler("", *msg); });
  if (!st.ok()) {
    ++counters_.handler_errors;
    PW_LOG(WARNING) << options_.id << ": dropped " << proto::BodyName(which) << ": "
                    << st.ToString();
  }
}

}  // namespace pw::transport
