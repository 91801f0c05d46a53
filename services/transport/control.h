// Control-plane endpoints over a Transport: registration, heartbeats, liveness, validation.
//
// ControlServer sits on a ROUTER (router, broker); ControlClient on a DEALER (workers).
// Both are single-threaded: call Poll() from one loop, which receives, validates and
// dispatches frames and runs the heartbeat timers (a client's owner may also send due
// heartbeats from another thread with HeartbeatIfDue, serialized with every other call). Frames that fail validation (malformed,
// another protocol major version, unknown body) are logged and dropped, never fatal.
//
// Protocol (docs/architecture.md):
//   client -> server  Register            (repeated every heartbeat until acknowledged)
//   server -> client  RegisterAck         (accepted, serverInstance)
//   both ways         Heartbeat           every heartbeat_ms; silent for 3 beats = dead
//   server -> client  NotRegistered       when an unknown peer sends anything else
// A client re-registers when the server's instance id changes (server restarted), when it
// gets NotRegistered while registered (one Register for a burst of them), or when the server
// has been silent for 3 beats. A Register repeated by the same process before it handled the
// ack (it sent nothing else, and the Register's ackSeq, the seq of the last RegisterAck the
// client accepted, is below this registration's ack) is acknowledged again, not taken as a new
// registration.
// Sequence numbers are per link and registration: a receiver drops a frame whose seq is not
// above the last one seen on that link and counts gaps as lost frames. Every accepted
// registration starts the numbering afresh on both sides: the server takes the Register's seq
// as the last seen from the client, and the client takes the RegisterAck's seq as the last
// seen from the server (a server that forgot the client, having declared it dead, numbers its
// frames to it anew, and a restarted server from 1).
// Acknowledgement: every client frame carries ackSeq, the seq of the last server frame the
// client has handled in its current registration (0 while unregistered). The server keeps the
// highest per registration (PeerInfo::acked_seq, PeerInfo::epoch): acked_seq >= s proves that
// the client's handler for the server's frame s has returned.
// Liveness: a peer is declared dead only after the receive queue has been drained, so frames
// that wait unread (the owner was busy, or a burst filled the queue) count as signs of life.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "services/proto/codec.h"
#include "common/clock.h"
#include "services/transport/liveness.h"
#include "services/transport/transport.h"

namespace pw::transport {

// Load a worker last reported in its heartbeat.
struct PeerLoad {
  uint32_t free_kv_blocks = 0;
  uint32_t used_kv_blocks = 0;
  uint32_t reserved_kv_blocks = 0;
  uint32_t running_requests = 0;
  uint32_t waiting_requests = 0;
  uint64_t queued_prompt_tokens = 0;
  bool draining = false;
  uint32_t kv_capacity_blocks = 0;  // decode: KV blocks the pool can hold at most (0: not said)
};

// Counters of frames refused or lost (exported as metrics by the owner).
struct ControlCounters {
  uint64_t received = 0;         // frames that passed validation
  uint64_t malformed = 0;        // failed framing / pointer validation
  uint64_t wrong_version = 0;    // another protocol major version or unknown body member
  uint64_t unregistered = 0;     // from a peer that has not registered
  uint64_t duplicates = 0;       // seq not above the last seen
  uint64_t lost = 0;             // sum of seq gaps
  uint64_t handler_errors = 0;   // handler returned an error or read malformed fields
  uint64_t send_errors = 0;
};

// A registered peer, as the server knows it.
struct PeerInfo {
  std::string id;                             // ZeroMQ routing id
  wire::Role role = wire::Role::UNKNOWN;
  uint32_t pid = 0;
  std::shared_ptr<proto::InMessage> registration;  // the Register frame, kept for its fields
  PeerLoad load;
  uint64_t last_seq_in = 0;
  uint64_t next_seq_out = 1;
  uint64_t epoch = 0;      // changes at every accepted registration (server-wide counter)
  uint64_t acked_seq = 0;  // highest ackSeq the peer sent in this registration
  uint64_t heartbeats = 0; // Heartbeat frames accepted from this peer since it registered
  uint64_t frames = 0;     // frames other than Register accepted since it registered
  uint64_t register_ack_seq = 0;  // seq of the RegisterAck that accepted this registration
};

// Handler for application messages; an error is logged and counted, the frame dropped.
using MessageHandler = std::function<Status(const std::string& peer, const proto::InMessage&)>;

class ControlServer {
 public:
  struct Options {
    std::string id = "server";    // senderId of this process
    uint64_t heartbeat_ms = 500;
    uint32_t dead_after_beats = 3;
  };
  // `clock` must outlive the server.
  ControlServer(std::unique_ptr<Transport> transport, const Clock* clock, Options options);

  // Accept or refuse a registration (default: accept). A refusal's message goes back as reason.
  // `version_minor`: the protocol minor version the peer's envelope carries.
  std::function<Status(const std::string& peer, wire::Register::Reader reg, uint16_t version_minor)>
      on_register;
  // A registered peer died (silent for dead_after_beats) or re-registered from a new process.
  std::function<void(const std::string& peer, const PeerInfo& info)> on_peer_dead;
  // Fills the server's own heartbeat (serverInstance is set by the server).
  std::function<void(wire::Heartbeat::Builder)> fill_heartbeat;

  // Waits up to timeout_ms for frames, handles every frame then available, runs timers.
  // Returns the number of frames received.
  int Poll(int timeout_ms, const MessageHandler& handler);
  // Sends `msg` to a registered or unregistered peer (stamps version, per-link seq, sender).
  // `seq_out`, when given, receives the seq the frame was stamped with.
  Status Send(const std::string& peer, proto::OutMessage& msg, uint64_t* seq_out = nullptr);
  // Runs heartbeat and expiry timers now (Poll calls it too).
  void Tick() { RunTimers(/*sweep=*/true); }

  const std::map<std::string, PeerInfo>& peers() const { return peers_; }
  const PeerInfo* FindPeer(const std::string& peer) const;
  uint64_t instance() const { return instance_; }
  const ControlCounters& counters() const { return counters_; }
  const Transport& transport() const { return *transport_; }

 private:
  void HandleFrame(Frame frame, const MessageHandler& handler);
  void HandleRegister(const std::string& peer, std::shared_ptr<proto::InMessage> msg);
  // Heartbeats; with `sweep`, also declares silent peers dead.
  void RunTimers(bool sweep);

  std::unique_ptr<Transport> transport_;
  const Clock* clock_;
  Options options_;
  uint64_t instance_;
  PeerLiveness liveness_;
  std::map<std::string, PeerInfo> peers_;
  // Frames to peers that have not registered (NotRegistered, refused RegisterAcks) are numbered
  // from one counter for all of them: no state is kept per routing id that never registers, and
  // a peer that registers is numbered on from it (above anything it was sent before; its
  // client takes the RegisterAck's seq as the last seen).
  uint64_t unregistered_seq_out_ = 0;
  uint64_t next_heartbeat_ms_ = 0;
  uint64_t next_epoch_ = 1;
  ControlCounters counters_;
};

class ControlClient {
 public:
  struct Options {
    std::string id;               // routing id / senderId; unique per process instance
    wire::Role role = wire::Role::UNKNOWN;
    uint64_t heartbeat_ms = 500;
    uint32_t dead_after_beats = 3;
  };
  ControlClient(std::unique_ptr<Transport> transport, const Clock* clock, Options options);

  // Fills the Register body (role, id, pid and heartbeat interval are set already).
  std::function<void(wire::Register::Builder)> fill_register;
  std::function<void(wire::Heartbeat::Builder)> fill_heartbeat;
  // The server accepted a registration (first time, or again after it restarted).
  std::function<void()> on_registered;
  // The server was silent for dead_after_beats intervals (the client then reconnects its
  // transport, see Transport::Reconnect, and registers again).
  std::function<void()> on_server_lost;

  // Sends the first Register. Later ones are sent by Poll until acknowledged.
  Status Start();
  // Waits up to timeout_ms for frames, handles every frame then available, runs timers.
  int Poll(int timeout_ms, const MessageHandler& handler);
  // Stamps and sends `msg` to the server.
  Status Send(proto::OutMessage& msg);
  void Tick() { RunTimers(/*sweep=*/true); }
  // Sends the Heartbeat that is due, if one is and the client is registered, filled by `fill`
  // instead of fill_heartbeat; Poll's next heartbeat is then an interval later. Receives
  // nothing, registers nothing, declares nothing lost and runs no other callback: it keeps the
  // link alive from another thread while the thread that polls is busy, the caller serializing
  // it with every other use of this client. True when a heartbeat went out.
  bool HeartbeatIfDue(const std::function<void(wire::Heartbeat::Builder)>& fill);

  bool registered() const { return registered_; }
  uint64_t server_instance() const { return server_instance_; }
  const ControlCounters& counters() const { return counters_; }

 private:
  Status SendRegister();
  void HandleFrame(Frame frame, const MessageHandler& handler);
  void MarkLost(const char* why);
  void RunTimers(bool sweep);
  Status SendHeartbeat(const std::function<void(wire::Heartbeat::Builder)>& fill);

  std::unique_ptr<Transport> transport_;
  const Clock* clock_;
  Options options_;
  PeerLiveness liveness_;
  bool registered_ = false;
  uint64_t server_instance_ = 0;
  uint64_t next_seq_out_ = 1;
  uint64_t last_seq_in_ = 0;
  uint64_t last_ack_seq_ = 0;  // seq of the last RegisterAck accepted (sent in Registers)
  uint64_t next_timer_ms_ = 0;
  ControlCounters counters_;
};

}  // namespace pw::transport
