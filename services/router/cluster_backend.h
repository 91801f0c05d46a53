// ClusterBackend: the router's side of the control-plane protocol with prefill and decode
// workers (services/proto/cluster.capnp), over a ZeroMQ ROUTER socket the workers connect to.
//
// Per request (DESIGN.md section 2, "Request path"):
//   1. place: decode worker D with the most free KV blocks (last heartbeat, minus the blocks of
//      this router's requests placed there within the last two heartbeat intervals, which the
//      heartbeat may not show yet; ties go to fewer requests) among those holding fewer than
//      maxBatch + prefill_ahead of this router's requests; prefill worker P with the fewest
//      queued prompt tokens (last heartbeat, plus prompt tokens of this router's requests
//      prefilling there),
//      with a KV layout hash equal to D's;
//   2. router -> D  KvReserve(numTokens, leaseMs)         D -> router KvReserveReply(lease, blocks)
//   3. router -> P  PrefillRequest(tokens, D's KV memory, blocks, lease)
//                                                          P -> router KvReady(firstToken)
//      (until StartDecode the router renews the lease on D, KvRenew, every third of lease_ms:
//      a request queued behind other prompts keeps its blocks)
//   4. router -> D  StartDecode(lease, tokens, firstToken) D -> router TokenChunk*, Finish
//      (the first token streams at KvReady; when D already decodes maxBatch of our requests,
//      StartDecode waits until one of them ends: at most maxBatch decode at once on D)
//   Cancel (client gone, stop sequence matched, timeout): router -> D (and P while it
//   prefills) Cancel(requestId, leaseId); both free what the request holds.
// Failures: when a worker is declared dead (silent for 3 heartbeats) or re-registers from a new
// process, every request it held is placed again from step 1: KvReserve for the prompt + the
// tokens already delivered, the prefill worker writes the prompt's KV as the first time (its
// first token, already delivered, is dropped), and StartDecode carries prompt + delivered
// tokens with generatedSoFar = their count and uncachedTokens = those before the last: the
// decode worker computes their KV itself, with its own experts, as the lost one had decoded
// them. The stream continues at the next output index with no gap and no repeat. A lease
// refused for lack of KV is retried after a short backoff; other failures are retried up to
// `max_attempts` times, then reported. A worker that registers again with the same process (it
// lost the router for 3 heartbeats and dropped its requests) is treated like a dead one for the
// requests it held, and a reservation or prefill that gets no answer within phase_timeout_ms
// is cancelled and placed again. A worker's refusal of the request's own values (errorKind
// invalidRequest) ends it at once with kInvalidArgument, neither placed again nor counted
// against the worker.
// A worker this router could not send to (its connection is gone: SIGKILL, a crash) is
// unreachable until it is heard from again (a heartbeat, a new registration) or declared dead:
// placement skips it and Load() does not count it. A request whose message never reached its
// worker goes back to pending without using one of its max_attempts, and waits there for a
// live worker (the router's request timeout bounds the wait; while no worker of a role is
// reachable, capacity is 0 and new requests wait in the router's admission queue).
//
// Writer fences: a lease handed to a prefill worker and then given up before StartDecode
// (client gone, timeout, a worker lost) may still be written by that prefill worker with
// one-sided puts. Its decode worker quarantines the blocks; this router tells it when the
// writer can no longer write (Cancel with writerDone): when the lease's KvReady arrives;
// cancel_grace_ms after the prefill worker acknowledged (ackSeq) the Cancel sent to it or
// registered again (it cancelled all its work first; a cancelled transfer stops within that
// time); or once it has been gone for writer_grace_ms. A lease never handed to a prefill
// worker is released at once. See docs/architecture.md, Failures.
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

#include "services/common/main_loop_beat.h"
#include "services/common/registration_check.h"
#include "services/router/backend.h"
#include "services/transport/control.h"

namespace pw::router {

struct ClusterBackendOptions {
  std::string bind = "tcp://127.0.0.1:5555";  // ROUTER endpoint workers connect to
  std::string model_name;     // workers registering another non-empty model are refused
  // A worker's Register is refused (with the reason, logged) unless its KV layout is the served
  // model's and its numbers within bounds (services/common/registration_check.h); pw-router
  // sets the model from config.json.
  service::RegistrationLimits registration;
  std::string id = "router";  // senderId on the control plane
  uint64_t heartbeat_ms = 500;
  uint32_t dead_after_beats = 3;
  // /live fails once the backend thread's loop has not come round for this long
  // (services/common/main_loop_beat.h).
  int64_t main_loop_stale_ms = service::kDefaultMainLoopStaleMs;
  // KV reservation lease sent with KvReserve; renewed every third of it while the request is
  // queued behind prefill or waits for a decode slot.
  uint32_t lease_ms = 30000;
  // A reservation or prefill with no answer for this long is cancelled and placed again (a
  // lost message must not strand a request).
  uint64_t phase_timeout_ms = 30000;
  int max_attempts = 3;             // placements per request after worker failures
  // A prefill worker declared dead may be slow, not gone: the blocks it was to write stay
  // quarantined for this long after its death (longer than any one prefill and its puts).
  uint64_t writer_grace_ms = 60000;
  // A prefill worker that handled our Cancel (or registered again) stops writing the lease
  // within this long (its cancelled transfer flushes what was posted, then closes).
  uint64_t cancel_grace_ms = 5000;
  uint32_t default_max_batch = 64;  // when a decode worker registers maxBatch 0
  // Prefill ahead of a decode slot: up to this many requests per decode worker beyond its
  // maxBatch are reserved and prefilled while its batch is full; their first token streams at
  // once and StartDecode waits (phase kReady, FIFO) until a running request there ends, so the
  // decode batch never exceeds maxBatch. -1: maxBatch / 4; 0: none (requests wait in the
  // router's queue until a slot frees).
  int32_t prefill_ahead = -1;
};

class ClusterBackend final : public GenerationBackend {
 public:
  // Binds the ROUTER socket. Start() launches the backend thread.
  static Result<std::unique_ptr<ClusterBackend>> Create(ClusterBackendOptions options);
  // Over `control` (the workers' frames: the ROUTER socket in Create above), `waker` (Submit
  // and Cancel send on it so a poll in progress ends) and `clock`, which outlives the backend;
  // `endpoint` is what endpoint() reports. Create above is this over ZeroMQ and the steady
  // clock; the control-frame fuzz target (fuzz/router_cluster_backend_fuzz.cc) uses it
  // in memory with a manual clock.
  static std::unique_ptr<ClusterBackend> Create(ClusterBackendOptions options,
                                                std::unique_ptr<transport::Transport> control,
                                                std::unique_ptr<transport::Transport> waker,
                                                const Clock* clock,
                                                std::string endpoint);
  ~ClusterBackend() override;

  void Start();
  // Stops the thread; in-flight requests are cancelled on the workers. Idempotent.
  void Stop();
  // The bound endpoint with its port resolved.
  const std::string& endpoint() const { return endpoint_; }
  // Leases waiting for their prefill worker to be done (backend thread; tests read it after
  // Stop()).
  size_t fences() const { return fences_.size(); }

  void SetEvents(GenerationEvents* events) override { events_ = events; }
  Status Submit(GenerationRequest request) override;
  void Cancel(uint64_t id) override;
  BackendLoad Load() const override;
  std::string NotLive() const override { return beat_.NotLive(); }

  // One turn of the backend thread's loop: queued commands, phase timeouts, fences, placement,
  // then the frames that arrive within `max_poll_ms` (10 ms at most while requests wait).
  // Start()'s thread calls it until stopped; without Start(), its caller is the backend thread.
  void RunOnce(int max_poll_ms);

 private:
  // kReady: prefilled (first token delivered), waiting for a decode slot (prefill_ahead).
  enum class Phase { kPending, kReserving, kPrefilling, kReady, kDecoding };
  struct Req {
    GenerationRequest request;
    Phase phase = Phase::kPending;
    std::string decode_peer;
    std::string prefill_peer;
    uint64_t lease_id = 0;
    std::vector<uint32_t> block_ids;
    std::vector<uint32_t> page_ids;   // the blocks' pages in the decode worker's pool
    std::vector<int32_t> generated;      // output tokens delivered to the router, in order
    int attempts = 0;                    // placements made
    uint64_t not_before_ms = 0;          // retry backoff
    uint64_t phase_deadline_ms = 0;      // kReserving / kPrefilling: answer expected by then
    uint64_t placed_at_ms = 0;           // when KvReserve was sent
    uint64_t reserve_seq = 0;            // its seq: a reply acking less answers an earlier one
    uint64_t prefill_epoch = 0;          // prefill peer's registration when PrefillRequest went
    uint32_t decode_pid = 0;             // the decode process that granted the lease
    std::vector<std::string> failed_on;  // workers this request failed on (avoided if possible)
    std::vector<uint32_t> prompt_routing;  // KvReady.promptRouting, passed on in StartDecode
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
    uint64_t page_bytes = 0;   // KV pages (memory/kv_blocks.h)
    uint64_t layer_bytes = 0;
    uint32_t num_layers = 0;
    uint32_t pages_per_block = 0;  // KvLayout.pagesPerBlock as registered (0: before 1.3)
    std::string worker_address;  // UcxMemory.workerAddress bytes
    std::string rkey;            // UcxMemory.rkey bytes
    uint64_t base_addr = 0;
    uint64_t region_bytes = 0;
    std::string node;            // Register.nodeName (placement); empty from a 1.0 worker
  };
  // A lease given up while its prefill worker may still write it (see the file comment).
  struct Fence {
    std::string decode_peer;
    uint32_t decode_pid = 0;     // lease ids are per decode process: release only to it
    uint64_t request_id = 0;
    uint64_t lease_id = 0;
    std::string prefill_peer;
    uint64_t prefill_epoch = 0;  // the registration that got the PrefillRequest
    uint64_t cancel_seq = 0;     // seq of the Cancel sent to the prefill worker; 0 = none sent
    uint64_t gone_since_ms = 0;     // when the prefill worker was first seen unregistered
    uint64_t stopped_since_ms = 0;  // when it was first seen to have handled the Cancel
  };
  struct Command {
    enum Kind { kSubmit, kCancel } kind;
    GenerationRequest request;  // kSubmit
    uint64_t id = 0;            // kCancel
  };

  ClusterBackend(ClusterBackendOptions options, std::string endpoint,
                 const Clock* clock);
  void Run();
  void DrainCommands();
  void DispatchPending();
  // Tries to place `r` (phase kPending); true when KvReserve was sent.
  bool Place(uint64_t id, Req& r);
  // Requests a decode worker takes beyond its maxBatch while its batch is full.
  int64_t AheadOf(const WorkerStatic& ws) const;
  // Sends StartDecode (phase kDecoding after).
  void StartDecode(uint64_t id, Req& r);
  // Starts kReady requests, oldest first, on decode workers with a free slot.
  void StartReady();
  // Requests in phase kDecoding on `peer`.
  int64_t DecodingOn(const std::string& peer) const;
  Status Handle(const std::string& peer, const proto::InMessage& msg);
  // `ack_seq`: the reply frame's ackSeq (the last frame of ours its sender had handled).
  void OnReserveReply(const std::string& peer, wire::KvReserveReply::Reader m, uint64_t ack_seq);
  void OnKvReady(const std::string& peer, wire::KvReady::Reader m);
  // A first placement's KvReady: streams its first token (and the prompt log-probabilities);
  // false when the request ended there (finished, or placed again).
  bool DeliverFirstToken(uint64_t id, Req& r, const std::string& peer, wire::KvReady::Reader m);
  void OnTokenChunk(const std::string& peer, wire::TokenChunk::Reader m);
  void OnFinish(const std::string& peer, wire::Finish::Reader m);
  // Re-places every request `peer` held (it died, or re-registered and so dropped them).
  void OnPeerLost(const std::string& peer, const std::string& why);
  // Re-places requests whose reservation or prefill got no answer in time.
  void CheckPhaseTimeouts();
  // Every third of lease_ms: renews (KvRenew) the leases of requests queued behind prefill or
  // waiting for a decode slot, so a lease runs out only for a request this router forgot.
  void RenewLeases();
  // Puts `r` back to pending after a failure (or fails it after max_attempts). `counted` =
  // false: the placement never reached its worker (a failed send), so it does not count.
  void Retry(uint64_t id, Req& r, const std::string& why, bool counted = true);
  // A send to `peer` failed: skip it until it is heard from again (see the file comment).
  void MarkUnreachable(const std::string& peer);
  bool Reachable(const transport::PeerInfo& info);
  // Sends Cancel; `seq_out` gets its seq (0 when not sent).
  void SendCancel(const std::string& peer, uint64_t id, uint64_t lease_id, bool writer_done = false,
                  uint64_t* seq_out = nullptr);
  // Gives up what `r`'s current placement holds on its workers: the decode worker's lease or
  // running sequence and the prefill worker's queued prompt; fences a lease its prefill worker
  // may still write.
  void ReleasePlacement(uint64_t id, Req& r);
  // The prefill worker of a fenced lease is done with it: release its blocks.
  void WriterDone(const std::string& decode_peer, uint64_t id, uint64_t lease_id);
  void ReleaseFence(const Fence& f);
  void CheckFences();
  // `param`: see GenerationEvents::OnFinished.
  void Finish(uint64_t id, FinishReason reason, Status error, std::string param = "");
  const WorkerStatic* StaticOf(const transport::PeerInfo& info);
  void PublishLoad();
  uint64_t NowMs() const;

  ClusterBackendOptions options_;
  std::string endpoint_;
  const Clock* clock_;
  GenerationEvents* events_ = nullptr;
  std::unique_ptr<transport::ControlServer> server_;  // backend thread only
  std::thread thread_;
  std::atomic<bool> stop_{false};
  service::MainLoopBeat beat_;  // RunOnce beats it

  // Commands from other threads, and the wake-up DEALER (guarded by cmd_mu_).
  std::mutex cmd_mu_;
  std::vector<Command> commands_;
  std::unique_ptr<transport::Transport> waker_;
  bool wake_pending_ = false;

  // Backend thread only.
  std::map<uint64_t, Req> reqs_;
  std::map<std::string, WorkerStatic> statics_;
  uint64_t replaced_ = 0;  // Retry() calls that placed a request again
  uint64_t last_renew_ms_ = 0;
  std::vector<Fence> fences_;
  // Workers a send failed to, with their registration epoch and heartbeat count then: they
  // are reachable again once either moves.
  struct Unreachable {
    uint64_t epoch = 0;
    uint64_t heartbeats = 0;
  };
  std::map<std::string, Unreachable> unreachable_;

  mutable std::mutex load_mu_;
  BackendLoad load_;  // guarded by load_mu_
};

}  // namespace pw::router
