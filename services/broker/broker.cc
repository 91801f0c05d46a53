#include "services/broker/broker.h"

#include <cstring>

#include "common/hash.h"
#include "common/logging.h"
#include "services/engine/model.h"
#include "services/transport/zmq_transport.h"
#include "services/workers/worker_common.h"

namespace pw::broker {

Broker::Broker(BrokerOptions options, const transport::Clock* clock)
    : options_(std::move(options)), clock_(clock) {}

Broker::~Broker() {
  region_.reset();
  ucx_worker_.reset();
  ucx_ctx_.reset();
}

Result<std::unique_ptr<Broker>> Broker::Create(BrokerOptions options,
                                               const transport::Clock* clock) {
  if (options.model_dir.empty()) return InvalidArgument("broker: model dir is required");
  if (options.model_name.empty()) options.model_name = workers::ModelNameFromDir(options.model_dir);
  std::unique_ptr<Broker> b(
      new Broker(std::move(options), clock ? clock : transport::SteadyClock::Get()));
  PW_RETURN_IF_ERROR(b->Setup());
  return b;
}

Status Broker::Setup() {
  // The store: every expert block of the checkpoint, copied into one registered buffer.
  PW_ASSIGN_OR_RETURN(auto model, engine::Model::Load(options_.model_dir));
  layout_ = workers::ExpertStoreLayout::For(model->config());
  if (layout_.regions.empty()) return Unsupported("broker: the model has no MoE experts");
  store_.reset(new uint8_t[layout_.total_bytes]);
  std::memset(store_.get(), 0, layout_.total_bytes);
  checksums_.resize(layout_.regions.size());
  for (size_t i = 0; i < layout_.regions.size(); ++i) {
    const auto& r = layout_.regions[i];
    const auto& w = model->layers()[static_cast<size_t>(r.layer)].experts[static_cast<size_t>(r.expert)];
    uint8_t* dst = store_.get() + r.offset;
    if (r.kind == 0) {
      const size_t half = static_cast<size_t>(w.gate.rows * w.gate.cols) * 2;
      if (half * 2 != r.bytes || w.up.rows * w.up.cols * 2 != static_cast<int64_t>(half)) {
        return Corrupt("broker: expert gate/up shapes disagree with config.json");
      }
      std::memcpy(dst, w.gate.data, half);
      std::memcpy(dst + half, w.up.data, half);
    } else {
      if (static_cast<uint64_t>(w.down.rows * w.down.cols) * 2 != r.bytes) {
        return Corrupt("broker: expert down shape disagrees with config.json");
      }
      std::memcpy(dst, w.down.data, r.bytes);
    }
    checksums_[i] = Fnv1a64Of(dst, r.bytes);
  }
  PW_ASSIGN_OR_RETURN(ucx_ctx_, transport::ucx::Context::Create());
  PW_ASSIGN_OR_RETURN(ucx_worker_, transport::ucx::Worker::Create(*ucx_ctx_));
  PW_ASSIGN_OR_RETURN(region_, transport::ucx::MemoryRegion::Register(*ucx_ctx_, store_.get(),
                                                                     layout_.total_bytes));
  ucx_worker_->StartProgressThread();

  PW_ASSIGN_OR_RETURN(auto t, transport::ZmqRouterTransport::Bind(options_.bind));
  endpoint_ = t->endpoint();
  transport::ControlServer::Options so;
  so.id = options_.id;
  so.heartbeat_ms = options_.heartbeat_ms;
  server_ = std::make_unique<transport::ControlServer>(std::move(t), clock_, so);
  server_->on_register = [this](const std::string& peer, wire::Register::Reader r) {
    return OnRegister(peer, r);
  };
  server_->on_peer_dead = [this](const std::string& peer, const transport::PeerInfo&) {
    workers_.erase(peer);
    if (workers_gauge_) workers_gauge_->Set(static_cast<double>(workers_.size()));
  };

  registry_ = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge().Name("pagedweight_broker_store_bytes")
      .Help("Bytes of the host expert store").Register(*registry_).Add({})
      .Set(static_cast<double>(layout_.total_bytes));
  workers_gauge_ = &prometheus::BuildGauge().Name("pagedweight_broker_workers")
                        .Help("Registered workers").Register(*registry_).Add({});
  manifests_counter_ = &prometheus::BuildCounter().Name("pagedweight_broker_manifests_total")
                            .Help("Weight manifests served").Register(*registry_).Add({});
  if (!options_.metrics_bind.empty()) {
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(options_.metrics_bind);
      exposer_->RegisterCollectable(registry_);
    } catch (const std::exception& e) {
      return Unavailable("broker: cannot serve /metrics on '" + options_.metrics_bind + "': " + e.what());
    }
  }
  PW_LOG(INFO) << "broker: " << layout_.regions.size() << " expert blocks, "
               << layout_.total_bytes << " bytes registered; control " << endpoint_;
  return Status::Ok();
}

Status Broker::OnRegister(const std::string& peer, wire::Register::Reader r) {
  const std::string model = proto::ToString(r.getModelName());
  if (!model.empty() && model != options_.model_name) {
    return InvalidArgument("worker serves model '" + model + "', this broker holds '" +
                           options_.model_name + "'");
  }
  WorkerRecord rec;
  rec.id = peer;
  rec.role = static_cast<int>(r.getRole());
  for (auto e : r.getWeightTable()) {
    ++rec.weight_entries;
    rec.committed_bits_sum += e.getCommittedBits();
  }
  const bool known = workers_.count(peer) != 0;
  workers_[peer] = rec;
  workers_gauge_->Set(static_cast<double>(workers_.size()));
  if (!known) {
    PW_LOG(INFO) << "broker: worker '" << peer << "' registered (" << rec.weight_entries
                 << " weight table entries)";
  }
  return Status::Ok();
}

void Broker::SendManifest(const std::string& peer, const std::string& model_name) {
  proto::OutMessage m;
  auto wm = m.body().initWeightManifest();
  if (!model_name.empty() && model_name != options_.model_name) {
    wm.setOk(false);
    wm.setError("this broker holds '" + options_.model_name + "', not '" + model_name + "'");
  } else {
    wm.setOk(true);
    auto mem = wm.initMemory();
    mem.setWorkerAddress(proto::AsData(ucx_worker_->Address()));
    mem.setRkey(proto::AsData(region_->PackedRkey()));
    mem.setBaseAddr(region_->base());
    mem.setBytes(region_->size());
    auto regions = wm.initRegions(static_cast<unsigned>(layout_.regions.size()));
    for (size_t i = 0; i < layout_.regions.size(); ++i) {
      const auto& r = layout_.regions[i];
      auto w = regions[static_cast<unsigned>(i)];
      w.setLayer(static_cast<uint32_t>(r.layer));
      w.setExpert(static_cast<uint32_t>(r.expert));
      w.setKind(r.kind == 0 ? wire::WeightKind::GATE_UP : wire::WeightKind::DOWN);
      w.setOffset(r.offset);
      w.setBytes(r.bytes);
      w.setBits(16);
      w.setChecksum(checksums_[i]);
    }
  }
  Status st = server_->Send(peer, m);
  if (!st.ok()) {
    PW_LOG(WARNING) << "broker: manifest to '" << peer << "': " << st.ToString();
    return;
  }
  ++manifests_served_;
  manifests_counter_->Increment();
}

Status Broker::Handle(const std::string& peer, const proto::InMessage& m) {
  switch (m.which()) {
    case proto::Body::WEIGHT_MANIFEST_REQUEST:
      SendManifest(peer, proto::ToString(m.body().getWeightManifestRequest().getModelName()));
      return Status::Ok();
    case proto::Body::PLAN_ACK:
    case proto::Body::TELEMETRY:
      return Status::Ok();  // consumed by the planner (later issues)
    default:
      return InvalidArgument("unexpected message " + proto::BodyName(m.which()) + " for the broker");
  }
}

void Broker::PollOnce(int timeout_ms) {
  server_->Poll(timeout_ms, [this](const std::string& peer, const proto::InMessage& m) {
    return Handle(peer, m);
  });
}

Status Broker::Run(const std::atomic<bool>& stop) {
  while (!stop.load()) PollOnce(50);
  PW_LOG(INFO) << "broker: stopped";
  return Status::Ok();
}

}  // namespace pw::broker
