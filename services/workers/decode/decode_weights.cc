#include "services/workers/decode/decode_weights.h"

#include "common/expert_block.h"
#include "common/logging.h"
#include "services/proto/weight_kind.h"
#include "common/clock.h"

namespace pw::workers {
namespace {

// One weight-table entry on the wire for block `index` (ExpertBlockIndex order).
void FillWeightEntry(wire::WeightEntry::Builder e, size_t index, int num_experts, int committed,
                     int desired) {
  const ExpertBlock b = ExpertBlockAt(index, num_experts);
  e.setLayer(static_cast<uint32_t>(b.layer));
  e.setExpert(static_cast<uint32_t>(b.expert));
  e.setKind(proto::ToWire(b.proj));
  e.setCommittedBits(static_cast<uint8_t>(committed));
  e.setDesiredBits(static_cast<uint8_t>(desired));
}

// A private copy of a frame, for what must outlive the handler it arrived in.
Result<std::unique_ptr<proto::InMessage>> CopyFrame(const proto::InMessage& m) {
  ::capnp::MallocMessageBuilder b;
  b.setRoot(m.envelope());
  auto flat = ::capnp::messageToFlatArray(b);
  auto bytes = flat.asBytes();
  return proto::InMessage::Parse(
      std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
}

}  // namespace

DecodeWeights::DecodeWeights(DecodeWeightsOptions options, const ModelConfig& config,
                             memory::PagePool* pool, transport::ucx::Worker* ucx,
                             transport::ControlClient* broker, prometheus::Registry& registry)
    : options_(std::move(options)), config_(config), pool_(pool), ucx_(ucx), broker_(broker),
      metrics_(PagedMetrics::Register(registry, options_.worker_id, static_cast<int>(config.num_layers))),
      registry_(registry) {}

DecodeWeights::~DecodeWeights() {
  residency_.reset();  // before the weights it follows
}

void DecodeWeights::AddHooks(engine::MoeHooks* hooks) {
  hooks->provider = provider();
  if (residency_) residency_->Install(hooks->routing_hook, hooks);
}

engine::ExpertWeightProvider* DecodeWeights::provider() {
  if (paged_) return paged_->provider();
  return experts_.get();
}

Status DecodeWeights::Load() {
  if (broker_ == nullptr) return Status::Ok();
  PW_RETURN_IF_ERROR(broker_->Start());
  PW_LOG(INFO) << "waiting for the broker's expert weights (up to " << options_.timeout_ms << " ms)";
  const uint64_t t0 = SteadyClock::Get()->NowMs();
  uint64_t last_ask = t0;
  while (!experts_ && !paged_) {
    if (options_.stop != nullptr && options_.stop->load()) {
      return Cancelled("stopped while waiting for the broker's expert weights");
    }
    const uint64_t now = SteadyClock::Get()->NowMs();
    if (now - t0 > static_cast<uint64_t>(options_.timeout_ms)) {
      return Unavailable("no expert weights from the broker after " +
                         std::to_string(options_.timeout_ms) + " ms");
    }
    // Ask again now and then: a manifest request can be lost with a restarting broker.
    if (broker_->registered() && manifest_pending_ && now - last_ask > 5000) {
      last_ask = now;
      proto::OutMessage m;
      m.body().initWeightManifestRequest().setModelName(options_.model_name);
      (void)broker_->Send(m);
    }
    broker_->Poll(20, [this](const std::string&, const proto::InMessage& m) -> Status {
      return Handle(m);
    });
    if (manifest_) PW_RETURN_IF_ERROR(OnManifest(std::move(manifest_)));
  }
  return Status::Ok();
}

void DecodeWeights::OnBrokerRegistered() {
  // Once serving, a new registration means a new broker process: its store needs a new
  // manifest (new UCX coordinates) before planes can move again.
  if (experts_) return;
  proto::OutMessage m;
  m.body().initWeightManifestRequest().setModelName(options_.model_name);
  Status st = broker_->Send(m);
  if (!st.ok()) PW_LOG(WARNING) << "weight manifest request: " << st.ToString();
  manifest_pending_ = true;
}

void DecodeWeights::OnBrokerLost() {
  if (paged_) paged_->CancelTransfers("broker lost");
}

Status DecodeWeights::OnManifest(std::unique_ptr<proto::InMessage> msg) {
  auto manifest = msg->body().getWeightManifest();
  if (paged_) {
    // A restarted broker: same store, new coordinates.
    Status st = paged_->Rebind(*ucx_, manifest);
    if (!st.ok()) {
      PW_LOG(ERROR) << options_.worker_id << ": the restarted broker's store: " << st.ToString()
                    << "; expert widths stay as they are";
    } else {
      PW_LOG(INFO) << options_.worker_id << ": reading planes from the restarted broker";
    }
    SendFullAck();
    return Status::Ok();
  }
  if (manifest.getOk() && manifest.getAnyPrecision()) {
    PagedWeightsOptions po = options_.paged;
    if (po.pacing == MoverPacing::kAuto) {
      // Steps only for a budget with small experts: there a fetch is a round trip, and an
      // admission moving during the step delays it; a large expert's admission held through
      // long steps would starve (paged_weights.h, MoverPacing).
      const double expert_bytes = 3.0 * static_cast<double>(config_.hidden_size) *
                                  static_cast<double>(config_.moe_intermediate_size) * manifest.getInitialBits() / 8.0;
      po.pacing = PagedResidency::Enabled(options_.misses) && expert_bytes <= kAutoStepsMaxExpertBytes
                      ? MoverPacing::kSteps
                      : MoverPacing::kFree;
    }
    PW_LOG(INFO) << options_.worker_id << ": background width changes paced: " << MoverPacingName(po.pacing);
    auto p = PagedWeights::Create(pool_, config_, *ucx_, manifest, po);
    if (!p.ok()) return p.status().WithContext("loading experts from the broker");
    paged_ = std::move(p).value();
    const int bits = manifest.getInitialBits();
    if (PagedResidency::Enabled(options_.misses)) {  // cold: the first tokens fetch experts
      PW_ASSIGN_OR_RETURN(residency_, PagedResidency::Create(options_.misses, config_, paged_.get(), pool_, bits));
      residency_metrics_ = ResidencyMetrics::Register(registry_, options_.worker_id);
      PW_LOG(INFO) << options_.worker_id << ": residency budget of " << residency_->capacity()
                   << " experts per layer, " << misses::DescribeMissConfig(residency_->policy().config());
    } else {
      // Seconds of transfers: keep beating to the broker meanwhile (its 3 silent heartbeats
      // would declare this worker dead while it loads).
      auto beat = [this] { (void)broker_->HeartbeatIfDue(broker_->fill_heartbeat); };
      PW_RETURN_IF_ERROR(paged_->LoadAll(bits, options_.timeout_ms, beat)
                             .WithContext("loading experts at " + std::to_string(bits) + " bits"));
    }
    bytes_loaded_ = paged_->stats().bytes_raised;
    SendFullAck();
    int blocks = 0;  // a dense layer's slots hold none
    for (int i = 0; i < paged_->table().num_blocks(); ++i) blocks += paged_->HasBlock(static_cast<size_t>(i)) ? 1 : 0;
    PW_LOG(INFO) << options_.worker_id << ": loaded " << blocks
                 << " expert blocks at " << bits << " bits (" << pool_->Count(memory::Tenant::kWeights)
                 << " of " << pool_->num_pages() << " pages of " << pool_->page_bytes()
                 << " bytes) from the broker";
    return Status::Ok();
  }
  if (PagedResidency::Enabled(options_.misses)) return InvalidArgument("a residency budget needs an any-precision store");
  auto p = RemoteExpertProvider::Load(*ucx_, manifest, config_, options_.bf16_experts);
  if (!p.ok()) return p.status().WithContext("loading experts from the broker");
  experts_ = std::move(p).value();
  bytes_loaded_ = experts_->bytes_loaded();
  PW_LOG(INFO) << options_.worker_id << ": loaded " << experts_->layout().regions.size()
               << " expert blocks (" << experts_->bytes_loaded() << " bytes) from the broker"
               << (experts_->packed() ? ", held packed in " + std::to_string(experts_->bytes_held()) + " bytes"
                                      : std::string(", held as fetched"));
  return Status::Ok();
}

Status DecodeWeights::Handle(const proto::InMessage& m) {
  if (m.which() == proto::Body::WEIGHT_MANIFEST) {
    if (experts_ || !manifest_pending_) return Status::Ok();
    manifest_pending_ = false;
    // A private copy of the frame: the provider reads it after this handler returns.
    PW_ASSIGN_OR_RETURN(auto copy, CopyFrame(m));
    if (paged_) return OnManifest(std::move(copy));  // serving already: rebind now
    manifest_ = std::move(copy);
    return Status::Ok();
  }
  if (m.which() == proto::Body::PLAN) OnPlan(m.body().getPlan());
  return Status::Ok();
}

void DecodeWeights::OnPlan(wire::Plan::Reader plan) {
  if (!paged_) {
    PW_LOG(DEBUG) << options_.worker_id << ": plan epoch " << plan.getEpoch() << " ignored (bf16 experts)";
    return;
  }
  if (plan.getEpoch() < plan_epoch_) return;  // an older plan arriving late
  auto changes = paged_->PlanChanges(plan);
  Status st = !changes.ok()  ? changes.status()
              : residency_ ? residency_->SetPlanWidths(*changes)
                           : paged_->SetDesired(*changes);
  if (!st.ok()) {
    PW_LOG(WARNING) << options_.worker_id << ": plan epoch " << plan.getEpoch() << " refused: " << st.ToString();
    proto::OutMessage m;
    auto ack = m.body().initPlanAck();
    ack.setEpoch(plan.getEpoch());
    ack.setReason(st.message());
    auto refused = ack.initRefused(plan.getChanges().size());
    for (unsigned i = 0; i < plan.getChanges().size(); ++i) refused.setWithCaveats(i, plan.getChanges()[i]);
    (void)broker_->Send(m);
    return;
  }
  plan_epoch_ = plan.getEpoch();
  metrics_->plans_applied->Increment();
  if (paged_->pending() == 0) SendPlanAck({});
}

void DecodeWeights::SendPlanAck(const std::vector<WidthChange>& committed) {
  if (!broker_ || !broker_->registered()) return;
  proto::OutMessage m;
  auto ack = m.body().initPlanAck();
  ack.setEpoch(plan_epoch_);
  ack.setComplete(paged_->pending() == 0 && paged_->in_flight() == 0);
  auto list = ack.initCommitted(static_cast<unsigned>(committed.size()));
  const auto& t = paged_->table();
  for (size_t k = 0; k < committed.size(); ++k) {
    const size_t i = committed[k].block;
    FillWeightEntry(list[static_cast<unsigned>(k)], i, t.num_experts(), committed[k].to, t.entry(i).desired);
  }
  Status st = broker_->Send(m);
  if (!st.ok()) PW_LOG(WARNING) << options_.worker_id << ": PlanAck: " << st.ToString();
}

void DecodeWeights::SendFullAck() {
  // Every block's committed width, so the broker's mirror is whole whatever it saw before.
  std::vector<WidthChange> all;
  const auto& t = paged_->table();
  for (int i = 0; i < t.num_blocks(); ++i) {
    all.push_back({static_cast<size_t>(i), 0, t.entry(static_cast<size_t>(i)).committed});
  }
  SendPlanAck(all);
}

void DecodeWeights::Boundary(int kv_reserve_pages) {
  if (!paged_) return;
  std::vector<WidthChange> committed =
      residency_ ? residency_->Boundary(kv_reserve_pages) : paged_->Poll(kv_reserve_pages);
  if (!committed.empty()) SendPlanAck(committed);
}

void DecodeWeights::ExportMetrics() {
  metrics_->Export(*pool_, paged_.get());
  if (residency_metrics_) residency_metrics_->Export(*residency_);
}

void DecodeWeights::BeginStep() {
  if (paged_) paged_->BeginStep();
}

void DecodeWeights::EndStep() {
  if (paged_) paged_->EndStep();
}

void DecodeWeights::FillWeightTable(wire::Register::Builder r) const {
  if (paged_) {
    const auto& t = paged_->table();
    auto wt = r.initWeightTable(static_cast<unsigned>(t.num_blocks()));
    for (int i = 0; i < t.num_blocks(); ++i) {
      const auto& entry = t.entry(static_cast<size_t>(i));
      // With a budget the table's desired 0 means "not resident"; the broker's width for the
      // block is the plan width (what a restarted broker adopts).
      const int desired = residency_ ? residency_->PlanBits(static_cast<size_t>(i)) : entry.desired;
      FillWeightEntry(wt[static_cast<unsigned>(i)], static_cast<size_t>(i), t.num_experts(),
                      entry.committed, desired);
    }
    if (residency_) r.setResidencyCapacity(static_cast<uint32_t>(residency_->capacity()));
  } else if (experts_) {
    const auto& regions = experts_->layout().regions;
    auto wt = r.initWeightTable(static_cast<unsigned>(regions.size()));
    for (size_t i = 0; i < regions.size(); ++i) {
      auto e = wt[static_cast<unsigned>(i)];
      e.setLayer(static_cast<uint32_t>(regions[i].layer));
      e.setExpert(static_cast<uint32_t>(regions[i].expert));
      e.setKind(proto::ToWire(regions[i].proj));
      e.setCommittedBits(16);
      e.setDesiredBits(16);
    }
  }
}

void DecodeWeights::FillTelemetry(wire::Telemetry::Builder t) const {
  if (!paged_) return;
  t.setPlanEpoch(paged_->pending() == 0 ? plan_epoch_ : 0);
  t.setChangesPending(static_cast<uint32_t>(paged_->pending()));
  if (residency_) t.setResidencyCapacity(static_cast<uint32_t>(residency_->capacity()));
}

}  // namespace pw::workers
