// libFuzzer target: control-plane frames from a peer, through InMessage::Parse and the control
// endpoints' handlers. The input is a sequence of frames, each [peer selector u8][length u16 LE]
// [bytes]. A fresh ControlServer (a registered "decode-0" already known) and a registered
// ControlClient receive every frame through an in-memory transport; the application handler
// reads each accepted message in full (every field, as text) under GuardWire. Nothing a peer
// sends may crash, abort or leak; accepted frames must re-encode.
#include <capnp/serialize.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "common/logging.h"
#include "services/proto/codec.h"
#include "services/transport/control.h"

namespace {

using pw::transport::Frame;

// Hands queued frames to Recv; Send discards (counting).
class QueueTransport final : public pw::transport::Transport {
 public:
  explicit QueueTransport(std::deque<Frame>* q) : q_(q) {}
  pw::Status Send(std::string_view, std::string_view) override { return pw::Status::Ok(); }
  pw::Result<std::optional<Frame>> Recv(int) override {
    if (q_->empty()) return std::optional<Frame>();
    Frame f = std::move(q_->front());
    q_->pop_front();
    return std::optional<Frame>(std::move(f));
  }
  std::string Describe() const override { return "fuzz queue"; }

 private:
  std::deque<Frame>* q_;
};

std::string RegisterFrame(const char* id, pw::wire::Role role, uint64_t seq) {
  pw::proto::OutMessage m;
  auto r = m.body().initRegister();
  r.setRole(role);
  r.setWorkerId(id);
  r.setPid(1234);
  r.setModelName("tiny-moe");
  r.setHeartbeatIntervalMs(100);
  return pw::proto::Encode(m, seq, id, 1);
}

std::string AckFrame(uint64_t seq) {
  pw::proto::OutMessage m;
  auto a = m.body().initRegisterAck();
  a.setAccepted(true);
  a.setServerInstance(99);
  a.setHeartbeatIntervalMs(100);
  return pw::proto::Encode(m, seq, "router", 1);
}

const char* kPeers[] = {"decode-0", "prefill-0", "stranger"};

pw::Status ReadAll(const std::string&, const pw::proto::InMessage& msg) {
  return pw::proto::GuardWire("fuzz read", [&]() -> pw::Status {
    kj::String text = kj::str(msg.envelope());
    volatile size_t sink = text.size();
    (void)sink;
    return pw::Status::Ok();
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {  // every dropped frame is logged: keep the run fast
    pw::SetLogLevel(pw::LogLevel::kError);
    return true;
  }();
  (void)quiet;
  std::vector<Frame> frames;
  size_t at = 0;
  while (at + 3 <= size && frames.size() < 64) {
    const uint8_t who = data[at];
    uint16_t len;
    std::memcpy(&len, data + at + 1, 2);
    at += 3;
    len = static_cast<uint16_t>(std::min<size_t>(len, size - at));
    frames.push_back({kPeers[who % 3], std::string(reinterpret_cast<const char*>(data + at), len)});
    at += len;
  }
  // Parse alone: accepted frames keep their promises.
  for (const Frame& f : frames) {
    auto m = pw::proto::InMessage::Parse(f.bytes);
    if (!m.ok()) {
      PW_CHECK(!m.status().message().empty());
      continue;
    }
    PW_CHECK(f.bytes.size() % 8 == 0);
    (void)ReadAll("", **m);
  }
  pw::ManualClock clock;
  // Server side, with decode-0 registered.
  {
    std::deque<Frame> q;
    q.push_back({"decode-0", RegisterFrame("decode-0", pw::wire::Role::DECODE, 1)});
    pw::transport::ControlServer::Options so;
    so.heartbeat_ms = 100;
    pw::transport::ControlServer server(std::make_unique<QueueTransport>(&q), &clock, so);
    server.on_register = [](const std::string&, pw::wire::Register::Reader reg, uint16_t) {
      (void)pw::proto::ToString(reg.getModelName());
      (void)reg.getKvMemory().getRkey().size();
      return pw::Status::Ok();
    };
    server.Poll(0, ReadAll);
    PW_CHECK(server.FindPeer("decode-0") != nullptr);
    for (const Frame& f : frames) {
      q.push_back(f);
      server.Poll(0, ReadAll);
      clock.Advance(40);
    }
    clock.Advance(1000);
    server.Tick();
  }
  // Client side, registered with the server: every frame comes from the server.
  {
    std::deque<Frame> q;
    pw::transport::ControlClient::Options co;
    co.id = "decode-0";
    co.role = pw::wire::Role::DECODE;
    co.heartbeat_ms = 100;
    pw::transport::ControlClient client(std::make_unique<QueueTransport>(&q), &clock, co);
    PW_CHECK(client.Start().ok());
    q.push_back({"", AckFrame(1)});
    client.Poll(0, ReadAll);
    PW_CHECK(client.registered());
    for (const Frame& f : frames) {
      q.push_back({"", f.bytes});
      client.Poll(0, ReadAll);
      clock.Advance(40);
    }
  }
  return 0;
}

// Well-formed frames of several kinds, each from decode-0.
std::vector<std::string> PwFuzzSeeds() {
  auto framed = [](uint8_t who, const std::string& bytes) {
    std::string s(1, static_cast<char>(who));
    const uint16_t len = static_cast<uint16_t>(bytes.size());
    s.append(reinterpret_cast<const char*>(&len), 2);
    return s + bytes;
  };
  std::vector<std::string> seeds;
  {
    pw::proto::OutMessage m;
    auto hb = m.body().initHeartbeat();
    hb.setFreeKvBlocks(10);
    hb.setServerInstance(99);
    seeds.push_back(framed(0, pw::proto::Encode(m, 2, "decode-0", 5)));
  }
  {
    pw::proto::OutMessage m;
    auto tc = m.body().initTokenChunk();
    tc.setRequestId(7);
    tc.initTokens(3).set(2, 42);
    seeds.push_back(framed(0, pw::proto::Encode(m, 2, "decode-0", 5)));
  }
  {
    pw::proto::OutMessage m;
    auto r = m.body().initKvReserveReply();
    r.setRequestId(7);
    r.setOk(true);
    r.setLeaseId(3);
    r.initBlockIds(4).set(1, 9);
    seeds.push_back(framed(0, pw::proto::Encode(m, 2, "decode-0", 5)));
  }
  seeds.push_back(framed(1, RegisterFrame("prefill-0", pw::wire::Role::PREFILL, 1)) +
                  framed(0, RegisterFrame("decode-0", pw::wire::Role::DECODE, 3)));
  seeds.push_back(framed(0, AckFrame(2)));
  {
    pw::proto::OutMessage m;
    m.body().initNotRegistered().setReason("register first");
    seeds.push_back(framed(2, pw::proto::Encode(m, 1, "router", 5)));
  }
  return seeds;
}
