// Control plane over real ZeroMQ sockets on loopback: registration, heartbeats and death
// detection (manual clock), refusal of malformed / wrong-version / unregistered frames, and the
// fault-injecting transport.
#include <gtest/gtest.h>
#include <unistd.h>

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/logging.h"
#include "services/transport/control.h"
#include "services/transport/fault_transport.h"
#include "services/transport/zmq_transport.h"

namespace pw::transport {
namespace {

constexpr uint64_t kBeatMs = 100;

struct Pair {
  ManualClock clock;
  std::unique_ptr<ControlServer> server;
  std::unique_ptr<ControlClient> client;
  std::string endpoint;
};

std::unique_ptr<ControlClient> MakeClient(const std::string& endpoint, const std::string& id,
                                          const Clock* clock, FaultConfig* faults = nullptr,
                                          uint64_t beat_ms = kBeatMs) {
  auto dealer = ZmqDealerTransport::Connect(endpoint, id);
  EXPECT_TRUE(dealer.ok()) << dealer.status().ToString();
  std::unique_ptr<Transport> t = std::move(dealer).value();
  if (faults) t = std::make_unique<FaultInjectingTransport>(std::move(t), *faults, clock);
  ControlClient::Options o;
  o.id = id;
  o.role = wire::Role::DECODE;
  o.heartbeat_ms = beat_ms;
  return std::make_unique<ControlClient>(std::move(t), clock, o);
}

// `server_beat_ms` / `client_beat_ms`: each side's heartbeat interval.
void MakePair(Pair* p, FaultConfig* client_faults = nullptr, uint64_t server_beat_ms = kBeatMs,
              uint64_t client_beat_ms = kBeatMs) {
  auto router = ZmqRouterTransport::Bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(router.ok()) << router.status().ToString();
  p->endpoint = (*router)->endpoint();
  ControlServer::Options so;
  so.id = "router";
  so.heartbeat_ms = server_beat_ms;
  p->server = std::make_unique<ControlServer>(std::move(router).value(), &p->clock, so);
  p->client = MakeClient(p->endpoint, "decode-0", &p->clock, client_faults, client_beat_ms);
}

// Polls both sides until `done` or ~5 s of real time pass.
template <typename F>
bool PumpUntil(Pair& p, F done, const MessageHandler& sh = nullptr,
               const MessageHandler& ch = nullptr) {
  for (int i = 0; i < 500 && !done(); ++i) {
    p.server->Poll(5, sh);
    p.client->Poll(5, ch);
  }
  return done();
}

// A silent peer at its deadline: `silence_ms` from now `poll` has not yet found it dead
// (`deaths()` 0); one millisecond later it has (1).
template <typename Poll, typename Deaths>
void ExpectDeadJustPast(Pair& p, uint64_t silence_ms, Poll poll, Deaths deaths) {
  p.clock.Advance(silence_ms);
  poll();
  EXPECT_EQ(deaths(), 0u);
  p.clock.Advance(1);
  poll();
  EXPECT_EQ(deaths(), 1u);
}

TEST(Control, RegistersAndExchangesMessages) {
  Pair p;
  MakePair(&p);
  bool registered_cb = false;
  p.client->on_registered = [&] { registered_cb = true; };
  p.client->fill_register = [](wire::Register::Builder r) { r.setModelName("tiny-moe"); };
  ASSERT_TRUE(p.client->Start().ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return p.client->registered(); }));
  EXPECT_TRUE(registered_cb);
  const PeerInfo* info = p.server->FindPeer("decode-0");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->role, wire::Role::DECODE);
  EXPECT_EQ(proto::ToString(info->registration->body().getRegister().getModelName()), "tiny-moe");

  proto::OutMessage m;
  auto tc = m.body().initTokenChunk();
  tc.setRequestId(77);
  tc.setStartIndex(3);
  tc.initTokens(2).set(1, 99);
  ASSERT_TRUE(p.client->Send(m).ok());
  uint64_t got_request = 0;
  uint32_t got_token = 0;
  MessageHandler sh = [&](const std::string& peer, const proto::InMessage& in) -> Status {
    EXPECT_EQ(peer, "decode-0");
    if (in.which() != proto::Body::TOKEN_CHUNK) return Status::Ok();
    got_request = in.body().getTokenChunk().getRequestId();
    got_token = in.body().getTokenChunk().getTokens()[1];
    return Status::Ok();
  };
  ASSERT_TRUE(PumpUntil(p, [&] { return got_request != 0; }, sh));
  EXPECT_EQ(got_request, 77u);
  EXPECT_EQ(got_token, 99u);

  proto::OutMessage c;
  c.body().initCancel().setRequestId(5);
  ASSERT_TRUE(p.server->Send("decode-0", c).ok());
  uint64_t cancelled = 0;
  MessageHandler ch = [&](const std::string&, const proto::InMessage& in) -> Status {
    if (in.which() == proto::Body::CANCEL) cancelled = in.body().getCancel().getRequestId();
    return Status::Ok();
  };
  ASSERT_TRUE(PumpUntil(p, [&] { return cancelled != 0; }, nullptr, ch));
  EXPECT_EQ(cancelled, 5u);
  EXPECT_EQ(p.server->counters().malformed, 0u);
  EXPECT_EQ(p.server->counters().lost, 0u);
}

// HeartbeatIfDue (a keepalive thread's call while the polling thread is busy) sends exactly the
// heartbeats that fall due, filled by its own callback, only while registered, and moves Poll's
// timer so the two never double a beat. The server, polled throughout, never declares the
// unpolled client dead, and the client, polled again, still counts the server alive.
TEST(Control, HeartbeatIfDueKeepsAnUnpolledClientAlive) {
  Pair p;
  MakePair(&p);
  std::vector<std::string> dead;
  p.server->on_peer_dead = [&](const std::string& id, const PeerInfo&) { dead.push_back(id); };
  int lost = 0;
  p.client->on_server_lost = [&] { ++lost; };
  p.client->fill_heartbeat = [](wire::Heartbeat::Builder h) { h.setFreeKvBlocks(1); };
  uint32_t snapshot = 0;
  auto fill = [&](wire::Heartbeat::Builder h) { h.setFreeKvBlocks(snapshot); };
  // Not registered yet: nothing goes out, however late.
  p.clock.Advance(10 * kBeatMs);
  EXPECT_FALSE(p.client->HeartbeatIfDue(fill));
  ASSERT_TRUE(p.client->Start().ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return p.client->registered(); }));
  EXPECT_FALSE(p.client->HeartbeatIfDue(fill));  // registered, but the first beat is not due
  const PeerInfo* info = p.server->FindPeer("decode-0");
  ASSERT_NE(info, nullptr);
  const uint64_t beats_before = info->heartbeats;
  // Ten intervals in which only HeartbeatIfDue runs on the client side.
  for (int beat = 1; beat <= 10; ++beat) {
    p.clock.Advance(kBeatMs);
    snapshot = 100 + static_cast<uint32_t>(beat);
    EXPECT_TRUE(p.client->HeartbeatIfDue(fill)) << "beat " << beat;
    EXPECT_FALSE(p.client->HeartbeatIfDue(fill)) << "beat " << beat << " sent twice";
    for (int i = 0; i < 500; ++i) {
      p.server->Poll(5, nullptr);
      info = p.server->FindPeer("decode-0");
      if (info == nullptr || info->heartbeats >= beats_before + static_cast<uint64_t>(beat)) break;
    }
    ASSERT_NE(info, nullptr) << "declared dead at beat " << beat;
    EXPECT_EQ(info->heartbeats, beats_before + static_cast<uint64_t>(beat));
    EXPECT_EQ(info->load.free_kv_blocks, snapshot);  // HeartbeatIfDue's fill, not fill_heartbeat
  }
  EXPECT_TRUE(dead.empty());
  // Poll right after: its timer moved, so no second heartbeat this interval; the server's
  // heartbeats that waited unread keep the server alive for the client.
  p.client->Poll(0, nullptr);
  EXPECT_TRUE(p.client->registered());
  EXPECT_EQ(lost, 0);
  for (int i = 0; i < 20; ++i) p.server->Poll(5, nullptr);
  ASSERT_NE(p.server->FindPeer("decode-0"), nullptr);
  EXPECT_EQ(p.server->FindPeer("decode-0")->heartbeats, beats_before + 10);
  // One interval later Poll beats again, with fill_heartbeat.
  p.clock.Advance(kBeatMs);
  p.client->Poll(0, nullptr);
  ASSERT_TRUE(PumpUntil(p, [&] {
    const PeerInfo* d = p.server->FindPeer("decode-0");
    return d != nullptr && d->heartbeats == beats_before + 11;
  }));
  EXPECT_EQ(p.server->FindPeer("decode-0")->load.free_kv_blocks, 1u);
  EXPECT_EQ(p.server->counters().lost, 0u);
  EXPECT_EQ(p.server->counters().duplicates, 0u);
}

TEST(Control, RouterMandatoryRefusesUnknownPeer) {
  Pair p;
  MakePair(&p);
  proto::OutMessage m;
  m.body().initCancel();
  Status st = p.server->Send("nobody", m);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
}

TEST(Control, PeerSilentForThreeHeartbeatsIsDead) {
  Pair p;
  MakePair(&p);
  std::vector<std::string> dead;
  p.server->on_peer_dead = [&](const std::string& id, const PeerInfo&) { dead.push_back(id); };
  ASSERT_TRUE(p.client->Start().ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return p.client->registered(); }));
  // Beats keep it alive: 10 intervals with both sides polling.
  for (int beat = 0; beat < 10; ++beat) {
    p.clock.Advance(kBeatMs);
    uint64_t hb_before = p.server->counters().received;
    ASSERT_TRUE(PumpUntil(p, [&] { return p.server->counters().received > hb_before; }));
  }
  EXPECT_TRUE(dead.empty());
  ASSERT_NE(p.server->FindPeer("decode-0"), nullptr);
  // The client goes silent. Exactly 3 beats is not yet dead; just past it is.
  ExpectDeadJustPast(p, 3 * kBeatMs, [&] { p.server->Poll(0, nullptr); }, [&] { return dead.size(); });
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0], "decode-0");
  EXPECT_EQ(p.server->FindPeer("decode-0"), nullptr);
}

// Each side judges the other's silence by the longer of the two intervals (the peer's as it
// declares it in Register / RegisterAck): a server beating every 4 intervals of its client's,
// or a client beating every 4 of its server's, stays alive; a side that stops is still found
// dead after 3 of its own intervals; a declared interval is taken at most at 60 s.
TEST(Control, SilenceIsJudgedByTheLongerOfTheTwoIntervals) {
  for (bool slow_server : {true, false}) {
    SCOPED_TRACE(slow_server ? "server beats every 400 ms" : "client beats every 400 ms");
    Pair p;
    const uint64_t slow = 4 * kBeatMs;
    MakePair(&p, nullptr, slow_server ? slow : kBeatMs, slow_server ? kBeatMs : slow);
    int lost = 0;
    std::vector<std::string> dead;
    p.client->on_server_lost = [&] { ++lost; };
    p.server->on_peer_dead = [&](const std::string& id, const PeerInfo&) { dead.push_back(id); };
    ASSERT_TRUE(p.client->Start().ok());
    ASSERT_TRUE(PumpUntil(p, [&] { return p.client->registered(); }));
    // Ten slow intervals, both sides polling after each: every heartbeat arrives 400 ms after
    // the last, beyond the fast side's own 3 x 100 ms.
    for (int beat = 0; beat < 10; ++beat) {
      p.clock.Advance(slow);
      const uint64_t s0 = p.server->counters().received, c0 = p.client->counters().received;
      ASSERT_TRUE(PumpUntil(p, [&] {
        return slow_server ? p.client->counters().received > c0 : p.server->counters().received > s0;
      }));
    }
    EXPECT_EQ(lost, 0);
    EXPECT_TRUE(dead.empty());
    EXPECT_TRUE(p.client->registered());
    // The slow side stops: 3 of its intervals is not yet dead, just past it is.
    if (slow_server) {
      ExpectDeadJustPast(p, 3 * slow, [&] { p.client->Poll(0, nullptr); },
                         [&] { return static_cast<size_t>(lost); });
    } else {
      ExpectDeadJustPast(p, 3 * slow, [&] { p.server->Poll(0, nullptr); }, [&] { return dead.size(); });
    }
  }
  // A client declaring 10 minutes is judged at 60 s.
  Pair p;
  MakePair(&p, nullptr, kBeatMs, 600000);
  std::vector<std::string> dead;
  p.server->on_peer_dead = [&](const std::string& id, const PeerInfo&) { dead.push_back(id); };
  ASSERT_TRUE(p.client->Start().ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return p.server->FindPeer("decode-0") != nullptr; }));
  ExpectDeadJustPast(p, 3 * kMaxPeerHeartbeatMs, [&] { p.server->Poll(0, nullptr); },
                     [&] { return dead.size(); });
}

TEST(Control, ClientNoticesSilentServerAndReregisters) {
  Pair p;
  MakePair(&p);
  int lost = 0, registrations = 0;
  p.client->on_server_lost = [&] { ++lost; };
  p.client->on_registered = [&] { ++registrations; };
  ASSERT_TRUE(p.client->Start().ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return p.client->registered(); }));
  p.clock.Advance(3 * kBeatMs + 1);
  p.client->Poll(0, nullptr);  // the server did not poll: no heartbeat from it
  EXPECT_EQ(lost, 1);
  EXPECT_FALSE(p.client->registered());
  // The server comes back to life; its dead-peer sweep forgets the client, which registers again.
  ASSERT_TRUE(PumpUntil(p, [&] { return p.client->registered(); }));
  EXPECT_EQ(registrations, 2);
}

// Issue 15, part 1: a local process opens a DEALER with the worker's routing id, holds it a
// moment and closes it (here it sends one malformed byte, so the test knows when it got in). ZMQ_ROUTER_HANDOVER gives it the id and drops the real
// worker's pipe, whose frames then go nowhere although its TCP connection stays up. The worker,
// hearing nothing for 3 heartbeats, must come back on its own: it reconnects (a new connection
// takes the id back) and registers again. (Authentication, which would refuse the impostor
// outright, is not built yet.)
TEST(Control, WorkerWhoseRoutingIdWasTakenOverReconnectsAndRegistersAgain) {
  Pair p;
  MakePair(&p);
  int lost = 0;
  p.client->on_server_lost = [&] { ++lost; };
  ASSERT_TRUE(p.client->Start().ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return p.client->registered(); }));
  {
    zmq::socket_t spoof(ZmqContext(), zmq::socket_type::dealer);
    spoof.set(zmq::sockopt::routing_id, "decode-0");
    spoof.set(zmq::sockopt::linger, 0);
    spoof.connect(p.endpoint);
    // One byte that is not a frame: when the server has dropped it, the impostor holds the id
    // (the manual clock stands still meanwhile: nobody is declared dead).
    const uint64_t malformed = p.server->counters().malformed;
    (void)spoof.send(zmq::buffer("x", 1), zmq::send_flags::none);
    for (int i = 0; i < 1000 && p.server->counters().malformed == malformed; ++i) {
      p.server->Poll(5, nullptr);
      p.client->Poll(0, nullptr);
    }
    ASSERT_GT(p.server->counters().malformed, malformed) << "the impostor never got through";
  }
  uint64_t got_request = 0;
  MessageHandler sh = [&](const std::string&, const proto::InMessage& in) -> Status {
    if (in.which() == proto::Body::TOKEN_CHUNK) got_request = in.body().getTokenChunk().getRequestId();
    return Status::Ok();
  };
  // Heartbeat time passes: both sides notice the silence; the worker must be back within it.
  bool back = false;
  for (int i = 0; i < 400 && !back; ++i) {
    p.clock.Advance(kBeatMs / 4);
    p.server->Poll(5, sh);
    p.client->Poll(5, nullptr);
    back = lost >= 1 && p.client->registered() && p.server->FindPeer("decode-0") != nullptr;
  }
  ASSERT_TRUE(back) << "lost " << lost << ", client registered " << p.client->registered();
  proto::OutMessage m;
  m.body().initTokenChunk().setRequestId(42);
  ASSERT_TRUE(p.client->Send(m).ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return got_request != 0; }, sh));
  EXPECT_EQ(got_request, 42u);
}

// A worker stopped (SIGSTOP) past 3 heartbeats is forgotten by the server; when it continues
// it sends what it had queued (heartbeats, token chunks), and the server answers each frame
// with NotRegistered. The worker must register once, not once per NotRegistered: the server
// takes every Register of the same process after the first as a worker that lost it and
// dropped its requests, and would place those requests again each time.
TEST(Control, BurstOfNotRegisteredGivesOneRegistration) {
  Pair p;
  MakePair(&p);
  int registrations = 0;
  p.server->on_register = [&](const std::string&, wire::Register::Reader, uint16_t) {
    ++registrations;
    return Status::Ok();
  };
  ASSERT_TRUE(p.client->Start().ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return p.client->registered(); }));
  ASSERT_EQ(registrations, 1);
  // The worker is stopped: only the server runs, and declares it dead.
  for (int i = 0; i < 8; ++i) {
    p.clock.Advance(kBeatMs);
    p.server->Poll(0, nullptr);
  }
  ASSERT_EQ(p.server->FindPeer("decode-0"), nullptr);
  // It continues, still thinking itself registered, with 20 frames queued.
  for (int i = 0; i < 20; ++i) {
    proto::OutMessage m;
    m.body().initTokenChunk().setRequestId(static_cast<uint64_t>(i + 1));
    ASSERT_TRUE(p.client->Send(m).ok());
  }
  const uint64_t unregistered = p.server->counters().unregistered;
  ASSERT_TRUE(PumpUntil(p, [&] {
    return p.server->counters().unregistered >= unregistered + 20 && p.client->registered() &&
           p.server->FindPeer("decode-0") != nullptr;
  }));
  for (int i = 0; i < 50; ++i) {  // let any extra Register arrive
    p.server->Poll(2, nullptr);
    p.client->Poll(2, nullptr);
  }
  EXPECT_EQ(registrations, 2) << "one Register per NotRegistered";
}

// A Register repeated before the client handled the ack (its ackSeq, the last RegisterAck it
// accepted, is below this registration's ack) keeps the registration; one that carries the
// ack's seq comes from a client that saw the ack and lost the server since: registered afresh.
TEST(Control, RepeatedRegisterKeepsTheRegistrationUnlessTheAckWasSeen) {
  Pair p;
  MakePair(&p);
  int registrations = 0;
  p.server->on_register = [&](const std::string&, wire::Register::Reader, uint16_t) {
    ++registrations;
    return Status::Ok();
  };
  auto raw = ZmqDealerTransport::Connect(p.endpoint, "decode-9");
  ASSERT_TRUE(raw.ok());
  uint64_t seq = 1;
  auto send_register = [&](uint64_t ack_seq) {
    proto::OutMessage m;
    auto reg = m.body().initRegister();
    reg.setRole(wire::Role::DECODE);
    reg.setWorkerId("decode-9");
    reg.setPid(4242);
    m.envelope().setAckSeq(ack_seq);
    ASSERT_TRUE((*raw)->Send("", proto::Encode(m, seq++, "decode-9", 1)).ok());
  };
  // Reads the server's frames to decode-9 until a RegisterAck; returns its seq.
  auto read_ack = [&]() -> uint64_t {
    for (int i = 0; i < 500; ++i) {
      p.server->Poll(2, nullptr);
      auto f = (*raw)->Recv(2);
      if (!f.ok() || !f->has_value()) continue;
      auto in = proto::InMessage::Parse((*f)->bytes);
      if (in.ok() && (*in)->which() == proto::Body::REGISTER_ACK) return (*in)->seq();
    }
    return 0;
  };
  send_register(0);
  send_register(0);  // the timer's repeat, before the ack was read
  const uint64_t ack1 = read_ack();
  ASSERT_NE(ack1, 0u);
  const uint64_t ack2 = read_ack();  // the repeat is acknowledged too
  ASSERT_NE(ack2, 0u);
  EXPECT_EQ(registrations, 1) << "a repeated Register was taken as a new registration";
  const uint64_t epoch = p.server->FindPeer("decode-9")->epoch;
  // The client saw the ack, then lost the server (without a frame in between): new registration.
  send_register(ack1);
  ASSERT_NE(read_ack(), 0u);
  EXPECT_EQ(registrations, 2);
  EXPECT_NE(p.server->FindPeer("decode-9")->epoch, epoch);
}

TEST(Control, RestartedServerIsDetectedAndClientReregisters) {
  Pair p;
  MakePair(&p);
  int registrations = 0;
  p.client->on_registered = [&] { ++registrations; };
  ASSERT_TRUE(p.client->Start().ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return p.client->registered(); }));
  uint64_t first_instance = p.client->server_instance();
  // Replace the server by a new process on the same endpoint.
  p.server.reset();
  // The old socket closes asynchronously on ZeroMQ's I/O thread; the port frees shortly.
  auto router = ZmqRouterTransport::Bind(p.endpoint);
  for (int i = 0; i < 200 && !router.ok(); ++i) {
    p.client->Poll(10, nullptr);
    router = ZmqRouterTransport::Bind(p.endpoint);
  }
  ASSERT_TRUE(router.ok()) << router.status().ToString();
  ControlServer::Options so;
  so.heartbeat_ms = kBeatMs;
  p.server = std::make_unique<ControlServer>(std::move(router).value(), &p.clock, so);
  for (int i = 0; i < 200 && registrations < 2; ++i) {
    p.clock.Advance(kBeatMs / 4);
    p.server->Poll(5, nullptr);
    p.client->Poll(5, nullptr);
  }
  EXPECT_EQ(registrations, 2);
  EXPECT_NE(p.client->server_instance(), first_instance);
  EXPECT_NE(p.server->FindPeer("decode-0"), nullptr);
}

// A peer falsely declared dead (it was busy, not gone) registers again. The server's frames
// of the new registration are numbered afresh; the client must take them (not drop them as
// duplicates of the old registration's higher numbers), and both directions work at once.
TEST(Control, FalselyDeadPeerIsReacceptedAndBothSidesTakeTheNewSequence) {
  Pair p;
  MakePair(&p);
  std::vector<std::string> dead;
  int registrations = 0;
  p.server->on_peer_dead = [&](const std::string& id, const PeerInfo&) { dead.push_back(id); };
  p.client->on_registered = [&] { ++registrations; };
  ASSERT_TRUE(p.client->Start().ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return p.client->registered(); }));
  // Many beats: the server's sequence on this link climbs well above a fresh link's.
  for (int beat = 0; beat < 20; ++beat) {
    p.clock.Advance(kBeatMs);
    uint64_t before = p.client->counters().received;
    ASSERT_TRUE(PumpUntil(p, [&] { return p.client->counters().received > before; }));
  }
  // The client stalls (no Poll) while the server sweeps: declared dead. (First the server
  // reads what the client sent before stalling.)
  for (int i = 0; i < 10; ++i) p.server->Poll(5, nullptr);
  p.clock.Advance(3 * kBeatMs + 1);
  p.server->Poll(5, nullptr);
  ASSERT_EQ(dead.size(), 1u);
  // The client wakes up, is told it is unknown, and registers again.
  int cancels = 0;
  MessageHandler ch = [&](const std::string&, const proto::InMessage& in) -> Status {
    if (in.which() == proto::Body::CANCEL) ++cancels;
    return Status::Ok();
  };
  bool back = false;
  for (int i = 0; i < 40 && !back; ++i) {
    p.clock.Advance(kBeatMs / 4);
    p.client->Poll(5, ch);
    p.server->Poll(5, nullptr);
    back = registrations == 2 && p.client->registered() && p.server->FindPeer("decode-0");
  }
  ASSERT_TRUE(back) << "not registered again within 10 heartbeats (duplicates dropped: "
                    << p.client->counters().duplicates << ")";
  EXPECT_EQ(p.client->counters().duplicates, 0u);
  // Server -> client and client -> server frames of the new registration are delivered.
  proto::OutMessage c;
  c.body().initCancel().setRequestId(9);
  ASSERT_TRUE(p.server->Send("decode-0", c).ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return cancels == 1; }, nullptr, ch));
  uint64_t chunks = 0;
  MessageHandler sh = [&](const std::string&, const proto::InMessage& in) -> Status {
    if (in.which() == proto::Body::TOKEN_CHUNK) ++chunks;
    return Status::Ok();
  };
  proto::OutMessage tc;
  tc.body().initTokenChunk().setRequestId(9);
  ASSERT_TRUE(p.client->Send(tc).ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return chunks == 1; }, sh));
  EXPECT_EQ(p.server->counters().duplicates, 0u);
  EXPECT_EQ(p.client->counters().duplicates, 0u);
}

TEST(Control, MalformedWrongVersionAndUnregisteredFramesAreDropped) {
  Pair p;
  MakePair(&p);
  auto raw = ZmqDealerTransport::Connect(p.endpoint, "evil");
  ASSERT_TRUE(raw.ok());
  int handled = 0;
  MessageHandler sh = [&](const std::string&, const proto::InMessage&) -> Status {
    ++handled;
    return Status::Ok();
  };
  // Garbage, a misaligned frame, an empty frame.
  ASSERT_TRUE((*raw)->Send("", std::string(24, '\xab')).ok());
  ASSERT_TRUE((*raw)->Send("", "hello").ok());
  ASSERT_TRUE((*raw)->Send("", "").ok());
  // A well-formed frame from a future major version.
  ::capnp::MallocMessageBuilder b;
  auto env = b.initRoot<proto::Envelope>();
  env.setVersionMajor(proto::kProtocolMajor + 1);
  env.setSeq(1);
  env.setSenderId("evil");
  env.getBody().initRegister().setWorkerId("evil");
  auto flat = ::capnp::messageToFlatArray(b);
  auto fb = flat.asBytes();
  ASSERT_TRUE((*raw)->Send("", std::string(reinterpret_cast<const char*>(fb.begin()), fb.size()))
                  .ok());
  // A valid message from a peer that never registered.
  proto::OutMessage tc;
  tc.body().initTokenChunk().setRequestId(1);
  ASSERT_TRUE((*raw)->Send("", proto::Encode(tc, 1, "evil", 0)).ok());
  ASSERT_TRUE(PumpUntil(p, [&] {
    const auto& c = p.server->counters();
    return c.malformed >= 3 && c.wrong_version >= 1 && c.unregistered >= 1;
  }));
  EXPECT_EQ(handled, 0);
  EXPECT_EQ(p.server->FindPeer("evil"), nullptr);
  // The unregistered peer is told to register.
  bool told = false;
  for (int i = 0; i < 100 && !told; ++i) {
    auto r = (*raw)->Recv(10);
    ASSERT_TRUE(r.ok());
    if (r->has_value()) {
      auto in = proto::InMessage::Parse((*r)->bytes);
      told = in.ok() && (*in)->which() == proto::Body::NOT_REGISTERED;
    }
  }
  EXPECT_TRUE(told);
  // The server still serves well-behaved peers.
  ASSERT_TRUE(p.client->Start().ok());
  ASSERT_TRUE(PumpUntil(p, [&] { return p.client->registered(); }, sh));
}

// Frames to peers that never registered are numbered from one counter (no state per routing
// id: a stream of ids that never register costs the server nothing that grows), and a peer that
// then registers is numbered on above anything it was sent before.
TEST(Control, UnregisteredPeersShareOneNumberingAndARegistrationContinuesAboveIt) {
  Pair p;
  MakePair(&p);
  // The next frame of `which` that `raw` receives, by its seq (0: none within 200 rounds).
  auto next_seq = [&](ZmqDealerTransport* raw, proto::Body::Which which) -> uint64_t {
    for (int i = 0; i < 200; ++i) {
      p.server->Poll(5, nullptr);
      auto r = raw->Recv(5);
      if (!r.ok() || !r->has_value()) continue;
      auto in = proto::InMessage::Parse((*r)->bytes);
      if (in.ok() && (*in)->which() == which) return (*in)->seq();
    }
    return 0;
  };
  std::vector<std::unique_ptr<ZmqDealerTransport>> raws;
  uint64_t last = 0;
  for (int i = 0; i < 4; ++i) {
    const std::string id = "stranger-" + std::to_string(i);
    auto raw = ZmqDealerTransport::Connect(p.endpoint, id);
    ASSERT_TRUE(raw.ok());
    proto::OutMessage tc;
    tc.body().initTokenChunk().setRequestId(1);
    ASSERT_TRUE((*raw)->Send("", proto::Encode(tc, 1, id, 0)).ok());
    const uint64_t seq = next_seq(raw->get(), proto::Body::NOT_REGISTERED);
    ASSERT_GT(seq, last) << id;
    last = seq;
    raws.push_back(std::move(raw).value());
  }
  // The first stranger registers: its RegisterAck is numbered above every frame sent so far.
  proto::OutMessage reg;
  reg.body().initRegister().setWorkerId("stranger-0");
  ASSERT_TRUE(raws[0]->Send("", proto::Encode(reg, 2, "stranger-0", 0)).ok());
  const uint64_t ack = next_seq(raws[0].get(), proto::Body::REGISTER_ACK);
  EXPECT_GT(ack, last);
  ASSERT_NE(p.server->FindPeer("stranger-0"), nullptr);
}

// Polls the server (up to 200 rounds of 5 ms) until `raw` receives a RegisterAck that refuses
// it: that ack's reason, or nullopt when none came (or a receive failed).
std::optional<std::string> AwaitRefusal(Pair* p, ZmqDealerTransport* raw) {
  for (int i = 0; i < 200; ++i) {
    p->server->Poll(5, nullptr);
    auto r = raw->Recv(5);
    EXPECT_TRUE(r.ok());
    if (!r.ok()) return std::nullopt;
    if (!r->has_value()) continue;
    auto in = proto::InMessage::Parse((*r)->bytes);
    if (in.ok() && (*in)->which() == proto::Body::REGISTER_ACK && !(*in)->body().getRegisterAck().getAccepted()) {
      return proto::ToString((*in)->body().getRegisterAck().getReason());
    }
  }
  return std::nullopt;
}

TEST(Control, RegistrationWithMismatchedIdIsRefused) {
  Pair p;
  MakePair(&p);
  auto raw = ZmqDealerTransport::Connect(p.endpoint, "liar");
  ASSERT_TRUE(raw.ok());
  proto::OutMessage m;
  m.body().initRegister().setWorkerId("someone-else");
  ASSERT_TRUE((*raw)->Send("", proto::Encode(m, 1, "liar", 0)).ok());
  EXPECT_TRUE(AwaitRefusal(&p, raw->get()).has_value());
  EXPECT_EQ(p.server->FindPeer("liar"), nullptr);
}

// A peer whose routing id is not an id (a line break in it) is refused at Register, and every
// line the server logs about it, before and at the refusal, shows the id escaped: no byte of it
// can start a forged log line.
TEST(Control, RegistrationFromAnUnprintableRoutingIdIsRefusedAndLoggedEscaped) {
  std::mutex mu;
  std::vector<std::string> lines;
  SetLogSink([&](std::string_view line) {
    std::lock_guard<std::mutex> lock(mu);
    lines.emplace_back(line);
  });
  Pair p;
  MakePair(&p);
  const std::string id = "evil\n2026-01-01T00:00:00.000000Z E router 1:1 x.cc:1] forged";
  auto raw = ZmqDealerTransport::Connect(p.endpoint, id);
  ASSERT_TRUE(raw.ok());
  proto::OutMessage chunk;
  chunk.body().initTokenChunk().setRequestId(1);
  ASSERT_TRUE((*raw)->Send("", proto::Encode(chunk, 1, id, 0)).ok());
  proto::OutMessage m;
  m.body().initRegister().setWorkerId(id);
  ASSERT_TRUE((*raw)->Send("", proto::Encode(m, 2, id, 0)).ok());
  const std::optional<std::string> reason = AwaitRefusal(&p, raw->get());
  SetLogSink(nullptr);
  ASSERT_TRUE(reason.has_value());
  EXPECT_NE(reason->find("routing id"), std::string::npos) << *reason;
  EXPECT_EQ(p.server->FindPeer(id), nullptr);
  EXPECT_EQ(p.server->counters().unregistered, 1u);
  int escaped = 0;
  for (const std::string& line : lines) {
    EXPECT_EQ(line.find('\n'), line.size() - 1) << line;
    if (line.find("evil\\x0a2026-01-01") != std::string::npos) ++escaped;
  }
  EXPECT_GE(escaped, 2) << "the unregistered frame and the refusal, each with the id escaped";
}

// ---- fault injection over an in-memory transport ----

// Frames sent are appended to `wire`; Recv is unused.
class RecordingTransport final : public Transport {
 public:
  explicit RecordingTransport(std::deque<std::string>* wire) : wire_(wire) {}
  Status Send(std::string_view, std::string_view bytes) override {
    wire_->emplace_back(bytes);
    return Status::Ok();
  }
  Result<std::optional<Frame>> Recv(int) override { return std::optional<Frame>(); }
  std::string Describe() const override { return "recording"; }

 private:
  std::deque<std::string>* wire_;
};

// A transport on a manual clock: Recv hands out scripted frames, and when it has none it lets
// the requested wait pass on the clock. Sends are recorded with the clock time.
class ScriptedTransport final : public Transport {
 public:
  ScriptedTransport(ManualClock* clock, std::deque<Frame>* in,
                    std::vector<std::pair<uint64_t, std::string>>* sent)
      : clock_(clock), in_(in), sent_(sent) {}
  Status Send(std::string_view, std::string_view bytes) override {
    sent_->emplace_back(clock_->NowMs(), std::string(bytes));
    return Status::Ok();
  }
  Result<std::optional<Frame>> Recv(int timeout_ms) override {
    if (!in_->empty()) {
      Frame f = std::move(in_->front());
      in_->pop_front();
      return std::optional<Frame>(std::move(f));
    }
    if (timeout_ms > 0) clock_->Advance(static_cast<uint64_t>(timeout_ms));
    return std::optional<Frame>();
  }
  std::string Describe() const override { return "scripted"; }

 private:
  ManualClock* clock_;
  std::deque<Frame>* in_;
  std::vector<std::pair<uint64_t, std::string>>* sent_;
};

// A server polled with a long timeout (a router loop with nothing to do) still sends its
// heartbeats on time: a quiet link must not look dead to the workers.
TEST(Control, ServerPollNeverSleepsThroughAHeartbeat) {
  ManualClock clock;
  std::deque<Frame> in;
  std::vector<std::pair<uint64_t, std::string>> sent;
  ControlServer::Options so;
  so.heartbeat_ms = kBeatMs;
  ControlServer server(std::make_unique<ScriptedTransport>(&clock, &in, &sent), &clock, so);
  proto::OutMessage reg;
  reg.body().initRegister().setWorkerId("decode-0");
  in.push_back(Frame{"decode-0", proto::Encode(reg, 1, "decode-0", 0)});
  const uint64_t start = clock.NowMs();
  uint64_t seq = 1, last_beat = start;
  while (clock.NowMs() < start + 2000) {
    if (clock.NowMs() >= last_beat + kBeatMs) {
      proto::OutMessage hb;  // the worker beats too (it stays registered)
      hb.body().initHeartbeat();
      in.push_back(Frame{"decode-0", proto::Encode(hb, ++seq, "decode-0", 0)});
      last_beat = clock.NowMs();
    }
    server.Poll(1000, nullptr);
  }
  std::vector<uint64_t> beats;
  for (const auto& [at, bytes] : sent) {
    auto m = proto::InMessage::Parse(bytes);
    ASSERT_TRUE(m.ok());
    if ((*m)->which() == proto::Body::HEARTBEAT) beats.push_back(at);
  }
  ASSERT_GE(beats.size(), 10u);
  for (size_t i = 1; i < beats.size(); ++i) {
    EXPECT_LE(beats[i] - beats[i - 1], kBeatMs) << "heartbeat " << i;
  }
}

// A peer whose frames wait unread in the server's queue is alive: the server was the slow
// side. It is not declared dead while its frames are still queued.
TEST(Control, QueuedFramesKeepAPeerAliveAfterTheServerStalled) {
  ManualClock clock;
  std::deque<Frame> in;
  std::vector<std::pair<uint64_t, std::string>> sent;
  ControlServer::Options so;
  so.heartbeat_ms = kBeatMs;
  ControlServer server(std::make_unique<ScriptedTransport>(&clock, &in, &sent), &clock, so);
  std::vector<std::string> dead;
  server.on_peer_dead = [&](const std::string& id, const PeerInfo&) { dead.push_back(id); };
  uint64_t seq = 1;
  for (const char* id : {"busy", "quiet"}) {
    proto::OutMessage reg;
    reg.body().initRegister().setWorkerId(id);
    in.push_back(Frame{id, proto::Encode(reg, seq, id, 0)});
  }
  server.Poll(0, nullptr);
  ASSERT_NE(server.FindPeer("quiet"), nullptr);
  // The server stalls for a second; meanwhile "busy" sends 600 frames, then "quiet" beats.
  clock.Advance(1000);
  for (int i = 0; i < 600; ++i) {
    proto::OutMessage tc;
    tc.body().initTokenChunk().setRequestId(1);
    in.push_back(Frame{"busy", proto::Encode(tc, ++seq, "busy", 0)});
  }
  proto::OutMessage hb;
  hb.body().initHeartbeat();
  in.push_back(Frame{"quiet", proto::Encode(hb, 2, "quiet", 0)});
  for (int i = 0; i < 5 && !in.empty(); ++i) server.Poll(0, nullptr);
  EXPECT_TRUE(in.empty());
  EXPECT_TRUE(dead.empty()) << dead.front() << " declared dead with its heartbeat still queued";
  EXPECT_NE(server.FindPeer("quiet"), nullptr);
}

TEST(FaultTransport, FailAfterN) {
  ManualClock clock;
  std::deque<std::string> wire;
  FaultConfig fc;
  fc.fail_after = 3;
  FaultInjectingTransport t(std::make_unique<RecordingTransport>(&wire), fc, &clock);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(t.Send("", "x").ok());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(t.Send("", "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(wire.size(), 3u);
  EXPECT_EQ(t.counters().failed, 5u);
}

TEST(FaultTransport, DropIsSeededAndCounted) {
  ManualClock clock;
  std::deque<std::string> wire;
  FaultConfig fc;
  fc.drop_rate = 0.25;
  fc.seed = 99;
  FaultInjectingTransport t(std::make_unique<RecordingTransport>(&wire), fc, &clock);
  for (int i = 0; i < 4000; ++i) ASSERT_TRUE(t.Send("", "frame").ok());
  EXPECT_EQ(wire.size() + t.counters().dropped, 4000u);
  EXPECT_GT(t.counters().dropped, 800u);   // 1000 expected
  EXPECT_LT(t.counters().dropped, 1200u);
  // Same seed, same drops.
  std::deque<std::string> wire2;
  FaultInjectingTransport t2(std::make_unique<RecordingTransport>(&wire2), fc, &clock);
  for (int i = 0; i < 4000; ++i) ASSERT_TRUE(t2.Send("", "frame").ok());
  EXPECT_EQ(t2.counters().dropped, t.counters().dropped);
}

TEST(FaultTransport, DelayHoldsFramesUntilDue) {
  ManualClock clock;
  std::deque<std::string> wire;
  FaultConfig fc;
  fc.delay_ms = 50;
  FaultInjectingTransport t(std::make_unique<RecordingTransport>(&wire), fc, &clock);
  ASSERT_TRUE(t.Send("", "a").ok());
  clock.Advance(20);
  ASSERT_TRUE(t.Send("", "b").ok());
  EXPECT_TRUE(wire.empty());
  clock.Advance(30);
  ASSERT_TRUE(t.FlushDue().ok());
  ASSERT_EQ(wire.size(), 1u);
  EXPECT_EQ(wire[0], "a");
  clock.Advance(20);
  ASSERT_TRUE(t.Recv(0).ok());
  ASSERT_EQ(wire.size(), 2u);
  EXPECT_EQ(wire[1], "b");
}

TEST(FaultTransport, CorruptChangesBytes) {
  ManualClock clock;
  std::deque<std::string> wire;
  FaultConfig fc;
  fc.corrupt_rate = 1.0;
  FaultInjectingTransport t(std::make_unique<RecordingTransport>(&wire), fc, &clock);
  const std::string frame(64, 'z');
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(t.Send("", frame).ok());
  ASSERT_EQ(wire.size(), 100u);
  for (const auto& f : wire) EXPECT_NE(f, frame);
}

TEST(Control, CorruptingLinkNeverRegistersButNeverCrashes) {
  Pair p;
  FaultConfig fc;
  fc.corrupt_rate = 1.0;
  fc.seed = 5;
  MakePair(&p, &fc);
  ASSERT_TRUE(p.client->Start().ok());
  for (int i = 0; i < 40; ++i) {
    p.clock.Advance(kBeatMs);
    p.server->Poll(2, nullptr);
    p.client->Poll(2, nullptr);
  }
  // Some corruptions land in data words and still parse; a registration whose id bytes were
  // hit is refused, so the peer is either absent or registered under its true id.
  const auto& c = p.server->counters();
  EXPECT_GT(c.malformed + c.wrong_version + c.unregistered + c.duplicates + c.handler_errors +
                c.received,
            0u);
  for (const auto& [id, info] : p.server->peers()) EXPECT_EQ(id, "decode-0");
}

TEST(Control, LossyLinkStaysRegisteredAndCountsLostFrames) {
  Pair p;
  FaultConfig fc;
  fc.drop_rate = 0.3;
  fc.seed = 11;
  MakePair(&p, &fc);
  std::vector<std::string> dead;
  p.server->on_peer_dead = [&](const std::string& id, const PeerInfo&) { dead.push_back(id); };
  ASSERT_TRUE(p.client->Start().ok());
  for (int i = 0; i < 60 && !p.client->registered(); ++i) {
    p.clock.Advance(kBeatMs);
    p.server->Poll(5, nullptr);
    p.client->Poll(5, nullptr);
  }
  ASSERT_TRUE(p.client->registered());
  for (int beat = 0; beat < 60; ++beat) {
    p.clock.Advance(kBeatMs / 2);
    p.client->Poll(0, nullptr);
    p.server->Poll(5, nullptr);
  }
  // 30% loss never silences the client for 3 whole beats here (fixed seed), and the gaps in
  // its sequence numbers are visible.
  EXPECT_TRUE(dead.empty());
  EXPECT_GT(p.server->counters().lost, 0u);
}

}  // namespace
}  // namespace pw::transport
