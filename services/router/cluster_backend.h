// ClusterBackend: the router's side of the control-plane protocol with prefill and decode
// workers (services/proto/cluster.capnp), over a ZeroMQ ROUTER socket the workers connect to.
//
// Per request (DESIGN.md section 2, "Request path"):
//   1. place: decode worker D with the most free KV blocks (last heartbeat, minus the blocks of
//      this router's requests placed there within the last two heartbeat intervals, which the
//      heartbeat may not show yet; ties go to fewer requests) among those running fewer than
//      their maxBatch of this router's requests; prefill worker P with the fewest queued prompt
//      tokens (last heartbeat, plus prompt tokens of this router's requests prefilling there),
//      with a KV layout hash equal to D's;
//   2. router -> D  KvReserve(numTokens, leaseMs)         D -> router KvReserveReply(lease, blocks)
//   3. router -> P  PrefillRequest(tokens, D's KV memory, blocks, lease)
//                                                          P -> router KvReady(firstToken)
//   4. router -> D  StartDecode(lease, tokens, firstToken) D -> router TokenChunk*, Finish
//   Cancel (client gone, stop sequence matched, timeout): router -> D (and P while it
//   prefills) Cancel(requestId, leaseId); both free what the request holds.
// Failures: when a worker is declared dead (silent for 3 heartbeats) or re-registers from a new
// process, every request it held is placed again from step 1 with tokens = prompt + the tokens
// already delivered, and generatedSoFar = their count, so the stream continues at the next
// output index with no gap and no repeat. A lease refused for lack of KV is retried after a
// short backoff; other failures are retried up to `max_attempts` times, then reported. A worker
// that registers again with the same process (it lost the router for 3 heartbeats and dropped
// its requests) is treated like a dead one for the requests it held, and a reservation or
// prefill that gets no answer within phase_timeout_ms is cancelled and placed again.
//
// Threading: one backend thread owns the ControlServer and all request state. Submit/Cancel
// queue commands and wake it through a DEALER connected to its own ROUTER (frames from that
// peer are never parsed). Load() reads a snapshot published by the backend thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "services/router/backend.h"
#include "services/transport/control.h"

namespace pw::router {

struct ClusterBackendOptions {
  std::string bind = "tcp://127.0.0.1:5555";  // ROUTER endpoint workers connect to
  std::string model_name;     // workers registering another non-empty model are refused
  std::string id = "router";  // senderId on the control plane
  uint64_t heartbeat_ms = 500;
  uint32_t dead_after_beats = 3;
  uint32_t lease_ms = 30000;  // KV reservation lease sent with KvReserve
  // A reservation or prefill with no answer for this long is cancelled and placed again (a
  // lost message must not strand a request).
  uint64_t phase_timeout_ms = 30000;
  int max_attempts = 3;             // placements per request after worker failures
  uint32_t default_max_batch = 64;  // when a decode worker registers maxBatch 0
};

class ClusterBackend final : public GenerationBackend {
 public:
  // Binds the ROUTER socket. Start() launches the backend thread.
  static Result<std::unique_ptr<ClusterBackend>> Create(ClusterBackendOptions options);
  ~ClusterBackend() override;

  void Start();
  // Stops the thread; in-flight requests are cancelled on the workers. Idempotent.
  void Stop();
  // The bound endpoint with its port resolved.
  const std::string& endpoint() const { return endpoint_; }

  void SetEvents(GenerationEvents* events) override { events_ = events; }
  Status Submit(GenerationRequest request) override;
  void Cancel(uint64_t id) override;
  BackendLoad Load() const override;

 private:
  enum class Phase { kPending, kReserving, kPrefilling, kDecoding };
  struct Req {
    GenerationRequest request;
    Phase phase = Phase::kPending;
    std::string decode_peer;
    std::string prefill_peer;
    uint64_t lease_id = 0;
    std::vector<uint32_t> block_ids;
    std::vector<int32_t> generated;      // output tokens delivered to the router, in order
    int attempts = 0;                    // placements made
    uint64_t not_before_ms = 0;          // retry backoff
    uint64_t phase_deadline_ms = 0;      // kReserving / kPrefilling: answer expected by then
    uint64_t placed_at_ms = 0;           // when KvReserve was sent
    std::vector<std::string> failed_on;  // workers this request failed on (avoided if possible)
  };
  // What a worker registered with (read once per process instance).
  struct WorkerStatic {
    uint32_t pid = 0;
    wire::Role role = wire::Role::UNKNOWN;
    uint32_t max_batch = 0;
    uint64_t layout_hash = 0;
    uint32_t block_tokens = 0;
    // Decode workers: the KV layout and registered KV pool, copied once from the registration
    // (reading a kept Cap'n Proto message again and again exhausts its traversal budget).
    uint32_t num_blocks = 0;
    uint64_t block_bytes = 0;
    std::string worker_address;  // UcxMemory.workerAddress bytes
    std::string rkey;            // UcxMemory.rkey bytes
    uint64_t base_addr = 0;
    uint64_t region_bytes = 0;
  };
  struct Command {
    enum Kind { kSubmit, kCancel } kind;
    GenerationRequest request;  // kSubmit
    uint64_t id = 0;            // kCancel
  };

  ClusterBackend(ClusterBackendOptions options, std::string endpoint);
  void Run();
  void DrainCommands();
  void DispatchPending();
  // Tries to place `r` (phase kPending); true when KvReserve was sent.
  bool Place(uint64_t id, Req& r);
  Status Handle(const std::string& peer, const proto::InMessage& msg);
  void OnReserveReply(const std::string& peer, wire::KvReserveReply::Reader m);
  void OnKvReady(const std::string& peer, wire::KvReady::Reader m);
  void OnTokenChunk(const std::string& peer, wire::TokenChunk::Reader m);
  void OnFinish(const std::string& peer, wire::Finish::Reader m);
  // Re-places every request `peer` held (it died, or re-registered and so dropped them).
  void OnPeerLost(const std::string& peer, const std::string& why);
  // Re-places requests whose reservation or prefill got no answer in time.
  void CheckPhaseTimeouts();
  // Puts `r` back to pending after a failure (or fails it after max_attempts).
  void Retry(uint64_t id, Req& r, const std::string& why);
  void SendCancel(const std::string& peer, uint64_t id, uint64_t lease_id);
  void Finish(uint64_t id, FinishReason reason, Status error);
  const WorkerStatic* StaticOf(const transport::PeerInfo& info);
  void PublishLoad();
  uint64_t NowMs() const;

  ClusterBackendOptions options_;
  std::string endpoint_;
  GenerationEvents* events_ = nullptr;
  std::unique_ptr<transport::ControlServer> server_;  // backend thread only
  std::thread thread_;
  std::atomic<bool> stop_{false};

  // Commands from other threads, and the wake-up DEALER (guarded by cmd_mu_).
  std::mutex cmd_mu_;
  std::vector<Command> commands_;
  std::unique_ptr<transport::Transport> waker_;
  bool wake_pending_ = false;

  // Backend thread only.
  std::map<uint64_t, Req> reqs_;
  std::map<std::string, WorkerStatic> statics_;
  uint64_t replaced_ = 0;  // Retry() calls that placed a request again

  mutable std::mutex load_mu_;
  BackendLoad load_;  // guarded by load_mu_
};

}  // namespace pw::router
