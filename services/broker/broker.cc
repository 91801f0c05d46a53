#include "services/broker/broker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/logging.h"
#include "common/formats/checkpoint_experts.h"
#include "common/plane_layout.h"
#include "services/proto/part_checksum.h"
#include "services/proto/weight_kind.h"
#include "services/transport/zmq_transport.h"
#include "common/formats/model_hash_cache.h"
#include "services/common/model_name.h"

namespace pw::broker {

Broker::Broker(BrokerOptions options, const Clock* clock)
    : options_(std::move(options)), clock_(clock), beat_(options_.main_loop_stale_ms) {}

Broker::~Broker() {
  // Every registration goes before the worker and the context it was made on (UCX asserts on
  // a region still registered at cleanup); the planner reads the served store.
  planner_.reset();
  region_.reset();
  served_.reset();
  ucx_worker_.reset();
  ucx_ctx_.reset();
}

Result<std::unique_ptr<Broker>> Broker::Create(BrokerOptions options,
                                               const Clock* clock) {
  if (options.model_dir.empty()) return InvalidArgument("broker: model dir is required");
  if (options.model_name.empty()) options.model_name = service::ModelNameFromDir(options.model_dir);
  std::unique_ptr<Broker> b(
      new Broker(std::move(options), clock ? clock : SteadyClock::Get()));
  PW_RETURN_IF_ERROR(b->Setup());
  return b;
}

Status Broker::SetupBf16Store(const CheckpointExperts& experts) {
  // The store: every expert block of the checkpoint, copied into one registered buffer.
  layout_ = service::ExpertStoreLayout::For(experts.config());
  if (layout_.regions.empty()) return Unsupported("broker: the model has no MoE experts");
  store_.reset(new uint8_t[layout_.total_bytes]);
  std::memset(store_.get(), 0, layout_.total_bytes);
  checksums_.resize(layout_.regions.size());
  for (size_t i = 0; i < layout_.regions.size(); ++i) {
    const auto& r = layout_.regions[i];
    PW_ASSIGN_OR_RETURN(ExpertTensors w, experts.Get(r.layer, r.expert));
    uint8_t* dst = store_.get() + r.offset;
    const size_t matrix = static_cast<size_t>(w.ffn * w.hidden) * 2;
    if (r.proj == ExpertProj::kGateUp) {
      if (matrix * 2 != r.bytes) return Corrupt("broker: expert gate/up shapes disagree with config.json");
      std::memcpy(dst, w.gate, matrix);
      std::memcpy(dst + matrix, w.up, matrix);
    } else {
      if (matrix != r.bytes) return Corrupt("broker: expert down shape disagrees with config.json");
      std::memcpy(dst, w.down, r.bytes);
    }
    checksums_[i] = proto::PartChecksumOf(proto::kPartChecksumKind, dst, r.bytes);
  }
  PW_ASSIGN_OR_RETURN(region_, transport::ucx::MemoryRegion::Register(*ucx_ctx_, store_.get(),
                                                                     layout_.total_bytes));
  return Status::Ok();
}

Status Broker::Setup() {
  // The checkpoint's experts only: the broker runs no model.
  PW_ASSIGN_OR_RETURN(auto experts, CheckpointExperts::Open(options_.model_dir));
  const ModelConfig& cfg = experts->config();
  if (cfg.num_experts < 1) return Unsupported("broker: the model has no MoE experts");
  PW_ASSIGN_OR_RETURN(ucx_ctx_, transport::ucx::Context::Create());
  PW_ASSIGN_OR_RETURN(ucx_worker_, transport::ucx::Worker::Create(*ucx_ctx_));
  const int num_layers = static_cast<int>(cfg.num_layers), num_experts = static_cast<int>(cfg.num_experts);
  std::vector<uint32_t> moe_layers;
  std::vector<bool> block_layers(static_cast<size_t>(num_layers), false);
  for (int l = 0; l < num_layers; ++l) {
    if (!cfg.IsMoeLayer(l)) continue;
    moe_layers.push_back(static_cast<uint32_t>(l));
    block_layers[static_cast<size_t>(l)] = true;
  }
  if (!options_.store_path.empty()) {
    if (options_.initial_bits < anyprec::kMinBits || options_.initial_bits > anyprec::kMaxBits) {
      return InvalidArgument("broker: initial_bits " + std::to_string(options_.initial_bits) +
                             " outside 3..8");
    }
    uint64_t hash = 0;
    if (options_.model_hash_cache.empty()) {
      PW_ASSIGN_OR_RETURN(hash, experts->Hash());
    } else {
      PW_ASSIGN_OR_RETURN(CachedModelHash cached,
                          ModelHashCached(options_.model_dir, options_.model_hash_cache));
      hash = cached.hash;
      PW_LOG(INFO) << "broker: model hash " << std::hex << hash << std::dec
                   << (cached.from_cache ? " remembered in " : " computed, kept in ")
                   << options_.model_hash_cache;
    }
    PW_ASSIGN_OR_RETURN(served_, ServedStore::Open(options_.store_path, hash, *ucx_ctx_));
    // Blocks are numbered by the model's layers; the store holds exactly the MoE layers (a
    // dense layer, e.g. GLM-4.5's first, has none).
    if (served_->store().info().num_layers != static_cast<uint32_t>(num_layers)) {
      return Unsupported("broker: store " + options_.store_path + " was made for a model of " +
                         std::to_string(served_->store().info().num_layers) + " layers, the model has " +
                         std::to_string(num_layers));
    }
    PW_RETURN_IF_ERROR(apw::CheckStoreLayers(served_->store().info(), moe_layers,
                                             "broker: store " + options_.store_path + ": "));
    book_ = std::make_unique<PlanBook>(num_layers, num_experts, options_.initial_bits,
                                       anyprec::kMinBits, anyprec::kMaxBits, block_layers);
  } else {
    PW_RETURN_IF_ERROR(SetupBf16Store(*experts));
    book_ = std::make_unique<PlanBook>(num_layers, num_experts, 16, 16, 16, block_layers);
  }
  registration_.model = cfg;
  experts.reset();
  ucx_worker_->StartProgressThread();

  PW_ASSIGN_OR_RETURN(auto t, transport::ZmqRouterTransport::Bind(options_.bind));
  endpoint_ = t->endpoint();
  transport::ControlServer::Options so;
  so.id = options_.id;
  so.heartbeat_ms = options_.heartbeat_ms;
  server_ = std::make_unique<transport::ControlServer>(std::move(t), clock_, so);
  server_->on_register = [this](const std::string& peer, wire::Register::Reader r, uint16_t minor) {
    return OnRegister(peer, r, minor);
  };
  server_->on_peer_dead = [this](const std::string& peer, const transport::PeerInfo&) {
    workers_.erase(peer);
    book_->Forget(peer);
    plan_sent_ms_.erase(peer);
    if (workers_gauge_) workers_gauge_->Set(static_cast<double>(workers_.size()));
  };

  registry_ = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge().Name("pagedweight_broker_store_bytes")
      .Help("Bytes of the host expert store").Register(*registry_).Add({})
      .Set(static_cast<double>(served_ ? served_->bytes() : layout_.total_bytes));
  workers_gauge_ = &prometheus::BuildGauge().Name("pagedweight_broker_workers")
                        .Help("Registered workers").Register(*registry_).Add({});
  manifests_counter_ = &prometheus::BuildCounter().Name("pagedweight_broker_manifests_total")
                            .Help("Weight manifests served").Register(*registry_).Add({});
  plans_counter_ = &prometheus::BuildCounter().Name("pagedweight_broker_plans_sent_total")
                        .Help("Plans sent to decode workers").Register(*registry_).Add({});
  auto& ctl = prometheus::BuildCounter().Name("pagedweight_broker_ctl_requests_total")
                  .Help("pw-ctl requests by result").Register(*registry_);
  ctl_counter_ = &ctl.Add({{"result", "ok"}});
  ctl_errors_counter_ = &ctl.Add({{"result", "error"}});
  epoch_gauge_ = &prometheus::BuildGauge().Name("pagedweight_broker_plan_epoch")
                      .Help("Epoch of the latest plan").Register(*registry_).Add({});
  committed_family_ = &prometheus::BuildGauge().Name("pagedweight_committed_blocks")
                           .Help("Expert blocks per committed width, per decode worker and layer "
                                 "(the broker's mirror of the workers' tables)")
                           .Register(*registry_);
  if (options_.planner.enabled) {
    if (!served_) return InvalidArgument("broker: the planner needs an .apw store (--store)");
    PW_ASSIGN_OR_RETURN(planner_, PlannerDriver::Create(served_->store(), options_.planner));
    if (!options_.planner_residuals.empty()) {
      PW_ASSIGN_OR_RETURN(ResidualHeads heads,
                          ResidualHeads::Load(options_.planner_residuals, served_->store().info().model_hash));
      PW_RETURN_IF_ERROR(planner_->SetResidualHeads(std::make_shared<const ResidualHeads>(std::move(heads))));
    }
    planner_plans_ = &prometheus::BuildCounter().Name("pagedweight_broker_planner_plans_total")
                          .Help("Plans the planner made, by action (lower, raise)").Register(*registry_);
    planner_pages_ = &prometheus::BuildCounter().Name("pagedweight_broker_planner_pages_total")
                          .Help("Pool pages the planner's plans free (lower) or take (raise)")
                          .Register(*registry_);
    planner_errors_ = &prometheus::BuildCounter().Name("pagedweight_broker_planner_errors_total")
                           .Help("Planner ticks that failed").Register(*registry_).Add({});
    planner_damage_ = &prometheus::BuildCounter().Name("pagedweight_broker_planner_damage_total")
                           .Help("Weighted step damage the planner's plans add (lower) or avoid (raise)")
                           .Register(*registry_);
    planner_seconds_ = &prometheus::BuildHistogram().Name("pagedweight_broker_planner_decision_seconds")
                            .Help("Wall time of one planner decision (inputs to plan)").Register(*registry_)
                            .Add({}, prometheus::Histogram::BucketBoundaries{1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1});
  }
  if (!options_.metrics_bind.empty()) {
    auto http = service::MetricsHttp::Create(options_.metrics_bind, registry_, &beat_);
    if (!http.ok()) return Unavailable("broker: " + http.status().message());
    http_ = std::move(*http);
  }
  if (served_) {
    PW_LOG(INFO) << "broker: store " << options_.store_path << " (" << served_->store().num_blocks()
                 << " blocks, " << served_->num_parts() << " parts, " << served_->bytes()
                 << " bytes mapped and registered), initial width " << options_.initial_bits
                 << " bits; control " << endpoint_;
  } else {
    PW_LOG(INFO) << "broker: " << layout_.regions.size() << " bf16 expert blocks, "
                 << layout_.total_bytes << " bytes registered; control " << endpoint_;
  }
  return Status::Ok();
}

Status Broker::OnRegister(const std::string& peer, wire::Register::Reader r, uint16_t minor) {
  const std::string model = proto::ToString(r.getModelName());
  if (!model.empty() && model != options_.model_name) {
    return InvalidArgument("worker serves model '" + model + "', this broker holds '" +
                           options_.model_name + "'");
  }
  // Before anything acts on it: a refused Register leaves the registry and the plans as they were.
  PW_RETURN_IF_ERROR(service::CheckRegistration(r, registration_, minor));
  WorkerRecord rec;
  rec.id = peer;
  rec.role = static_cast<int>(r.getRole());
  for (auto e : r.getWeightTable()) {
    ++rec.weight_entries;
    rec.committed_bits_sum += e.getCommittedBits();
  }
  if (r.getRole() == wire::Role::DECODE && r.hasWeightTable()) {
    std::vector<BlockWidth> committed, desired;
    for (auto e : r.getWeightTable()) {
      const ExpertProj proj = proto::FromWire(e.getKind());
      committed.push_back({static_cast<int>(e.getLayer()), static_cast<int>(e.getExpert()), proj, e.getCommittedBits()});
      desired.push_back({static_cast<int>(e.getLayer()), static_cast<int>(e.getExpert()), proj, e.getDesiredBits()});
    }
    PW_RETURN_IF_ERROR(book_->Mirror(peer, committed).WithContext("weight table of '" + peer + "'"));
    book_->AdoptDesired(desired);
    book_->Residency(peer, r.getResidencyCapacity());
    plan_sent_ms_[peer] = 0;
    ExportPlanMetrics();
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

void Broker::SendManifest(const std::string& peer, const std::string& model_name,
                          uint16_t peer_minor) {
  proto::OutMessage m;
  auto wm = m.body().initWeightManifest();
  const Status reads = proto::CheckPeerReadsPartChecksums(peer_minor);
  if (!model_name.empty() && model_name != options_.model_name) {
    wm.setOk(false);
    wm.setError("this broker holds '" + options_.model_name + "', not '" + model_name + "'");
  } else if (!reads.ok()) {
    PW_LOG(WARNING) << "broker: manifest refused to '" << peer << "': " << reads.message();
    wm.setOk(false);
    wm.setError(reads.message());
  } else if (served_) {
    served_->FillManifest(wm, ucx_worker_->Address(), options_.initial_bits);
  } else {
    wm.setOk(true);
    auto mem = wm.initMemory();
    mem.setWorkerAddress(proto::AsData(ucx_worker_->Address()));
    mem.setRkey(proto::AsData(region_->PackedRkey()));
    mem.setBaseAddr(region_->base());
    mem.setBytes(region_->size());
    wm.setChecksumKind(proto::kPartChecksumKind);
    auto regions = wm.initRegions(static_cast<unsigned>(layout_.regions.size()));
    for (size_t i = 0; i < layout_.regions.size(); ++i) {
      const auto& r = layout_.regions[i];
      auto w = regions[static_cast<unsigned>(i)];
      w.setLayer(static_cast<uint32_t>(r.layer));
      w.setExpert(static_cast<uint32_t>(r.expert));
      w.setKind(proto::ToWire(r.proj));
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
      SendManifest(peer, proto::ToString(m.body().getWeightManifestRequest().getModelName()),
                   m.version_minor());
      return Status::Ok();
    case proto::Body::PLAN_ACK:
      return OnPlanAck(peer, m.body().getPlanAck());
    case proto::Body::TELEMETRY: {
      auto t = m.body().getTelemetry();
      WorkerPool p;
      p.page_bytes = t.getPageBytes();
      p.kv = t.getPoolPagesKv();
      p.weights = t.getPoolPagesWeights();
      p.free = t.getPoolPagesFree();
      p.epoch = t.getPlanEpoch();
      p.pending = t.getChangesPending();
      p.kv_demand = t.getKvDemandPages();
      p.residency_capacity = t.getResidencyCapacity();
      for (float x : t.getExpertMass()) p.mass.push_back(x);
      for (float x : t.getPromptFeatures()) p.prompt_features.push_back(x);
      book_->Telemetry(peer, p);
      return Status::Ok();
    }
    case proto::Body::CTL_REQUEST:
      OnCtl(peer, m.body().getCtlRequest());
      return Status::Ok();
    default:
      return InvalidArgument("unexpected message " + proto::BodyName(m.which()) + " for the broker");
  }
}

Status Broker::OnPlanAck(const std::string& peer, wire::PlanAck::Reader r) {
  std::vector<BlockWidth> committed;
  for (auto e : r.getCommitted()) {
    committed.push_back({static_cast<int>(e.getLayer()), static_cast<int>(e.getExpert()),
                         proto::FromWire(e.getKind()),
                         e.getCommittedBits()});
  }
  if (r.hasRefused() && r.getRefused().size() > 0) {
    PW_LOG(WARNING) << "broker: '" << peer << "' refused " << r.getRefused().size()
                    << " change(s) of epoch " << r.getEpoch() << ": " << proto::ToString(r.getReason());
  }
  PW_RETURN_IF_ERROR(book_->Acked(peer, r.getEpoch(), committed, r.getComplete()));
  plan_sent_ms_.emplace(peer, 0);  // a worker known from its acks gets plans too
  ExportPlanMetrics();
  return Status::Ok();
}

void Broker::OnCtl(const std::string& peer, wire::CtlRequest::Reader r) {
  proto::OutMessage out;
  auto reply = out.body().initCtlReply();
  Result<uint64_t> epoch = uint64_t{0};
  switch (r.which()) {
    case wire::CtlRequest::SHOW: {
      auto s = r.getShow();
      reply.setOk(true);
      std::string text = book_->Show(s.getBlocks(), s.getLayer());
      if (planner_ != nullptr) {
        const PlannerDriver::Outcome* last = planner_->last();
        text += last == nullptr ? "planner: on, no decision yet\n"
                                : "planner: last decision for '" + last->worker + "': " +
                                      planner::PlanActionName(last->decision.action) + ", " +
                                      std::to_string(last->decision.changes.size()) + " change(s), epoch " +
                                      std::to_string(last->epoch) + "; " + last->decision.reason + "\n";
        if (last != nullptr && !last->prompt_residuals.empty()) {
          // exp(residual) per layer, gate_up/down: the prompt factor on each layer's step damage.
          text += "planner: prompt residuals (damage factor, layer: gate_up/down):";
          char buf[48];
          for (size_t l = 0; l * 2 + 1 < last->prompt_residuals.size(); ++l) {
            std::snprintf(buf, sizeof buf, " %zu: %.3f/%.3f", l, last->prompt_residuals[l * 2],
                          last->prompt_residuals[l * 2 + 1]);
            text += buf;
          }
          text += "\n";
        } else if (planner_->residual_heads() != nullptr) {
          text += planner_->params().use_prompt_residuals ? "planner: prompt residuals: heads loaded, no features yet\n"
                                                          : "planner: prompt residuals: off (ablation)\n";
        }
      }
      reply.setText(text);
      break;
    }
    case wire::CtlRequest::SET_BITS: {
      auto s = r.getSetBits();
      epoch = book_->SetBits(s.getBits(), s.getLayer(), s.getExpert(), s.getKind());
      break;
    }
    case wire::CtlRequest::APPLY: {
      std::vector<PlanBook::Selection> selections;
      for (auto e : r.getApply()) {
        selections.push_back({e.getBits(), e.getLayer(), e.getExpert(), e.getKind()});
      }
      epoch = book_->Apply(selections);
      break;
    }
    default:
      epoch = InvalidArgument("unknown pw-ctl request");
  }
  if (r.which() != wire::CtlRequest::SHOW) {
    if (epoch.ok()) {
      reply.setOk(true);
      reply.setEpoch(*epoch);
      reply.setText("plan epoch " + std::to_string(*epoch) + " sent to " +
                    std::to_string(plan_sent_ms_.size()) + " decode worker(s)");
      SendPlans(/*force=*/true);
    } else {
      reply.setOk(false);
      reply.setError(epoch.status().message());
    }
  }
  (reply.getOk() ? ctl_counter_ : ctl_errors_counter_)->Increment();
  Status st = server_->Send(peer, out);
  if (!st.ok()) PW_LOG(WARNING) << "broker: pw-ctl reply to '" << peer << "': " << st.ToString();
}

void Broker::SendPlans(bool force) {
  const uint64_t now = clock_->NowMs();
  for (auto& [peer, sent] : plan_sent_ms_) {
    if (!force && sent != 0 && now - sent < options_.plan_resend_ms) continue;
    const std::vector<BlockWidth> pending = book_->PendingFor(peer);
    if (pending.empty()) continue;
    proto::OutMessage m;
    auto plan = m.body().initPlan();
    plan.setEpoch(book_->epoch());
    auto list = plan.initChanges(static_cast<unsigned>(pending.size()));
    for (size_t i = 0; i < pending.size(); ++i) {
      auto e = list[static_cast<unsigned>(i)];
      e.setLayer(static_cast<uint32_t>(pending[i].layer));
      e.setExpert(static_cast<uint32_t>(pending[i].expert));
      e.setKind(proto::ToWire(pending[i].proj));
      e.setDesiredBits(static_cast<uint8_t>(pending[i].bits));
    }
    Status st = server_->Send(peer, m);
    if (!st.ok()) {
      PW_LOG(WARNING) << "broker: plan to '" << peer << "': " << st.ToString();
      continue;
    }
    sent = now;
    book_->Sent(peer, pending);
    plans_counter_->Increment();
  }
  epoch_gauge_->Set(static_cast<double>(book_->epoch()));
}

void Broker::ExportPlanMetrics() {
  // Per worker and layer: blocks at each width (from the mirror).
  const int L = book_->num_layers(), E = book_->num_experts();
  for (const auto& [peer, sent] : plan_sent_ms_) {
    const std::vector<int>* committed = book_->Committed(peer);
    if (committed == nullptr) continue;
    for (int l = 0; l < L; ++l) {
      int count[17] = {};
      for (int e = 0; e < E; ++e) {
        for (int p = 0; p < 2; ++p) count[(*committed)[ExpertBlockIndex(l, e, static_cast<ExpertProj>(p), E)]]++;
      }
      for (int b : {0, 3, 4, 5, 6, 7, 8, 16}) {
        committed_family_->Add({{"worker", peer}, {"layer", std::to_string(l)}, {"bits", std::to_string(b)}})
            .Set(count[b]);
      }
    }
  }
}

void Broker::RunPlanner() {
  std::vector<std::string> decode;
  for (const auto& [peer, sent] : plan_sent_ms_) decode.push_back(peer);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = planner_->Tick(clock_->NowMs(), book_.get(), decode);
  if (r.ok() && r->has_value()) {
    planner_seconds_->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (!r.ok()) {
    planner_errors_->Increment();
    PW_LOG(WARNING) << "broker: planner: " << r.status().ToString();
    return;
  }
  if (!r->has_value() || (*r)->epoch == 0) return;
  const auto& o = **r;
  const char* action = planner::PlanActionName(o.decision.action);
  planner_plans_->Add({{"action", action}}).Increment();
  planner_pages_->Add({{"action", action}}).Increment(static_cast<double>(o.decision.pages_moved));
  planner_damage_->Add({{"action", action}}).Increment(std::max(0.0, o.decision.damage));
  PW_LOG(INFO) << "broker: planner epoch " << o.epoch << " for '" << o.worker << "': " << action << " "
               << o.decision.changes.size() << " block(s)"
               << (o.raises_taken_back > 0 ? " (" + std::to_string(o.raises_taken_back) + " pending raise(s) taken back)"
                                           : std::string())
               << "; " << o.decision.reason;
  SendPlans(/*force=*/true);
}

void Broker::PollOnce(int timeout_ms) {
  beat_.Beat();
  server_->Poll(timeout_ms, [this](const std::string& peer, const proto::InMessage& m) {
    return Handle(peer, m);
  });
  if (planner_) RunPlanner();
  SendPlans(/*force=*/false);
}

Status Broker::Run(const std::atomic<bool>& stop) {
  while (!stop.load()) PollOnce(50);
  PW_LOG(INFO) << "broker: stopped";
  return Status::Ok();
}

}  // namespace pw::broker
