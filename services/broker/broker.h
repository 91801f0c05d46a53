// Broker: the library behind pw-broker, the node's memory broker.
//
// Holds the host-RAM expert store, registered with UCX and progressed by a thread, and serves
// it to decode workers: WeightManifestRequest -> WeightManifest; workers then get bytes with
// one-sided UCX gets. Two kinds of store:
//   - an .apw any-precision store (--store), memory-mapped as it is (served_store.h): the
//     manifest lists every bit-plane and LUT of every block with its checksum, so a worker
//     fetches one plane of one block at a time;
//   - the checkpoint's bf16 experts (no --store), copied into one buffer laid out as
//     services/common/expert_store_layout.h describes, one region per block.
// Widths are the PlanBook's (plan_book.h): pw-ctl (CtlRequest) changes desired widths, the
// broker sends each decode worker a Plan with what it still has to change (again every
// second until its PlanAcks show it done), and mirrors every worker's committed table from its
// registration and acks, so a restarted broker rebuilds it as the workers re-register. A
// worker with a residency budget (Register/Telemetry residencyCapacity) keeps non-resident
// blocks at 0 by design: those are sent once per change of their desired width, not resent.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/formats/checkpoint_experts.h"
#include "common/status.h"
#include "services/transport/control.h"
#include "services/transport/ucx.h"
#include "policies/planner/planner_params.h"
#include "services/broker/plan_book.h"
#include "services/broker/planner_driver.h"
#include "services/broker/served_store.h"
#include "services/common/expert_store_layout.h"
#include "services/common/main_loop_beat.h"
#include "services/common/metrics_http.h"
#include "services/common/registration_check.h"

namespace pw::engine {
class Model;
}

namespace pw::broker {

struct BrokerOptions {
  std::string model_dir;
  std::string model_name;                   // default: model_dir's last part
  std::string bind = "tcp://127.0.0.1:5556"; // ROUTER endpoint workers connect to
  std::string id = "broker";
  uint64_t heartbeat_ms = 500;
  std::string metrics_bind;                 // "127.0.0.1:9102"; empty = none
  int64_t main_loop_stale_ms = service::kDefaultMainLoopStaleMs;  // /live (main_loop_beat.h)
  std::string store_path;                   // .apw store; empty = the checkpoint's bf16 experts
  // Where the checkpoint's hash is remembered between starts (model_hash_cache.h); empty = the
  // experts are hashed at every start.
  std::string model_hash_cache;
  // Prompt residual heads beside the store (common/formats/residual_heads.h, pw-quantize residuals);
  // empty = none (every prompt residual 1).
  std::string planner_residuals;
  int initial_bits = 8;                     // width of every block until a plan changes it
  uint64_t plan_resend_ms = 1000;           // a worker with pending changes gets its plan again
  // The quality-aware planner (planner_driver.h); off by default, needs an .apw store.
  planner::PlannerParams planner;
};

// What the broker knows about one worker (rebuilt from re-registrations after a restart).
struct WorkerRecord {
  std::string id;
  int role = 0;                  // wire::Role
  size_t weight_entries = 0;     // entries in its weight table
  uint64_t committed_bits_sum = 0;
};

class Broker {
 public:
  static Result<std::unique_ptr<Broker>> Create(BrokerOptions options,
                                                const Clock* clock = nullptr);
  ~Broker();
  // Serves until `stop` becomes true.
  Status Run(const std::atomic<bool>& stop);
  // One loop iteration (tests drive it directly).
  void PollOnce(int timeout_ms);

  const std::string& endpoint() const { return endpoint_; }
  const std::map<std::string, WorkerRecord>& workers() const { return workers_; }
  uint64_t store_bytes() const { return layout_.total_bytes; }
  uint64_t manifests_served() const { return manifests_served_; }
  const PlanBook& plans() const { return *book_; }

 private:
  explicit Broker(BrokerOptions options, const Clock* clock);
  Status Setup();
  Status Handle(const std::string& peer, const proto::InMessage& m);
  // Refuses a Register of another model, or one CheckRegistration refuses (registration_).
  Status OnRegister(const std::string& peer, wire::Register::Reader r, uint16_t version_minor);
  // The manifest, or a refusal: another model, or a peer of protocol 1.`peer_minor` that cannot
  // verify this build's part checksums (services/proto/part_checksum.h).
  void SendManifest(const std::string& peer, const std::string& model_name, uint16_t peer_minor);
  Status SetupBf16Store(const CheckpointExperts& experts);
  void OnCtl(const std::string& peer, wire::CtlRequest::Reader r);
  Status OnPlanAck(const std::string& peer, wire::PlanAck::Reader r);
  // Sends every decode worker with pending changes its plan (`force`: now, else when due).
  void SendPlans(bool force);
  void ExportPlanMetrics();
  // One planner tick (when enabled): its changes become a new epoch, sent at once.
  void RunPlanner();

  BrokerOptions options_;
  const Clock* clock_;
  service::ExpertStoreLayout layout_;
  service::RegistrationLimits registration_;  // the served model; default bounds
  std::unique_ptr<uint8_t[]> store_;
  std::vector<uint64_t> checksums_;  // per region, proto::kPartChecksumKind
  std::unique_ptr<ServedStore> served_;
  std::unique_ptr<PlanBook> book_;
  std::map<std::string, uint64_t> plan_sent_ms_;
  std::unique_ptr<transport::ucx::Context> ucx_ctx_;
  std::unique_ptr<transport::ucx::Worker> ucx_worker_;
  std::unique_ptr<transport::ucx::MemoryRegion> region_;
  std::unique_ptr<transport::ControlServer> server_;
  std::string endpoint_;
  std::map<std::string, WorkerRecord> workers_;
  uint64_t manifests_served_ = 0;
  std::shared_ptr<prometheus::Registry> registry_;
  service::MainLoopBeat beat_;  // PollOnce beats it: /live
  std::unique_ptr<service::MetricsHttp> http_;
  prometheus::Gauge* workers_gauge_ = nullptr;
  prometheus::Counter* manifests_counter_ = nullptr;
  prometheus::Counter* plans_counter_ = nullptr;
  prometheus::Counter* ctl_counter_ = nullptr;
  prometheus::Counter* ctl_errors_counter_ = nullptr;
  prometheus::Gauge* epoch_gauge_ = nullptr;
  prometheus::Family<prometheus::Gauge>* committed_family_ = nullptr;
  std::unique_ptr<PlannerDriver> planner_;
  prometheus::Family<prometheus::Counter>* planner_plans_ = nullptr;
  prometheus::Family<prometheus::Counter>* planner_pages_ = nullptr;
  prometheus::Counter* planner_errors_ = nullptr;
  prometheus::Family<prometheus::Counter>* planner_damage_ = nullptr;
  prometheus::Histogram* planner_seconds_ = nullptr;
};

}  // namespace pw::broker
