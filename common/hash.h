// The project's hashes: FNV-1a 64-bit (model hashes, name seeds), CRC-32 (store sections,
// trace records) and CRC-32C (expert parts fetched from the broker). One implementation each;
// the CRCs have a scalar reference and a hardware path (PCLMULQDQ, SSE4.2), chosen at run time.
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
// By carry-less multiplication where the CPU has PCLMULQDQ (every x86-64 CPU this project
// runs on), else by tables.
uint32_t Crc32(const void* data, size_t n, uint32_t crc = 0);
// The two backends behind Crc32, for tests and benchmarks: slicing-by-8 tables (any CPU;
// defines correct), and 16-byte blocks folded by PCLMULQDQ, four chains at a time.
uint32_t Crc32Scalar(const void* data, size_t n, uint32_t crc = 0);
uint32_t Crc32Clmul(const void* data, size_t n, uint32_t crc = 0);  // needs PCLMULQDQ, SSE4.1
bool Crc32ClmulAvailable();

// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected; iSCSI, ext4, SSE4.2's crc32), at
// memory speed where the CPU has SSE4.2: `crc` chains calls (start at 0), so a part hashed page
// by page equals the part hashed at once. Check value: Crc32c("123456789", 9) == 0xE3069283.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
// The two backends behind Crc32c, for tests and benchmarks: the table-driven scalar one (any
// CPU; defines correct), and the SSE4.2 one (three interleaved instruction streams, combined
// by polynomial arithmetic) that Crc32c uses when Crc32cHardwareAvailable().
uint32_t Crc32cScalar(const void* data, size_t n, uint32_t crc = 0);
uint32_t Crc32cHardware(const void* data, size_t n, uint32_t crc = 0);  // needs SSE4.2
bool Crc32cHardwareAvailable();

}  // namespace pw
