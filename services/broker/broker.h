// Broker: the library behind pw-broker, the node's memory broker.
//
// Holds the host-RAM expert store (today: the bf16 expert weights of the checkpoint, laid out
// as services/workers/expert_store.h describes), registered with UCX and progressed by a
// thread, and serves it to decode workers: WeightManifestRequest -> WeightManifest (UCX
// coordinates + one region per expert block with its checksum); the worker then gets the bytes
// with one-sided UCX gets. Keeps a registry of the workers (their Register messages, including
// each decode worker's weight table: committed bits per expert block), which a restarted
// broker rebuilds as the workers re-register. The planner (Plan / PlanAck) comes later.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "common/status.h"
#include "services/transport/control.h"
#include "services/transport/ucx.h"
#include "services/workers/expert_store.h"

namespace pw::broker {

struct BrokerOptions {
  std::string model_dir;
  std::string model_name;                   // default: model_dir's last part
  std::string bind = "tcp://127.0.0.1:5556"; // ROUTER endpoint workers connect to
  std::string id = "broker";
  uint64_t heartbeat_ms = 500;
  std::string metrics_bind;                 // "127.0.0.1:9102"; empty = none
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
                                                const transport::Clock* clock = nullptr);
  ~Broker();
  // Serves until `stop` becomes true.
  Status Run(const std::atomic<bool>& stop);
  // One loop iteration (tests drive it directly).
  void PollOnce(int timeout_ms);

  const std::string& endpoint() const { return endpoint_; }
  const std::map<std::string, WorkerRecord>& workers() const { return workers_; }
  uint64_t store_bytes() const { return layout_.total_bytes; }
  uint64_t manifests_served() const { return manifests_served_; }

 private:
  explicit Broker(BrokerOptions options, const transport::Clock* clock);
  Status Setup();
  Status Handle(const std::string& peer, const proto::InMessage& m);
  Status OnRegister(const std::string& peer, wire::Register::Reader r);
  void SendManifest(const std::string& peer, const std::string& model_name);

  BrokerOptions options_;
  const transport::Clock* clock_;
  workers::ExpertStoreLayout layout_;
  std::unique_ptr<uint8_t[]> store_;
  std::vector<uint64_t> checksums_;
  std::unique_ptr<transport::ucx::Context> ucx_ctx_;
  std::unique_ptr<transport::ucx::Worker> ucx_worker_;
  std::unique_ptr<transport::ucx::MemoryRegion> region_;
  std::unique_ptr<transport::ControlServer> server_;
  std::string endpoint_;
  std::map<std::string, WorkerRecord> workers_;
  uint64_t manifests_served_ = 0;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Gauge* workers_gauge_ = nullptr;
  prometheus::Counter* manifests_counter_ = nullptr;
};

}  // namespace pw::broker
