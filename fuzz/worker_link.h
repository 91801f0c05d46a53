// WorkerLink: the router link of a worker under fuzzing (fuzz/*_worker_handlers_fuzz.cc). Frames
// from the input pass the same checks the worker's own link makes (a registered
// transport::ControlClient: parse, protocol version, per-link seq, GuardWire) and reach the
// worker's HandleRouter exactly as Run's poll hands them over. What the worker sends to the
// router goes over its real ZeroMQ link to a ROUTER socket bound here, on loopback, and is read
// back (every frame must parse).
#pragma once

#include <capnp/serialize.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/logging.h"
#include "services/proto/codec.h"
#include "services/transport/control.h"
#include "services/transport/zmq_transport.h"

namespace pw::fuzz {

// Hands queued frames to Recv; Send discards (the worker answers over its own link).
class QueueTransport final : public transport::Transport {
 public:
  explicit QueueTransport(std::deque<transport::Frame>* q) : q_(q) {}
  Status Send(std::string_view, std::string_view) override { return Status::Ok(); }
  Result<std::optional<transport::Frame>> Recv(int) override {
    if (q_->empty()) return std::optional<transport::Frame>();
    transport::Frame f = std::move(q_->front());
    q_->pop_front();
    return std::optional<transport::Frame>(std::move(f));
  }
  std::string Describe() const override { return "fuzz queue"; }

 private:
  std::deque<transport::Frame>* q_;
};

// The input's frames: [length u16 LE][bytes], at most 64.
inline std::vector<std::string> SplitFrames(const uint8_t* data, size_t size) {
  std::vector<std::string> frames;
  size_t at = 0;
  while (at + 2 <= size && frames.size() < 64) {
    uint16_t len;
    std::memcpy(&len, data + at, 2);
    at += 2;
    len = static_cast<uint16_t>(std::min<size_t>(len, size - at));
    frames.emplace_back(reinterpret_cast<const char*>(data + at), len);
    at += len;
  }
  return frames;
}

inline std::string Framed(const std::string& bytes) {
  const uint16_t len = static_cast<uint16_t>(bytes.size());
  return std::string(reinterpret_cast<const char*>(&len), 2) + bytes;
}

// A frame from the router with seq `seq` (the link is registered with seq 1).
inline std::string RouterFrame(proto::OutMessage& m, uint64_t seq) {
  return proto::Encode(m, seq, "router", 1000);
}

// The router's end: the ROUTER socket the worker connects to.
class RouterEnd {
 public:
  RouterEnd() {
    auto r = transport::ZmqRouterTransport::Bind("tcp://127.0.0.1:0");
    PW_CHECK_MSG(r.ok(), "cannot bind the fuzz router socket");
    socket_ = std::move(*r);
  }
  const std::string& endpoint() const { return socket_->endpoint(); }
  // Reads what the worker sent, waiting up to `timeout_ms` for the first frame; each frame must
  // parse. `until`: stop once it returns true for a frame.
  void Read(int timeout_ms, const std::function<bool(const proto::InMessage&)>& until) {
    for (;;) {
      auto f = socket_->Recv(timeout_ms);
      PW_CHECK_MSG(f.ok(), "fuzz router socket failed");
      if (!f->has_value()) return;
      auto m = proto::InMessage::Parse((*f)->bytes);
      PW_CHECK_MSG(m.ok(), "the worker sent a frame it cannot parse");
      if (until && until(**m)) return;
      timeout_ms = until ? timeout_ms : 0;
    }
  }

 private:
  std::unique_ptr<transport::ZmqRouterTransport> socket_;
};

// A registered router link over the input's frames; `handler` gets what passes its checks.
class RouterLink {
 public:
  RouterLink(const std::string& worker_id, wire::Role role) : clock_(1000) {
    transport::ControlClient::Options o;
    o.id = worker_id;
    o.role = role;
    o.heartbeat_ms = 100000;  // no timers fire during an input
    client_ = std::make_unique<transport::ControlClient>(std::make_unique<QueueTransport>(&q_),
                                                         &clock_, o);
    PW_CHECK(client_->Start().ok());
    proto::OutMessage m;
    auto a = m.body().initRegisterAck();
    a.setAccepted(true);
    a.setServerInstance(99);
    a.setHeartbeatIntervalMs(100000);
    q_.push_back({"", RouterFrame(m, 1)});
    client_->Poll(0, [](const std::string&, const proto::InMessage&) { return Status::Ok(); });
    PW_CHECK(client_->registered());
  }
  void Deliver(std::string bytes, const transport::MessageHandler& handler) {
    q_.push_back({"", std::move(bytes)});
    client_->Poll(0, handler);
  }

 private:
  pw::ManualClock clock_;
  std::deque<transport::Frame> q_;
  std::unique_ptr<transport::ControlClient> client_;
};

// `bytes` as a frame with leaseId (of StartDecode or Cancel) replaced by `lease`; unchanged
// when it is neither or does not parse.
inline std::string WithLease(const std::string& bytes, uint64_t lease) {
  auto m = proto::InMessage::Parse(bytes);
  if (!m.ok()) return bytes;
  std::string out = bytes;
  (void)proto::GuardWire("lease rewrite", [&]() -> Status {
    const auto which = (*m)->which();
    if (which != proto::Body::START_DECODE && which != proto::Body::CANCEL) return Status::Ok();
    ::capnp::MallocMessageBuilder b;
    b.setRoot((*m)->envelope());
    auto body = b.getRoot<wire::Envelope>().getBody();
    if (which == proto::Body::START_DECODE) {
      body.getStartDecode().setLeaseId(lease);
    } else {
      body.getCancel().setLeaseId(lease);
    }
    auto words = ::capnp::messageToFlatArray(b);
    auto chars = words.asChars();
    out.assign(chars.begin(), chars.end());
    return Status::Ok();
  });
  return out;
}

}  // namespace pw::fuzz
