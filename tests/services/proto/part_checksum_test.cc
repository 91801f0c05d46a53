// The expert-part checksum's versions (services/proto/part_checksum.h): this build writes
// CRC-32C; it reads FNV-1a 64 (protocol 1.0 brokers) and refuses an unknown kind; a broker
// refuses its manifest to a protocol 1.0 peer, naming both versions.
#include "services/proto/part_checksum.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/hash.h"
#include "services/proto/codec.h"

namespace pw::proto {
namespace {

TEST(PartChecksum, EachKindIsItsHashAndChainsOverPieces) {
  std::vector<uint8_t> bytes(100003);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + (i >> 8));
  EXPECT_EQ(kPartChecksumKind, wire::ChecksumKind::CRC32C);
  for (auto kind : {wire::ChecksumKind::CRC32C, wire::ChecksumKind::FNV1A64}) {
    const uint64_t whole = PartChecksumOf(kind, bytes.data(), bytes.size());
    EXPECT_EQ(whole, kind == wire::ChecksumKind::CRC32C
                         ? uint64_t{Crc32c(bytes.data(), bytes.size())}
                         : Fnv1a64Of(bytes.data(), bytes.size()));
    PartChecksum c(kind);
    c.Update(bytes.data(), 4097);
    c.Update(bytes.data() + 4097, bytes.size() - 4097);
    EXPECT_EQ(c.digest(), whole);
    bytes[5000] ^= 1;
    EXPECT_NE(PartChecksumOf(kind, bytes.data(), bytes.size()), whole);
    bytes[5000] ^= 1;
  }
}

TEST(PartChecksum, KindsAndPeerVersions) {
  EXPECT_TRUE(CheckPartChecksumKind(wire::ChecksumKind::CRC32C).ok());
  EXPECT_TRUE(CheckPartChecksumKind(wire::ChecksumKind::FNV1A64).ok());
  const Status unknown = CheckPartChecksumKind(static_cast<wire::ChecksumKind>(2));
  EXPECT_EQ(unknown.code(), StatusCode::kUnsupported);
  EXPECT_NE(unknown.message().find("unknown checksum kind 2"), std::string::npos)
      << unknown.ToString();

  EXPECT_GE(kProtocolMinor, kPartChecksumSinceMinor);
  EXPECT_TRUE(CheckPeerReadsPartChecksums(kProtocolMinor).ok());
  const Status old = CheckPeerReadsPartChecksums(0);
  EXPECT_EQ(old.code(), StatusCode::kUnsupported);
  const std::string ours = std::to_string(kProtocolMajor) + "." + std::to_string(kProtocolMinor);
  const std::string theirs = std::to_string(kProtocolMajor) + ".0";
  EXPECT_NE(old.message().find("protocol " + ours), std::string::npos) << old.ToString();
  EXPECT_NE(old.message().find("speaks " + theirs), std::string::npos) << old.ToString();
  EXPECT_NE(old.message().find("CRC-32C"), std::string::npos) << old.ToString();
}

}  // namespace
}  // namespace pw::proto
