// ServedStore: an .apw store (common/formats/apw_store.h) as the broker serves it to decode workers.
//
// The file is memory-mapped once and registered with UCX as it is (no copy): workers get any
// bit-plane or LUT of any block with one-sided gets. Opening validates the store (header,
// block table, every block's CRC), refuses a store made for another model (model hash), and
// computes one checksum per part (plane or LUT; CRC-32C, services/proto/part_checksum.h), which
// the manifest carries so a worker verifies every part it fetches on arrival.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/apw_store.h"
#include "common/status.h"
#include "services/proto/codec.h"
#include "services/transport/ucx.h"

namespace pw::broker {

class ServedStore {
 public:
  // `model_hash`: the hash the store must have been made for (common/formats/checkpoint_experts.h ModelHash).
  static Result<std::unique_ptr<ServedStore>> Open(const std::string& path, uint64_t model_hash,
                                                   transport::ucx::Context& ucx);
  ~ServedStore();

  const apw::ApwStore& store() const { return *store_; }
  uint64_t bytes() const { return store_->map_bytes(); }
  size_t num_parts() const { return parts_.size(); }
  // Fills an OK manifest: the UCX coordinates of the mapping and every part.
  void FillManifest(wire::WeightManifest::Builder m, const std::string& worker_address,
                    int initial_bits) const;

 private:
  struct Part {
    uint32_t layer, expert;
    apw::BlockKind kind;
    int8_t plane;
    uint8_t lut_bits;
    uint64_t offset, bytes, checksum;
  };
  ServedStore() = default;
  std::unique_ptr<apw::ApwStore> store_;
  std::unique_ptr<transport::ucx::MemoryRegion> region_;
  std::vector<Part> parts_;
};

}  // namespace pw::broker
