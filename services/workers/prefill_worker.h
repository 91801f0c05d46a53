// PrefillWorker: the library behind pw-prefill.
//
// Receives PrefillRequest from the router, runs the prompt through its own Engine in chunks
// (max_batch_tokens per forward pass) into blocks of its own KV pool, samples the first token,
// writes the prompt's KV into the decode worker's reserved blocks with UCX one-sided puts (one
// per block, then a flush so the bytes are there before anyone is told), frees its blocks and
// answers KvReady. Requests are served first come, first served, one prompt per forward pass.
// Everything a request names (layout, block ids, region bounds) is checked before use; a bad
// request gets KvReady{ok = false, error}.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "services/engine/engine.h"
#include "services/transport/clock.h"
#include "services/transport/control.h"
#include "services/transport/ucx.h"
#include "services/workers/worker_metrics.h"

namespace pw::workers {

struct PrefillWorkerOptions {
  std::string id;                // routing id; "prefill-<pid>" when empty
  std::string model_dir;
  std::string model_name;        // default: model_dir's last part
  std::string router_endpoint;   // required
  std::string broker_endpoint;   // empty: no broker registration
  int num_kv_blocks = 1024;
  int block_size = 16;
  int threads = 1;
  int max_batch_tokens = 256;    // prompt chunk size
  uint64_t heartbeat_ms = 500;
  int put_timeout_ms = 30000;
  std::string metrics_bind;
};

class PrefillWorker {
 public:
  static Result<std::unique_ptr<PrefillWorker>> Create(PrefillWorkerOptions options,
                                                       const transport::Clock* clock = nullptr);
  ~PrefillWorker();
  // Serves until `stop`, then finishes its queue (drain) and returns.
  Status Run(const std::atomic<bool>& stop, int drain_timeout_ms = 60000);
  const std::string& id() const { return options_.id; }

 private:
  struct Peer {
    std::string address;  // the decode worker's UCX worker address
    std::string rkey;
    uint64_t base = 0, bytes = 0;
    std::unique_ptr<transport::ucx::Endpoint> ep;
    std::unique_ptr<transport::ucx::RemoteRegion> region;
  };
  explicit PrefillWorker(PrefillWorkerOptions options, const transport::Clock* clock);
  Status Setup();
  Status HandleRouter(const proto::InMessage& m);
  // Runs one queued request; returns the error to report in KvReady (OK on success).
  Status Serve(const proto::InMessage& m, int32_t* first_token);
  Result<Peer*> PeerFor(const std::string& decode_id, wire::UcxMemory::Reader mem);
  void FillRegister(wire::Register::Builder r);
  void FillHeartbeat(wire::Heartbeat::Builder h);

  PrefillWorkerOptions options_;
  const transport::Clock* clock_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<transport::ucx::Context> ucx_ctx_;
  std::unique_ptr<transport::ucx::Worker> ucx_worker_;
  std::unique_ptr<transport::ControlClient> router_;
  std::unique_ptr<transport::ControlClient> broker_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::deque<std::shared_ptr<proto::InMessage>> queue_;  // PrefillRequest frames
  uint64_t queued_tokens_ = 0;
  std::map<std::string, Peer> peers_;
  uint64_t layout_hash_ = 0;
  bool draining_ = false;
};

}  // namespace pw::workers
