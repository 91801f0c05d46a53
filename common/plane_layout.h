// The bit-plane layout of an any-precision block, shared by the .apw store (common/formats/apw_store.h)
// and the kernels that read it (kernels/anyprec/anyprec.h, which describes it in full):
// every weight has an 8-bit parent code whose b-bit code (b in 3..8) is its top b bits; codes
// are stored as 8 bit-planes, plane 0 = most significant bit, row-major; inside a row, columns
// are packed in groups of 256 (32 bytes of a plane): column c at byte (c / 256) * 32 + c % 32,
// bit (c % 256) / 32.
#pragma once

#include <cstddef>

namespace pw::anyprec {

inline constexpr int kMinBits = 3;
inline constexpr int kMaxBits = 8;
inline constexpr int kNumPlanes = 8;
inline constexpr int kGroupCols = 256;  // columns per packing group
inline constexpr int kGroupBytes = 32;  // bytes per packing group in one plane row

// Bytes of one row of one plane: ceil(cols / 256) * 32.
constexpr size_t PlaneRowBytes(int cols) {
  return static_cast<size_t>((cols + kGroupCols - 1) / kGroupCols) * kGroupBytes;
}
// Where column c of a row sits inside that row of a plane: byte offset and bit index (0 = LSB).
struct BitPosition {
  size_t byte;
  int bit;
};
constexpr BitPosition PlaneBitPosition(int c) {
  return {static_cast<size_t>(c / kGroupCols) * kGroupBytes + static_cast<size_t>(c % 32),
          (c % kGroupCols) / 32};
}
// Number of entries of LUT_b for one row.
constexpr int LutEntries(int bits) { return 1 << bits; }

}  // namespace pw::anyprec
