#include "kernels/anyprec/pack.h"

#include <algorithm>
#include <cstring>

namespace pw::anyprec {

void PackCodes(const uint8_t* codes, int rows, int cols, uint8_t* planes) {
  const size_t plane_bytes = PlaneBytes(rows, cols);
  const size_t row_bytes = PlaneRowBytes(cols);
  std::memset(planes, 0, kNumPlanes * plane_bytes);
  for (int r = 0; r < rows; ++r) {
    const uint8_t* src = codes + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) {
      const BitPosition pos = PlaneBitPosition(c);
      const uint8_t code = src[c];
      for (int p = 0; p < kNumPlanes; ++p) {
        if ((code >> (kNumPlanes - 1 - p)) & 1) {
          planes[p * plane_bytes + r * row_bytes + pos.byte] |= static_cast<uint8_t>(1u << pos.bit);
        }
      }
    }
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
