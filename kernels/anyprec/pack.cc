#include "kernels/anyprec/pack.h"

#include <algorithm>
#include <cstring>

namespace pw::anyprec {

void PackCodeRow(const uint8_t* codes, int cols, uint8_t* row0, size_t plane_stride) {
  // Byte j of a 256-column group holds columns j + 32k, k = 0..7, at bit k (PlaneBitPosition).
  // The eight codes of a byte go into one 64-bit word (code k in byte k); bit b of each is then
  // gathered into one byte by a multiply (the partial products land in distinct bits, no carry).
  constexpr uint64_t kLowBits = 0x0101010101010101ull, kGather = 0x0102040810204080ull;
  const int groups = static_cast<int>(PlaneRowBytes(cols) / 32);
  for (int g = 0; g < groups; ++g) {
    const int base = g * kGroupCols;
    for (int j = 0; j < 32; ++j) {
      uint64_t x = 0;
      for (int k = 0; k < 8; ++k) {
        const int c = base + 32 * k + j;
        if (c < cols) x |= static_cast<uint64_t>(codes[c]) << (8 * k);
      }
      const size_t at = static_cast<size_t>(g) * 32 + j;
      for (int p = 0; p < kNumPlanes; ++p) {
        const int bit = kNumPlanes - 1 - p;
        row0[p * plane_stride + at] = static_cast<uint8_t>((((x >> bit) & kLowBits) * kGather) >> 56);
      }
    }
  }
}

void PackCodes(const uint8_t* codes, int rows, int cols, uint8_t* planes) {
  const size_t plane_bytes = PlaneBytes(rows, cols);
  const size_t row_bytes = PlaneRowBytes(cols);
  for (int r = 0; r < rows; ++r) {
    PackCodeRow(codes + static_cast<size_t>(r) * cols, cols, planes + r * row_bytes, plane_bytes);
  }
}

uint8_t UnpackCode(const uint8_t* planes, int rows, int cols, int r, int c) {
  const size_t plane_bytes = PlaneBytes(rows, cols);
  const BitPosition pos = PlaneBitPosition(c);
  int code = 0;
  for (int p = 0; p < kNumPlanes; ++p) {
    const uint8_t byte = planes[p * plane_bytes + static_cast<size_t>(r) * PlaneRowBytes(cols) + pos.byte];
    code = (code << 1) | ((byte >> pos.bit) & 1);
  }
  return static_cast<uint8_t>(code);
}

PageLists::PageLists(const uint8_t* const plane_base[kNumPlanes],
                     const uint16_t* const luts[kMaxBits + 1], int rows, int cols, int tile_rows) {
  view_.rows = rows;
  view_.cols = cols;
  view_.tile_rows = tile_rows;
  const int num_pages = view_.NumPages();
  pages_.assign(static_cast<size_t>(kNumPlanes) * num_pages, nullptr);
  const size_t page_bytes = static_cast<size_t>(tile_rows) * PlaneRowBytes(cols);
  for (int p = 0; p < kNumPlanes; ++p) {
    if (plane_base[p] == nullptr) continue;
    for (int i = 0; i < num_pages; ++i) pages_[p * num_pages + i] = plane_base[p] + i * page_bytes;
    view_.planes[p] = pages_.data() + p * num_pages;
  }
  for (int b = 0; b <= kMaxBits; ++b) view_.luts[b] = luts[b];
}

PageLists PackedBlock::Pages(int tile_rows) const {
  const uint8_t* bases[kNumPlanes];
  for (int p = 0; p < kNumPlanes; ++p) bases[p] = Plane(p);
  const uint16_t* lut_ptrs[kMaxBits + 1] = {};
  for (int b = kMinBits; b <= kMaxBits; ++b) {
    if (!luts[b].empty()) lut_ptrs[b] = luts[b].data();
  }
  return PageLists(bases, lut_ptrs, rows, cols, tile_rows);
}

}  // namespace pw::anyprec
