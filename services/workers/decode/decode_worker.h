// DecodeWorker: the library behind pw-decode.
//
// Owns an Engine (continuous batching over a paged KV pool), registers the pool with UCX so
// prefill workers can put KV into it, and speaks the control protocol of docs/architecture.md
// with the router (KvReserve / StartDecode / Cancel / Drain in; KvReserveReply / TokenChunk /
// Finish out) and the broker (expert weights at start; registry). One event loop (plus UCX's
// progress thread): poll control sockets, expire leases, run one engine step, stream its
// tokens.
//
// Keepalive: an engine step (a preempted sequence's recompute, a large batch) may last many
// heartbeat intervals, and nothing polls meanwhile. So the loop holds control_mu_ at all times
// but during Engine::Step, and a keepalive thread, which takes control_mu_ for every use of
// the control clients, sends the heartbeats that fall due while a step runs
// (ControlClient::HeartbeatIfDue), with the load figures of a snapshot taken before the step.
// It only sends heartbeats: frames that arrive meanwhile wait for the loop, which handles them
// and runs every callback, so peers never see this worker fall silent however long a step is.
//
// Quarantine: the blocks of a lease that ends without StartDecode (cancelled, expired, dropped
// with a lost router) may still be written by the prefill worker that was given them, with
// one-sided UCX puts this process cannot see. They are not freed but quarantined until the
// router says that writer can no longer write (Cancel with writerDone), until a StartDecode for
// the lease arrives (its KvReady came first, so the writes are done), or, with no word from
// any router, after quarantine_max_ms, or router_lost_quarantine_ms once the router is lost
// (its prefill workers lose it too and stop writing). StartDecode for a lease that is not live
// is refused.
//
// Memory: the worker owns one PagePool (memory/page_pool.h) and lends it to the engine (KV
// blocks, one page per layer) and to DecodeWeights (decode_weights.h: the expert weights and
// the plans from the broker; with an any-precision store, planes and LUTs in pool pages); the
// whole pool is registered with UCX, so prefill workers put KV pages into it. At every
// iteration boundary (between engine steps) finished width changes commit and new ones start
// on free pages above a KV reserve (what running requests and leases still need up to their
// max_tokens, kv_demand.h).
//
// Planner inputs: the engine's recorder seam feeds RoutingStats (routing_stats.h), the EMA of
// gate weight per (layer, expert) over decode batches; KvDemand (kv_demand.h) counts the KV
// pages running requests, leases and held reservations will still need. Telemetry to the
// broker carries both (expertMass, kvDemandPages) every 200 ms at most.
//
// Admission (reserve_wait.h, off unless reserve_wait_ms > 0): a KvReserve whose prompt and
// max_tokens do not fit beside that demand, but would after lowering expert widths within the
// planner's floors or once the KV held now comes back (requests finishing), is held
// up to reserve_wait_ms (counted in kvDemandPages, so the planner lowers for it) and granted
// at the first iteration boundary where it fits, instead of being granted into KV a running
// request will need (a preemption later) or refused. See decode_reserve.cc.
//
// Preemption: when a step needs KV blocks the pool lacks, the most recently admitted running
// sequence is removed and queued again with the tokens it generated; the engine recomputes its
// KV later and continues (nothing lost, nothing repeated on the stream).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "policies/lynx/lynx_remap.h"
#include "engine/engine.h"
#include "common/clock.h"
#include "services/transport/control.h"
#include "services/transport/ucx.h"
#include "engine/hooks/lynx_routing_hook.h"
#include "services/workers/decode/kv_demand.h"
#include "services/workers/common/kv_lease.h"
#include "services/workers/metrics/lynx_metrics.h"
#include "memory/page_pool.h"
#include "services/workers/decode/decode_weights.h"
#include "services/workers/common/request_boundary.h"
#include "services/workers/common/router_links.h"
#include "services/workers/decode/reserve_wait.h"
#include "services/workers/common/prompt_features.h"
#include "services/workers/decode/decode_trace.h"
#include "services/workers/decode/trace_metrics.h"
#include "services/workers/decode/routing_stats.h"
#include "services/workers/metrics/worker_metrics.h"

namespace pw::workers {

struct DecodeWorkerOptions {
  std::string id;                  // routing id; "decode-<pid>" when empty
  std::string model_dir;
  std::string model_name;          // reported at registration; default: model_dir's last part
  // Its routers' control endpoints (at least one), e.g. tcp://127.0.0.1:5555: every router may
  // place requests here (router_links.h).
  std::vector<std::string> router_endpoints;
  // > 0: every address of each endpoint's host is a router, resolved again this often (ms).
  uint64_t router_resolve_ms = 0;
  std::string broker_endpoint;     // empty: experts from the checkpoint, no broker
  std::string advertise_host;   // UCX's interface; empty: the router endpoint's host
  std::string node;             // told the router (placement); empty: the hostname
  int num_kv_blocks = 1024;
  int block_size = 16;
  int threads = 0;                 // compute threads; 0: every core (cpu::AvailableCores())
  bool copy_weights = false;       // the checkpoint read into the process (EngineOptions)
  // The dense matrices' and the lm_head's formats (EngineOptions::dense, ::lm_head).
  DenseFormat dense = DenseFormat::kBf16;
  DenseFormat lm_head = DenseFormat::kAsDense;
  int max_batch_tokens = 256;
  int max_batch = 64;              // running sequences the router may place here
  uint64_t heartbeat_ms = 500;
  uint32_t max_lease_ms = 600000;  // longer leases asked for are cut to this
  // Quarantined blocks return to the pool after this long even without the router's word
  // (the router that knew their writer is gone); longer than any prefill's write.
  uint64_t quarantine_max_ms = 600000;
  // When a router is lost, every quarantined lease of its requests returns after at most this long: the
  // prefill workers lose the same router, cancel their transfers and stop writing within about
  // a second of noticing (3 heartbeats); this covers that skew with a wide margin.
  uint64_t router_lost_quarantine_ms = 30000;
  int weights_timeout_ms = 120000; // waiting for the broker's expert weights at start
  const std::atomic<bool>* stop = nullptr;  // set: that wait ends when it turns true
  std::string metrics_bind;        // "127.0.0.1:0"; empty = no /metrics
  int64_t main_loop_stale_ms = service::kDefaultMainLoopStaleMs;  // /live (main_loop_beat.h)
  // KV elements (prefill workers must use the same: the layout hash says so).
  engine::KvDtype kv_dtype = engine::KvDtype::kBf16;
  // The page pool shared by KV and any-precision expert planes (memory/page_pool.h).
  // pool_bytes 0: num_kv_blocks blocks of KV plus, with an any-precision store, every expert
  // block at 8 bits. Otherwise the budget in bytes; KV may then use any page the weights leave.
  uint64_t pool_bytes = 0;
  uint64_t page_bytes = 0;               // 0: one layer of one KV block (rounded up to 64)
  uint64_t weight_bytes_per_s = 0;       // plane transfer rate limit; 0 = unlimited
  int weight_max_in_flight = 8;          // block width changes in flight at once
  MoverPacing weight_pacing = MoverPacing::kAuto;  // how they give way to the step
  engine::Bf16ExpertForm bf16_experts = engine::Bf16ExpertForm::kAuto;  // bf16 experts from the broker: packed or not
  // LYNX (DESIGN.md 5.3): remap pure-decode batches' expert choices through the engine's
  // routing hook; counted as pagedweight_lynx_* (lynx_metrics.h).
  bool lynx = false;
  lynx::LynxOptions lynx_options;
  // Pool-aware admission (reserve_wait.h): a reservation that fits only after a lowering of
  // expert widths waits up to this long (at most max_batch of them); 0 = answered at once.
  uint64_t reserve_wait_ms = 0;
  // The broker planner's floors: a reservation is held only when the pages lowering to them
  // frees would make it fit (ReserveWait::LowerablePages).
  LowerFloors lower_floors;
  // The broker runs the planner (pw-decode was told its floors): the KV capacity reported in
  // heartbeats counts the pages lowering to lower_floors would free.
  bool planner_lowers = false;
  // KV demand horizon (kv_demand.h): requests count the growth of their next this many tokens
  // only, in kvDemandPages, the pages raises leave free and the reservations' fit; 0 = their
  // whole growth to max_tokens.
  int64_t demand_horizon_tokens = 0;
  // Ablation "no async movement" (request_boundary.h): expert width changes are committed and
  // started only at an iteration boundary where a request joined or left the running batch.
  bool plans_at_request_boundaries = false;
  // Expert residency budget (DESIGN.md 5.2, paged_residency.h): with residency or
  // residency_bytes set and an any-precision store, only that many experts stay resident and
  // the miss policy decides every miss (after LYNX); unset = every expert resident.
  misses::MissSettings misses;
  // Router-logit trace recording (decode_trace.h): path empty = off; sampled and bounded.
  DecodeTraceOptions trace;
};

class DecodeWorker {
 public:
  static Result<std::unique_ptr<DecodeWorker>> Create(DecodeWorkerOptions options,
                                                      const Clock* clock = nullptr);
  ~DecodeWorker();

  // Serves until `stop` becomes true, then drains: refuses new work, finishes what it has
  // (or until `drain_timeout_ms`), and returns. A fatal setup error returns non-OK.
  Status Run(const std::atomic<bool>& stop, int drain_timeout_ms = 60000);

  const std::string& id() const { return options_.id; }
  uint16_t metrics_port() const { return metrics_ ? metrics_->port() : 0; }

  // A frame from the router (KvReserve, StartDecode, Cancel, Drain), as Run's poll of the
  // router link hands it over: the loop thread, between engine steps. Public so the fuzz target
  // (fuzz/decode_worker_handlers_fuzz.cc) drives the same handler with a worker it does not Run.
  // `link`: which router (the index of its endpoint in router_endpoints).
  Status HandleRouter(const proto::InMessage& m, size_t link = 0);

 private:
  struct Running {
    std::vector<int32_t> prompt;     // the request's prompt
    std::vector<int32_t> generated;  // every output token streamed (here and before)
    engine::SamplingParams params;   // as the request asked (max_tokens counts all output)
    uint32_t next_index = 0;         // output index of the next token streamed
    uint64_t lease_id = 0;           // the lease StartDecode took
    bool preempted = false;
  };
  // Blocks of a lease that ended before StartDecode, waiting until no writer can reach them.
  struct Quarantined {
    uint64_t request_id = 0;
    std::vector<int32_t> blocks;
    uint64_t since_ms = 0;
    uint64_t max_ms = 0;  // freed after this long without the router's word
  };

  explicit DecodeWorker(DecodeWorkerOptions options, const Clock* clock);
  Status Setup();
  // The iteration boundary for expert widths: commit, start, acknowledge (see the file comment).
  void WeightsBoundary();
  void SendTelemetry();
  // `router_minor`: the protocol minor version of the router's envelope (a hybrid's KV is
  // reserved only for a router that carries its recurrent state: transferable_kv.h).
  // `link`: the router's (request keys, router_links.h).
  void OnReserve(wire::KvReserve::Reader r, uint16_t router_minor, size_t link);
  // Grants `h` (a lease over its prompt's blocks) or, with `error` or no blocks, refuses it.
  void AnswerReserve(const HeldReserve& h, const std::string& error);
  // Answers the held reservations that fit now or waited their time (every one when draining).
  void AnswerHeldReserves();
  // The KV the requests here will still need (kv_demand.h).
  KvDemand Demand() const;
  // The most KV blocks the pool can hold at once: those held now, the free pages and, with the
  // planner on, the pages lowering expert widths to its floors frees (Heartbeat.kvCapacityBlocks,
  // which the router's admission counts against).
  uint32_t KvCapacityBlocks() const;
  // Recomputes lowerable_pages_ (after the weights load, then with every Telemetry): widths
  // change only at iteration boundaries, and heartbeats and steps read it often.
  void UpdateLowerablePages();
  // Renews the named leases whose requests the router still has on their way (KvRenew).
  void OnRenew(wire::KvRenew::Reader r, size_t link);
  void OnStartDecode(wire::StartDecode::Reader r, size_t link);
  void OnCancel(wire::Cancel::Reader r, size_t link);
  // Runs one engine step with `control` (a lock on control_mu_) released, so the keepalive
  // thread can beat meanwhile; then streams the step's tokens.
  void StepOnce(std::unique_lock<std::mutex>& control);
  void KeepaliveLoop();
  bool Preempt();
  // `refused_param` non-empty: `error` refuses the request's own value of that field
  // (Finish.errorKind invalidRequest), not a failure of this worker.
  void SendFinish(uint64_t request_id, wire::FinishReason reason, const std::string& error,
                  uint32_t num_generated, const std::string& refused_param = "");
  void FreeBlocks(const std::vector<int32_t>& blocks, const char* why);
  // Puts the blocks of an ended lease into quarantine (see the file comment).
  void Quarantine(KvLease lease, const char* why);
  // Frees quarantined lease `lease_id`; false if it is not quarantined here.
  bool ReleaseQuarantined(uint64_t lease_id, uint64_t request_id, const char* why);
  void ExpireQuarantine();
  size_t quarantined_blocks() const;
  // Router `link` was lost: its running requests, leases and held reservations are dropped,
  // its quarantined leases wait at most router_lost_quarantine_ms more. Other routers' go on.
  void DropLink(size_t link);
  // What a heartbeat reports (taken by the loop thread; the keepalive sends a copy).
  struct LoadSnapshot {
    uint32_t free_kv_blocks = 0, used_kv_blocks = 0, reserved_kv_blocks = 0;
    uint32_t running = 0, waiting = 0;
    uint32_t kv_capacity_blocks = 0;
    bool draining = false;
  };
  void FillRegister(wire::Register::Builder r);
  LoadSnapshot TakeLoad() const;
  static void FillHeartbeat(const LoadSnapshot& load, wire::Heartbeat::Builder h);
  void UpdateMetrics();

  DecodeWorkerOptions options_;
  const Clock* clock_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<transport::ucx::Context> ucx_ctx_;
  std::unique_ptr<transport::ucx::Worker> ucx_worker_;
  std::unique_ptr<transport::ucx::MemoryRegion> kv_region_;  // the whole page pool
  std::unique_ptr<memory::PagePool> pool_;          // owned here, lent to engine_ and weights_
  std::unique_ptr<DecodeWeights> weights_;         // expert weights, plans (decode_weights.h)
  uint64_t last_telemetry_ms_ = 0;
  RouterLinks routers_;
  std::unique_ptr<transport::ControlClient> broker_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<lynx::LynxRemapper> lynx_;
  std::unique_ptr<engine::LynxRoutingHook> lynx_hook_;  // null when LYNX is off
  std::unique_ptr<LynxMetrics> lynx_metrics_;
  std::unique_ptr<DecodeTrace> trace_;     // null unless recording; passes layers on to routing_
  std::unique_ptr<TraceMetrics> trace_metrics_;  // with trace_
  engine::RouterLogitsRecorder* recorder() {
    return trace_ ? static_cast<engine::RouterLogitsRecorder*>(trace_.get()) : routing_.get();
  }
  std::unique_ptr<RoutingStats> routing_;  // the engine's recorder: routing mass for Telemetry
  std::unique_ptr<PromptFeatures> prompt_features_;  // admitted prompts' routing, for Telemetry
  ReserveWait reserve_wait_;
  int64_t lowerable_pages_ = 0;  // ReserveWait::LowerablePages with the planner on, else 0
  RequestBoundary request_boundary_;
  KvLeaseTable leases_;
  std::map<uint64_t, Quarantined> quarantine_;  // by lease id
  // Requests are known by their RequestKey (router_links.h) here, in leases_, quarantine_,
  // reserve_wait_ and as the engine's sequence ids.
  std::map<uint64_t, Running> running_;
  std::vector<uint64_t> admit_order_;  // request keys, oldest first (preemption picks the last)
  uint64_t layout_hash_ = 0;
  bool draining_ = false;

  // Keepalive (see the file comment). control_mu_ guards routers_, broker_ and the fields below
  // while Run runs.
  std::mutex control_mu_;
  std::condition_variable keepalive_cv_;
  bool in_step_ = false;
  bool keepalive_stop_ = false;
  LoadSnapshot step_load_;
  uint64_t keepalive_beats_ = 0;  // heartbeats the keepalive thread sent (router and broker)
  std::thread keepalive_;
};

}  // namespace pw::workers
