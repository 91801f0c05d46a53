#include "services/broker/served_store.h"

#include "services/proto/part_checksum.h"
#include "services/proto/weight_kind.h"
#include "kernels/anyprec/pack.h"

namespace pw::broker {

ServedStore::~ServedStore() { region_.reset(); }

Result<std::unique_ptr<ServedStore>> ServedStore::Open(const std::string& path, uint64_t model_hash,
                                                       transport::ucx::Context& ucx) {
  apw::ApwStore::Options o;
  o.verify_data = true;
  o.expected_model_hash = model_hash;
  auto store = apw::ApwStore::Open(path, o);
  if (!store.ok()) return store.status().WithContext("broker: store " + path);
  std::unique_ptr<ServedStore> s(new ServedStore());
  s->store_ = std::move(store).value();
  const uint8_t* base = s->store_->map_data();
  for (int i = 0; i < s->store_->num_blocks(); ++i) {
    const apw::BlockData& b = s->store_->block(i);
    const int rows = static_cast<int>(b.rows), cols = static_cast<int>(b.cols);
    for (int p = 0; p < apw::kPlanes; ++p) {
      const uint64_t n = anyprec::PlaneBytes(rows, cols);
      s->parts_.push_back({b.layer, b.expert, b.kind, static_cast<int8_t>(p), 0,
                           static_cast<uint64_t>(b.planes[p] - base), n,
                           proto::PartChecksumOf(proto::kPartChecksumKind, b.planes[p], n)});
    }
    for (int bits = apw::kMinBits; bits <= apw::kMaxBits; ++bits) {
      const uint64_t n = (static_cast<uint64_t>(rows) << bits) * sizeof(uint16_t);
      const auto* lut = reinterpret_cast<const uint8_t*>(b.luts[bits]);
      s->parts_.push_back({b.layer, b.expert, b.kind, -1, static_cast<uint8_t>(bits),
                           static_cast<uint64_t>(lut - base), n,
                           proto::PartChecksumOf(proto::kPartChecksumKind, lut, n)});
    }
  }
  // UCX registers the read-only mapping for remote reads.
  auto region = transport::ucx::MemoryRegion::Register(
      ucx, const_cast<uint8_t*>(s->store_->map_data()), s->store_->map_bytes());
  if (!region.ok()) return region.status().WithContext("broker: registering store " + path);
  s->region_ = std::move(region).value();
  return s;
}

void ServedStore::FillManifest(wire::WeightManifest::Builder m, const std::string& worker_address,
                               int initial_bits) const {
  m.setOk(true);
  m.setAnyPrecision(true);
  m.setModelHash(store_->info().model_hash);
  m.setStoreHash(store_->info().model_hash);
  m.setInitialBits(static_cast<uint8_t>(initial_bits));
  m.setChecksumKind(proto::kPartChecksumKind);
  auto mem = m.initMemory();
  mem.setWorkerAddress(proto::AsData(worker_address));
  mem.setRkey(proto::AsData(region_->PackedRkey()));
  mem.setBaseAddr(region_->base());
  mem.setBytes(region_->size());
  auto list = m.initParts(static_cast<unsigned>(parts_.size()));
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Part& p = parts_[i];
    auto w = list[static_cast<unsigned>(i)];
    w.setLayer(p.layer);
    w.setExpert(p.expert);
    w.setKind(proto::ToWire(p.kind));
    w.setPlane(p.plane);
    w.setLutBits(p.lut_bits);
    w.setOffset(p.offset);
    w.setBytes(p.bytes);
    w.setChecksum(p.checksum);
  }
}

}  // namespace pw::broker
