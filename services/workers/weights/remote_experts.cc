#include "services/workers/weights/remote_experts.h"

#include <string>

#include "engine/experts/bf16_experts.h"
#include "engine/experts/expert_workspace.h"
#include "services/proto/part_checksum.h"
#include "services/proto/weight_kind.h"

namespace pw::workers {

namespace {
std::string BlockName(int layer, int expert, ExpertProj proj) {
  return "layer " + std::to_string(layer) + " expert " + std::to_string(expert) + " " +
         ExpertProjName(proj);
}
}  // namespace

Result<std::unique_ptr<RemoteExpertProvider>> RemoteExpertProvider::Load(
    transport::ucx::Worker& worker, wire::WeightManifest::Reader manifest,
    const ModelConfig& config, engine::Bf16ExpertForm form) {
  std::unique_ptr<RemoteExpertProvider> p(new RemoteExpertProvider());
  p->layout_ = service::ExpertStoreLayout::For(config);
  const service::ExpertStoreLayout& layout = p->layout_;
  if (!manifest.getOk()) {
    return Unavailable("broker refused the weight manifest: " +
                       proto::ToString(manifest.getError()));
  }
  PW_RETURN_IF_ERROR(proto::CheckPartChecksumKind(manifest.getChecksumKind()));
  const wire::ChecksumKind checksum_kind = manifest.getChecksumKind();
  auto mem = manifest.getMemory();
  auto regions = manifest.getRegions();
  if (regions.size() != layout.regions.size()) {
    return Corrupt("weight manifest lists " + std::to_string(regions.size()) +
                   " expert blocks, the model has " + std::to_string(layout.regions.size()));
  }
  struct Fetch {
    size_t local;
    uint64_t remote_offset;
    uint64_t checksum;
  };
  std::vector<Fetch> fetches;
  std::vector<uint8_t> seen(layout.regions.size(), 0);
  for (auto r : regions) {
    const int layer = static_cast<int>(r.getLayer()), expert = static_cast<int>(r.getExpert());
    const ExpertProj proj = proto::FromWire(r.getKind());
    if (r.getLayer() > (1u << 20) || r.getExpert() > (1u << 20)) {
      return Corrupt("weight manifest: block index out of range");
    }
    const int64_t idx = layout.Find(layer, expert, proj);
    const std::string name = BlockName(layer, expert, proj);
    if (idx < 0) return Corrupt("weight manifest: " + name + " is not an expert block here");
    if (seen[static_cast<size_t>(idx)]) return Corrupt("weight manifest: " + name + " twice");
    seen[static_cast<size_t>(idx)] = 1;
    const service::ExpertRegion& local = layout.regions[static_cast<size_t>(idx)];
    if (r.getBits() != 16) {
      return Unsupported("weight manifest: " + name + " has " + std::to_string(r.getBits()) +
                         " bits; this worker runs bf16 (16) blocks");
    }
    if (r.getBytes() != local.bytes) {
      return Corrupt("weight manifest: " + name + " is " + std::to_string(r.getBytes()) +
                     " bytes, expected " + std::to_string(local.bytes));
    }
    if (r.getOffset() > mem.getBytes() || r.getBytes() > mem.getBytes() - r.getOffset()) {
      return Corrupt("weight manifest: " + name + " lies outside the broker's region");
    }
    fetches.push_back({static_cast<size_t>(idx), r.getOffset(), r.getChecksum()});
  }
  auto ep = transport::ucx::Endpoint::Connect(worker, proto::ToBytes(mem.getWorkerAddress()));
  if (!ep.ok()) return ep.status().WithContext("connecting to the broker's UCX worker");
  auto remote = (*ep)->OpenRegion(proto::ToBytes(mem.getRkey()), mem.getBaseAddr(), mem.getBytes());
  if (!remote.ok()) return remote.status().WithContext("broker expert store");
  p->data_.reset(new uint16_t[layout.total_bytes / 2 + 32]);
  auto* base = reinterpret_cast<uint8_t*>(p->data_.get());
  for (const Fetch& f : fetches) {
    const service::ExpertRegion& local = layout.regions[f.local];
    const std::string name = BlockName(local.layer, local.expert, local.proj);
    PW_RETURN_IF_ERROR((*remote)->Get(f.remote_offset, base + local.offset, local.bytes)
                           .WithContext("getting " + name + " from the broker"));
    if (proto::PartChecksumOf(checksum_kind, base + local.offset, local.bytes) != f.checksum) {
      return Corrupt("expert " + name + " from the broker fails its checksum");
    }
  }
  if (engine::PackBf16Experts(form)) PW_RETURN_IF_ERROR(p->Pack());
  return p;
}

Status RemoteExpertProvider::Pack() {
  const auto* base = reinterpret_cast<const uint8_t*>(data_.get());
  for (const service::ExpertRegion& r : layout_.regions) {
    first_.push_back(packed_.size());
    const auto* w = reinterpret_cast<const uint16_t*>(base + r.offset);
    const auto rows = static_cast<size_t>(r.rows), cols = static_cast<size_t>(r.cols);
    if (r.proj == ExpertProj::kGateUp) {
      packed_.push_back(cpu::PackBf16(w, rows / 2, cols));
      packed_.push_back(cpu::PackBf16(w + rows / 2 * cols, rows / 2, cols));
    } else {
      packed_.push_back(cpu::PackBf16(w, rows, cols));
    }
  }
  if (bytes_held() >= layout_.total_bytes) {  // narrow rows (chunks of 64 columns) or values of many binades
    packed_.clear();
    first_.clear();
    return Status::Ok();
  }
  data_.reset();
  return Status::Ok();
}

uint64_t RemoteExpertProvider::bytes_held() const {
  if (packed_.empty()) return layout_.total_bytes;
  uint64_t n = 0;
  for (const cpu::PackedBf16Matrix& m : packed_) n += m.Bytes();
  return n;
}

Status RemoteExpertProvider::RunExperts(const engine::ExpertLayerCall& call) {
  // The checkpoint provider's layer runner over the fetched copies, so tokens match.
  auto* experts = call.workspace->Array<engine::Bf16Expert>(engine::ExpertWorkspace::kRunnerSlots,
                                                            call.groups.size());
  const auto* base = reinterpret_cast<const uint8_t*>(data_.get());
  for (size_t g = 0; g < call.groups.size(); ++g) {
    const int expert = call.groups[g].expert;
    const int64_t gu = layout_.Find(call.layer, expert, ExpertProj::kGateUp),
                  dn = layout_.Find(call.layer, expert, ExpertProj::kDown);
    if (gu < 0 || dn < 0) {
      return InvalidArgument("broker experts: no " + BlockName(call.layer, expert, gu < 0 ? ExpertProj::kGateUp : ExpertProj::kDown));
    }
    if (!packed_.empty()) {
      experts[g] = {};
      experts[g].gate_packed = &packed_[first_[static_cast<size_t>(gu)]];
      experts[g].up_packed = &packed_[first_[static_cast<size_t>(gu)] + 1];
      experts[g].down_packed = &packed_[first_[static_cast<size_t>(dn)]];
      continue;
    }
    const service::ExpertRegion& a = layout_.regions[static_cast<size_t>(gu)];
    const service::ExpertRegion& b = layout_.regions[static_cast<size_t>(dn)];
    const auto* w = reinterpret_cast<const uint16_t*>(base + a.offset);
    experts[g] = {w, w + (a.rows / 2) * a.cols, reinterpret_cast<const uint16_t*>(base + b.offset)};
  }
  return engine::RunBf16Experts(call, experts, cpu::Kernels());
}

}  // namespace pw::workers
