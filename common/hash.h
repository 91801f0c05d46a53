// The project's hashes: FNV-1a 64-bit (model hashes, region checksums, name seeds) and
// CRC-32 (store sections, trace records). One implementation each.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pw {

// FNV-1a 64-bit, incremental: Update over any number of byte ranges, then digest().
class Fnv1a64 {
 public:
  void Update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint64_t h = h_;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    h_ = h;
  }
  uint64_t digest() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

// FNV-1a 64-bit of one byte range.
inline uint64_t Fnv1a64Of(const void* data, size_t n) {
  Fnv1a64 h;
  h.Update(data, n);
  return h.digest();
}

// CRC-32 (IEEE 802.3 polynomial, reflected, as zlib's crc32); `crc` chains calls (start at 0).
uint32_t Crc32(const void* data, size_t n, uint32_t crc = 0);

}  // namespace pw
