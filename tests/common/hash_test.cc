// CRC-32C: the scalar backend against a bit-at-a-time oracle, the hardware backend against the
// scalar one on awkward lengths and alignments (around the three-lane block of 3 x 16 KiB),
// chaining, and that a flipped byte anywhere changes the checksum. FNV-1a and CRC-32 check
// values pin the other two hashes.
#include "common/hash.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace pw {
namespace {

// CRC-32C one bit at a time, straight from the definition (reflected 0x1EDC6F41).
uint32_t OracleCrc32c(const uint8_t* p, size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(Hash, CheckValues) {
  const char* s = "123456789";
  EXPECT_EQ(Crc32(s, 9), 0xCBF43926u);
  EXPECT_EQ(Crc32cScalar(s, 9), 0xE3069283u);
  EXPECT_EQ(Crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(Crc32c(s + 4, 5, Crc32c(s, 4)), 0xE3069283u);
  EXPECT_EQ(Crc32c(s, 0), 0u);
  EXPECT_EQ(Fnv1a64Of("a", 1), 0xaf63dc4c8601ec8cull);
  if (Crc32cHardwareAvailable()) {
    EXPECT_EQ(Crc32cHardware(s, 9), 0xE3069283u);
  }
}

TEST(Hash, ScalarCrc32cMatchesTheOracle) {
  const auto buf = RandomBytes(4096 + 8, 7);
  for (size_t off = 0; off < 8; ++off) {
    for (size_t n : {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 255, 1000, 4096}) {
      SCOPED_TRACE("offset " + std::to_string(off) + " length " + std::to_string(n));
      EXPECT_EQ(Crc32cScalar(buf.data() + off, n), OracleCrc32c(buf.data() + off, n));
      EXPECT_EQ(Crc32cScalar(buf.data() + off, n, 0x12345678u),
                OracleCrc32c(buf.data() + off, n, 0x12345678u));
    }
  }
}

// The PCLMULQDQ CRC-32 against the tables: every length around its 64- and 16-byte blocks, every
// alignment, a chained start, and a buffer of many folds; a flipped byte anywhere changes it.
TEST(Hash, ClmulCrc32MatchesScalar) {
  if (!Crc32ClmulAvailable()) GTEST_SKIP() << "this CPU has no PCLMULQDQ";
  const char* s = "123456789";
  EXPECT_EQ(Crc32Clmul(s, 9), 0xCBF43926u);
  EXPECT_EQ(Crc32Scalar(s, 9), 0xCBF43926u);
  const auto buf = RandomBytes(1 << 20, 11);
  for (size_t off = 0; off < 16; off += 3) {
    for (size_t n = 0; n <= 300; ++n) {
      ASSERT_EQ(Crc32Clmul(buf.data() + off, n), Crc32Scalar(buf.data() + off, n)) << off << " " << n;
      ASSERT_EQ(Crc32Clmul(buf.data() + off, n, 0xdeadbeefu), Crc32Scalar(buf.data() + off, n, 0xdeadbeefu))
          << off << " " << n;
    }
  }
  EXPECT_EQ(Crc32Clmul(buf.data(), buf.size()), Crc32Scalar(buf.data(), buf.size()));
  EXPECT_EQ(Crc32Clmul(buf.data() + 1000, 777, Crc32Clmul(buf.data(), 1000)), Crc32Scalar(buf.data(), 1777));
  std::vector<uint8_t> flipped(buf.begin(), buf.begin() + 4096);
  const uint32_t whole = Crc32Clmul(flipped.data(), flipped.size());
  for (size_t i = 0; i < flipped.size(); i += 97) {
    flipped[i] ^= 0x40;
    EXPECT_NE(Crc32Clmul(flipped.data(), flipped.size()), whole) << i;
    flipped[i] ^= 0x40;
  }
}

TEST(Hash, HardwareCrc32cMatchesScalar) {
  if (!Crc32cHardwareAvailable()) GTEST_SKIP() << "this CPU has no SSE4.2";
  constexpr size_t kBlock = 3 * 16384;  // the hardware path's three lanes
  const auto buf = RandomBytes(3 * kBlock + 64, 11);
  const std::vector<size_t> lengths = {0,
                                       1,
                                       7,
                                       8,
                                       9,
                                       31,
                                       4095,
                                       16384,
                                       kBlock - 1,
                                       kBlock,
                                       kBlock + 1,
                                       kBlock + 7,
                                       2 * kBlock - 8,
                                       2 * kBlock + 13,
                                       3 * kBlock + 3};
  for (size_t off = 0; off < 8; ++off) {
    for (size_t n : lengths) {
      SCOPED_TRACE("offset " + std::to_string(off) + " length " + std::to_string(n));
      EXPECT_EQ(Crc32cHardware(buf.data() + off, n), Crc32cScalar(buf.data() + off, n));
      EXPECT_EQ(Crc32cHardware(buf.data() + off, n, 0xdeadbeefu),
                Crc32cScalar(buf.data() + off, n, 0xdeadbeefu));
    }
  }
  // Random lengths and offsets, fixed seed.
  std::mt19937 rng(2026);
  for (int i = 0; i < 200; ++i) {
    const size_t off = rng() % 64, n = rng() % (buf.size() - 64);
    ASSERT_EQ(Crc32cHardware(buf.data() + off, n), Crc32cScalar(buf.data() + off, n))
        << "offset " << off << " length " << n << " (seed 2026, draw " << i << ")";
  }
}

TEST(Hash, Crc32cChainsOverPieces) {
  const auto buf = RandomBytes(200000, 3);
  const uint32_t whole = Crc32c(buf.data(), buf.size());
  EXPECT_EQ(whole, Crc32cScalar(buf.data(), buf.size()));
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    uint32_t crc = 0;
    size_t at = 0;
    while (at < buf.size()) {
      const size_t n = std::min(buf.size() - at, static_cast<size_t>(rng() % 70000));
      crc = Crc32c(buf.data() + at, n, crc);
      at += n;
    }
    EXPECT_EQ(crc, whole) << "trial " << trial;
  }
}

TEST(Hash, Crc32cSeesEveryFlippedByte) {
  auto buf = RandomBytes(3 * 3 * 16384 + 5, 9);
  const uint32_t clean = Crc32c(buf.data(), buf.size());
  for (size_t at : {size_t{0}, size_t{1}, size_t{16383}, size_t{16384}, size_t{40000},
                    size_t{3 * 16384 + 2}, buf.size() - 1}) {
    buf[at] ^= 0x01;
    EXPECT_NE(Crc32c(buf.data(), buf.size()), clean) << "byte " << at;
    EXPECT_NE(Crc32cScalar(buf.data(), buf.size()), clean) << "byte " << at;
    buf[at] ^= 0x01;
  }
  EXPECT_EQ(Crc32c(buf.data(), buf.size()), clean);
}

}  // namespace
}  // namespace pw
