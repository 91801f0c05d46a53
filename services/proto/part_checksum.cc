#include "services/proto/part_checksum.h"

#include "services/proto/codec.h"

namespace pw::proto {

std::string PartChecksumName(wire::ChecksumKind kind) {
  switch (kind) {
    case wire::ChecksumKind::CRC32C:
      return "CRC-32C";
    case wire::ChecksumKind::FNV1A64:
      return "FNV-1a 64";
  }
  return "unknown checksum kind " + std::to_string(static_cast<unsigned>(kind));
}

Status CheckPartChecksumKind(wire::ChecksumKind kind) {
  if (kind == wire::ChecksumKind::CRC32C || kind == wire::ChecksumKind::FNV1A64)
    return Status::Ok();
  return Unsupported(
      "weight manifest: " + PartChecksumName(kind) +
      " (a newer broker?); this worker verifies CRC-32C and FNV-1a 64 (control protocol " +
      std::to_string(kProtocolMajor) + "." + std::to_string(kProtocolMinor) + ")");
}

Status CheckPeerReadsPartChecksums(uint16_t peer_minor) {
  if (peer_minor >= kPartChecksumSinceMinor) return Status::Ok();
  return Unsupported(
      "this broker speaks control protocol " + std::to_string(kProtocolMajor) + "." +
      std::to_string(kProtocolMinor) + " and checksums expert parts with " +
      PartChecksumName(kPartChecksumKind) + "; the worker speaks " +
      std::to_string(kProtocolMajor) + "." + std::to_string(peer_minor) +
      ", which verifies FNV-1a 64 only: run the broker and its workers from one build");
}

}  // namespace pw::proto
