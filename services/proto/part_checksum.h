// PartChecksum: the checksum of an expert region or part in the broker's store, as the weight
// manifest's `checksumKind` defines it (cluster.capnp). A worker verifies every byte range it
// fetches against it on arrival.
//
// Versions: a broker of control protocol 1.1 or later writes CRC-32C (common/hash.h Crc32c, at
// memory speed with SSE4.2); a broker of 1.0 wrote FNV-1a 64 and did not set the field, whose
// default (fnv1a64) says exactly that, so a worker of this build still verifies an old
// broker's manifest (slowly: FNV-1a reads a byte at a time). The other way round a worker of
// 1.0 would compute FNV-1a over CRC-32C values and call every fetch corrupt, so a broker of
// this build refuses the manifest to a peer older than 1.1, naming both versions
// (CheckPeerReadsPartChecksums). A kind this build does not know (a newer broker) is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/hash.h"
#include "common/status.h"
#include "services/proto/cluster.capnp.h"

namespace pw::proto {

// The kind a broker of this build writes, and the protocol minor version that introduced it.
inline constexpr wire::ChecksumKind kPartChecksumKind = wire::ChecksumKind::CRC32C;
inline constexpr uint16_t kPartChecksumSinceMinor = 1;

// Incremental: Update over the part's byte ranges in order, then digest(). The kind must be
// one CheckPartChecksumKind accepts.
class PartChecksum {
 public:
  explicit PartChecksum(wire::ChecksumKind kind) : kind_(kind) {}
  void Update(const void* data, size_t n) {
    if (kind_ == wire::ChecksumKind::CRC32C) {
      crc_ = Crc32c(data, n, crc_);
    } else {
      fnv_.Update(data, n);
    }
  }
  uint64_t digest() const { return kind_ == wire::ChecksumKind::CRC32C ? crc_ : fnv_.digest(); }

 private:
  wire::ChecksumKind kind_;
  uint32_t crc_ = 0;
  Fnv1a64 fnv_;
};

inline uint64_t PartChecksumOf(wire::ChecksumKind kind, const void* data, size_t n) {
  PartChecksum c(kind);
  c.Update(data, n);
  return c.digest();
}

// "CRC-32C", "FNV-1a 64", or "unknown checksum kind N".
std::string PartChecksumName(wire::ChecksumKind kind);
// Ok for a kind this build verifies; Unsupported, naming the kind, otherwise.
Status CheckPartChecksumKind(wire::ChecksumKind kind);
// Broker side: Ok when a peer speaking protocol 1.`peer_minor` verifies this build's checksums;
// Unsupported with both versions named otherwise.
Status CheckPeerReadsPartChecksums(uint16_t peer_minor);

}  // namespace pw::proto
