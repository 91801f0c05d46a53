// Packing 8-bit parent codes into bit-planes, and building BlockViews over packed planes.
// Used by the quantizer, the .apw store, tests and benchmarks (not by the kernels themselves).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/anyprec/anyprec.h"

namespace pw::anyprec {

// Bytes of one whole plane of a rows x cols block.
inline size_t PlaneBytes(int rows, int cols) {
  return static_cast<size_t>(rows) * PlaneRowBytes(cols);
}

// codes: [rows][cols] parent codes. planes: kNumPlanes * PlaneBytes(rows, cols) bytes, plane p
// at offset p * PlaneBytes(rows, cols); fully overwritten (padding bits zero).
void PackCodes(const uint8_t* codes, int rows, int cols, uint8_t* planes);
// One row of that: codes[cols] into the PlaneRowBytes(cols) bytes at row0 + p * plane_stride
// of every plane p (fully overwritten, padding bits zero). Rows are independent, so the
// quantizer packs each row on the thread that fitted it.
void PackCodeRow(const uint8_t* codes, int cols, uint8_t* row0, size_t plane_stride);
// The parent code of (r, c) from planes laid out as PackCodes writes them.
uint8_t UnpackCode(const uint8_t* planes, int rows, int cols, int r, int c);

// Page-pointer tables for planes that lie contiguously (plane p starting at plane_base[p]),
// split into pages of tile_rows rows. Owns the pointer arrays; the view it returns borrows
// them (and the planes/LUTs), so the PageLists must outlive the view.
class PageLists {
 public:
  // plane_base[p] may be null for planes the caller will not use. luts[b] as in BlockView.
  PageLists(const uint8_t* const plane_base[kNumPlanes], const uint16_t* const luts[kMaxBits + 1],
            int rows, int cols, int tile_rows);
  PageLists(const PageLists&) = delete;
  PageLists& operator=(const PageLists&) = delete;
  const BlockView& view() const { return view_; }

 private:
  std::vector<const uint8_t*> pages_;  // [kNumPlanes][num_pages]
  BlockView view_;
};

// An owned block in memory: planes contiguous, LUTs for widths 3..8. For tests, benchmarks
// and the quantizer's output before it is written to a store.
struct PackedBlock {
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> planes;              // kNumPlanes * PlaneBytes(rows, cols)
  std::vector<uint16_t> luts[kMaxBits + 1];  // luts[b]: [rows][2^b] fp16, b in 3..8

  const uint8_t* Plane(int p) const { return planes.data() + p * PlaneBytes(rows, cols); }
  // Page lists with `tile_rows` rows per page over this block's memory.
  PageLists Pages(int tile_rows) const;
};

}  // namespace pw::anyprec
