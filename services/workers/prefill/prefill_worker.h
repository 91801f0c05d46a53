// PrefillWorker: the library behind pw-prefill.
//
// Receives PrefillRequest from the router, computes the prompts' KV into blocks of its own KV
// pool, samples each prompt's first token, writes the KV into the decode worker's reserved
// blocks with UCX one-sided puts (one put per run of contiguous blocks, then a flush so the
// bytes are there before anyone is told), frees its blocks and answers KvReady.
//
// Two threads. The control thread (the one calling Run) owns the ZeroMQ clients: it receives
// requests and cancels, sends heartbeats and KvReady, and never computes, so heartbeats keep
// flowing however long a forward pass or a put takes. The compute thread owns the engine and
// the UCX endpoints: it batches queued prompts into forward passes of up to max_batch_tokens
// tokens (Engine::PrefillPass; up to max_batch_prompts prompts in flight, first come first
// served, a long prompt in chunks that share passes with the prompts around it), then sends
// each finished prompt's KV. They meet in a mutex-guarded queue, an in-flight table and an
// outbox.
//
// Sampling: the first token of a re-prefilled request (generatedSoFar = k) is drawn as the
// request's draw number k, as the in-process engine would. Log-probabilities: with
// sampling.logprobs >= 0 KvReady carries the first token's; with promptLogprobs >= 0 every
// prompt token's after the first (each position's logits are then computed, not only the
// last).
//
// KV endpoints use UCX without peer error handling (shared memory on one host; see
// services/transport/ucx.h), so a dead decode worker is noticed by the control plane: the
// router declares it dead after 3 missed heartbeats and cancels its requests here, which ends
// a put or flush in progress (cancel flag; what was already posted gets up to 1 s to land) and
// closes the endpoint; every put and flush is also bounded by put_timeout_ms. An endpoint is
// re-created when the decode worker re-registers (new worker address) or after a failure.
// PW_UCX_ERR_MODE=peer restores peer error handling (tcp).
//
// Shared prefill: a request whose tokens (and generatedSoFar and promptLogprobs) equal those of
// a prompt being prefilled here waits for that prompt's forward passes instead of running its
// own (the candidates of one `n` / `best_of` request), and one equal to the prompt prefilled
// last is served from it while its blocks are kept (up to kRecentMs, or until the pool needs
// them). Either way the request gets its own first token (its own seed and draw number), and
// the same KV is put into its own reserved blocks.
//
// Experts: the checkpoint's bf16 (the default), or with `store_path` the node's any-precision
// store at one width for every block (`expert_bits`, 3..8), as a llama.cpp server prefills at
// its file's quantization: a 4-bit node then computes its prompts with the same 4-bit int8
// kernels its decode worker runs (docs/architecture.md, "Prefill at the store's width").
//
// Everything a request names (layout, block ids, region bounds) is checked before use; a bad
// request gets KvReady{ok = false, error}. A cancelled request gets no KvReady.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"
#include "engine/experts/apw_expert_provider.h"
#include "common/clock.h"
#include "services/transport/control.h"
#include "services/transport/ucx.h"
#include "services/workers/common/prompt_features.h"
#include "services/workers/common/router_links.h"
#include "services/workers/metrics/worker_metrics.h"

namespace pw::workers {

struct PrefillWorkerOptions {
  std::string id;  // routing id; "prefill-<pid>" when empty
  std::string model_dir;
  std::string model_name;       // default: model_dir's last part
  // Its routers' control endpoints (at least one): every router may place requests here
  // (router_links.h).
  std::vector<std::string> router_endpoints;
  // > 0: every address of each endpoint's host is a router, resolved again this often (ms).
  uint64_t router_resolve_ms = 0;
  std::string broker_endpoint;  // empty: no broker registration
  std::string advertise_host;   // UCX's interface; empty: the router endpoint's host
  std::string node;             // told the router (placement); empty: the hostname
  int num_kv_blocks = 1024;
  int block_size = 16;
  engine::KvDtype kv_dtype = engine::KvDtype::kBf16;  // must equal the decode workers'

  int threads = 0;              // compute threads; 0: every core (cpu::AvailableCores())
  bool copy_weights = false;    // the checkpoint read into the process (EngineOptions)
  // The dense matrices' and the lm_head's formats (EngineOptions::dense, ::lm_head).
  DenseFormat dense = DenseFormat::kBf16;
  DenseFormat lm_head = DenseFormat::kAsDense;
  // Experts from this .apw store at expert_bits (3..8) for every block; empty: the
  // checkpoint's bf16 experts (expert_bits 16).
  std::string store_path;
  int expert_bits = 16;
  // Where the checkpoint's hash is remembered between starts (common/formats/model_hash_cache.h);
  // empty: hashed at start when a store is given.
  std::string model_hash_cache;
  int max_batch_tokens = 256;  // prompt tokens per forward pass
  int max_batch_prompts = 32;  // prompts in flight (sharing passes) at once
  uint64_t heartbeat_ms = 500;
  int put_timeout_ms = 10000;  // bound of one KV transfer's puts, and of its flush
  std::string metrics_bind;
  int64_t main_loop_stale_ms = service::kDefaultMainLoopStaleMs;  // /live (main_loop_beat.h)
};

class PrefillWorker {
 public:
  static Result<std::unique_ptr<PrefillWorker>> Create(PrefillWorkerOptions options,
                                                       const Clock* clock = nullptr);
  ~PrefillWorker();
  // Serves until `stop`, then finishes its queue (drain) and returns.
  Status Run(const std::atomic<bool>& stop, int drain_timeout_ms = 60000);
  const std::string& id() const { return options_.id; }
  // A frame from the router (PrefillRequest, Cancel, Drain), as Run's poll of the router link
  // hands it over (the control thread). Public so the fuzz target
  // (fuzz/prefill_worker_handlers_fuzz.cc) drives the same handler with a worker it does not Run.
  // `link`: which router (the index of its endpoint in router_endpoints).
  Status HandleRouter(const proto::InMessage& m, size_t link = 0);

 private:
  struct Peer {
    std::string address;  // the decode worker's UCX worker address
    std::string rkey;
    uint64_t base = 0, bytes = 0;
    std::unique_ptr<transport::ucx::Endpoint> ep;
    std::unique_ptr<transport::ucx::RemoteRegion> region;
    std::string transport;  // the endpoint's UCX transports ("tcp", "sysv+posix+cma")
  };
  // One request, from arrival to KvReady.
  struct Job {
    std::shared_ptr<proto::InMessage> msg;  // the PrefillRequest frame
    uint64_t request_id = 0;  // RequestKey: the router's link and its id
    uint64_t lease_id = 0;
    std::string decode_id;
    uint32_t num_tokens = 0;
    std::vector<int32_t> tokens;
    std::vector<int32_t> own;  // blocks of this worker's pool
    // Each layer's first page among a block's pages in the decode worker's pool (its page size
    // lays a recurrent state out over its own number of pages), then the pages of a block.
    std::vector<int> decode_first_page;
    engine::PrefillJob work;
    std::atomic<bool> cancelled{false};
    // Compute thread: requests with the same work waiting for this one's prefill.
    std::vector<std::shared_ptr<Job>> followers;
    std::chrono::steady_clock::time_point received, admitted;  // for the metrics
    std::vector<uint32_t> routing;  // compute thread: prompt routing counts (prompt_features.h)
  };
  // The prompt prefilled last, its KV kept in `own` (compute thread).
  struct Recent {
    std::vector<int32_t> tokens;
    int num_generated_before = 0;
    int prompt_logprobs = -1;
    std::vector<int32_t> own;
    engine::PrefillResult result;
    uint64_t at_ms = 0;
  };
  static constexpr uint64_t kRecentMs = 2000;
  // What the control thread sends as KvReady.
  struct Outcome {
    uint64_t request_id = 0, lease_id = 0;  // request_id: the RequestKey
    std::string decode_id;
    uint32_t num_tokens = 0;
    Status status;
    int32_t first_token = -1;
    std::optional<engine::TokenLogprobs> first_logprobs;  // sampling.logprobs >= 0
    std::vector<engine::TokenLogprobs> prompt_logprobs;   // promptLogprobs >= 0
    std::vector<uint32_t> prompt_routing;                 // KvReady.promptRouting
    // Non-empty: `status` refuses the request's own value of this field (an invalid request,
    // KvReady.errorKind invalidRequest), not a failure of this worker.
    std::string refused_param;
  };

  explicit PrefillWorker(PrefillWorkerOptions options, const Clock* clock);
  Status Setup();
  // With store_path: opens the store (refusing one made for another checkpoint) and makes
  // store_experts_ at expert_bits; checks the two options agree.
  Status OpenStoreExperts();
  // Control thread.
  void SendOutcomes();
  void SendKvReady(const Outcome& o);
  void FillRegister(wire::Register::Builder r);
  void FillHeartbeat(wire::Heartbeat::Builder h);
  // Router `link` was lost: its queued prompts are dropped, its running ones cancelled.
  void DropLink(size_t link);
  // Compute thread.
  void ComputeLoop();
  // Moves queued requests into `active` while the next pass has room; refuses bad ones.
  void Admit(std::vector<std::shared_ptr<Job>>* active);
  // Checks a request and fills job->tokens / work (not the blocks).
  Status Prepare(Job* job);
  // Writes a finished job's KV into the decode worker's blocks.
  Status Transfer(Job* job);
  Result<Peer*> PeerFor(const std::string& decode_id, wire::UcxMemory::Reader mem);
  // Frees the job's own blocks, drops it from the in-flight table, queues its KvReady unless
  // it was cancelled.
  void Retire(Job* job, Status st);
  // The load the heartbeat reports (tokens left, free blocks) and the KV pages metric; compute
  // thread.
  void PublishLoad(const std::vector<std::shared_ptr<Job>>& active);
  // True when `a` can take `b`'s prefill (same tokens, generatedSoFar and promptLogprobs).
  static bool SameWork(const Job& a, const std::vector<int32_t>& tokens, int num_generated_before,
                       int prompt_logprobs);
  // Serves `f` from an equal prompt's KV (`blocks`, not f's) and result: samples f's first
  // token, puts the KV into f's blocks, retires f.
  void ServeShared(Job* f, const std::vector<int32_t>& blocks, const engine::PrefillResult& r);
  // Finishes a computed job: its transfer, its followers', then keeps its blocks as recent_.
  void FinishJob(const std::shared_ptr<Job>& j);
  void DropRecent();

  PrefillWorkerOptions options_;
  const Clock* clock_;
  // The engine's recorder (compute thread); outlives the engine, which points at it.
  std::unique_ptr<PromptRoutingRecorder> prompt_routing_;
  std::unique_ptr<engine::Engine> engine_;
  // With store_path: the provider the engine's MoE hooks point at (it holds the store). It
  // reads the engine's model, so it is declared after engine_ (destroyed before it).
  std::unique_ptr<anyprec::ApwExpertProvider> store_experts_;
  std::unique_ptr<transport::ucx::Context> ucx_ctx_;
  RouterLinks routers_;
  std::unique_ptr<transport::ControlClient> broker_;
  std::unique_ptr<WorkerMetrics> metrics_;
  // The compute thread's beat, which metrics_->beat watches: /live fails when either loop is
  // stuck (main_loop_beat.h).
  std::unique_ptr<service::MainLoopBeat> compute_beat_;
  std::map<std::string, Peer> peers_;  // compute thread
  uint64_t layout_hash_ = 0;
  uint32_t pool_blocks_ = 0;

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<std::shared_ptr<Job>> queue_;             // guarded by mu_
  std::map<uint64_t, std::shared_ptr<Job>> inflight_;  // guarded by mu_ (admitted jobs, by key)
  std::vector<Outcome> outbox_;                        // guarded by mu_
  uint64_t queued_tokens_ = 0;                         // guarded by mu_ (queue_ only)
  std::atomic<uint64_t> active_remaining_tokens_{0};
  std::atomic<uint32_t> free_blocks_{0};
  std::atomic<bool> draining_{false};
  std::atomic<bool> stop_compute_{false};
  std::atomic<int> largest_batch_{0};        // most prompts in one forward pass so far
  std::atomic<uint64_t> shared_prompts_{0};  // requests served from another's prefill
  std::optional<Recent> recent_;             // compute thread
  std::vector<std::pair<float, int32_t>> sample_scratch_;  // compute thread
  std::thread compute_;
};

}  // namespace pw::workers
