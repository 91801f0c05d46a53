// DecodeWeights: the decode worker's expert weights and its half of the weights protocol with
// the broker (docs/architecture.md "Paged memory").
//
// At start it asks the broker for its manifest and loads what it describes: the checkpoint's
// bf16 experts (RemoteExpertProvider, read once) or an any-precision store (PagedWeights, the
// planes and LUTs at the store's initial width in pages of the worker's pool). Then it takes
// Plans (desired widths, epoch-numbered), answers with PlanAcks of what committed, fills the
// weight table of every registration, and rebinds to a restarted broker without waiting. At
// every iteration boundary the worker calls Boundary, which commits finished transfers and
// starts new ones on free pages above the KV reserve it is given.
//
// With a residency budget (options.misses) nothing is loaded: PagedResidency starts cold and
// the miss policy decides which experts are resident; plans set the widths they have when
// resident, and the boundary is the residency's.
//
// It owns the providers and the paged-weight metrics; it borrows the pool, the UCX worker and
// the broker's control client from the decode worker, and never touches the engine: the
// worker hands provider() to the engine once Load returns. Called from the worker's loop
// thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/model_config.h"
#include "common/status.h"
#include "memory/page_pool.h"
#include "engine/experts/moe.h"
#include "services/proto/codec.h"
#include "services/transport/control.h"
#include "services/transport/ucx.h"
#include "policies/misses/miss_settings.h"
#include "services/workers/metrics/paged_metrics.h"
#include "services/workers/weights/paged_residency.h"
#include "services/workers/weights/paged_weights.h"
#include "services/workers/weights/remote_experts.h"
#include "services/workers/metrics/residency_metrics.h"

namespace prometheus {
class Registry;
}

namespace pw::workers {

struct DecodeWeightsOptions {
  std::string worker_id;             // for logs and metric labels
  std::string model_name;            // what the manifest is asked for
  int timeout_ms = 120000;           // Load's wait for the manifest and the first widths
  // Load gives up (kCancelled) once *stop is true (the process's SIGTERM flag): a worker
  // started while its broker is down stops when asked instead of after timeout_ms.
  const std::atomic<bool>* stop = nullptr;
  PagedWeightsOptions paged;         // rate limit, transfers in flight
  engine::Bf16ExpertForm bf16_experts = engine::Bf16ExpertForm::kAuto;  // how bf16 blocks are held (remote_experts.h)
  // A residency budget (paged_residency.h) for an any-precision store; none = every expert
  // resident (loaded at the initial width by Load).
  misses::MissSettings misses;
};

class DecodeWeights {
 public:
  // `broker` may be null (experts from the checkpoint): then Load does nothing and provider()
  // is null. Registers the paged-weight metrics in `registry`.
  DecodeWeights(DecodeWeightsOptions options, const ModelConfig& config, memory::PagePool* pool,
                transport::ucx::Worker* ucx, transport::ControlClient* broker,
                prometheus::Registry& registry);
  ~DecodeWeights();

  // Starts the broker client and blocks until its manifest is loaded (or the timeout).
  Status Load();
  // A frame from the broker (manifest, plan); the others are ignored.
  Status Handle(const proto::InMessage& m);
  // The broker client's callbacks: a (new) registration asks for the manifest again, a lost
  // broker fails the transfers in flight (their blocks keep their widths).
  void OnBrokerRegistered();
  void OnBrokerLost();

  // The iteration boundary: commits and starts width changes, keeping `kv_reserve_pages`
  // pages free for KV, and acknowledges what committed.
  void Boundary(int kv_reserve_pages);
  // pagedweight_pool_* and pagedweight_weight_* from the pool and the table now.
  void ExportMetrics();
  // Brackets an engine step: no width changes under it.
  void BeginStep();
  void EndStep();

  // The registration's weight table (every block, committed and desired widths).
  void FillWeightTable(wire::Register::Builder r) const;
  // The weight part of Telemetry: the newest plan fully applied, changes still pending.
  void FillTelemetry(wire::Telemetry::Builder t) const;

  engine::ExpertWeightProvider* provider();
  // Sets the provider in `hooks`; with a residency budget also its miss policy as the routing
  // hook after hooks->routing_hook (LYNX), the residency and the fetcher.
  void AddHooks(engine::MoeHooks* hooks);
  PagedResidency* residency() { return residency_.get(); }
  PagedWeights* paged() { return paged_.get(); }
  uint64_t bytes_loaded() const { return bytes_loaded_; }

 private:
  Status OnManifest(std::unique_ptr<proto::InMessage> manifest);
  void OnPlan(wire::Plan::Reader plan);
  void SendPlanAck(const std::vector<WidthChange>& committed);
  void SendFullAck();

  DecodeWeightsOptions options_;
  const ModelConfig config_;
  memory::PagePool* pool_;
  transport::ucx::Worker* ucx_;
  transport::ControlClient* broker_;
  std::unique_ptr<PagedMetrics> metrics_;
  std::unique_ptr<RemoteExpertProvider> experts_;  // bf16 store
  std::unique_ptr<PagedWeights> paged_;            // any-precision store
  std::unique_ptr<PagedResidency> residency_;      // null: every expert resident
  std::unique_ptr<ResidencyMetrics> residency_metrics_;
  prometheus::Registry& registry_;
  uint64_t plan_epoch_ = 0;                        // newest plan applied
  uint64_t bytes_loaded_ = 0;
  bool manifest_pending_ = false;
  std::unique_ptr<proto::InMessage> manifest_;
};

}  // namespace pw::workers
