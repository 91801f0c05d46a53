#include "kernels/cpu/packed_bf16.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/dense.h"

namespace pw::cpu {

PackedBf16View PackedBf16Matrix::view() const {
  PackedBf16View v;
  v.rows = rows_;
  v.cols = cols_;
  v.chunks = chunks_.data();
  v.tables = tables_.data();
  v.exc_begin = exc_begin_.data();
  v.exc_col = exc_col_.data();
  v.exc_bits = exc_bits_.data();
  return v;
}

size_t PackedBf16Matrix::Bytes() const {
  return chunks_.size() + tables_.size() + exc_begin_.size() * sizeof(uint32_t) +
         exc_col_.size() * sizeof(uint32_t) + exc_bits_.size() * sizeof(uint16_t);
}

namespace {

// The chunk slot (0..63) that holds column c of a chunk: ColumnOfSlot's inverse.
constexpr size_t SlotOfColumn(size_t c) {
  const size_t half = c / 32, j = c % 32;
  return 16 * (j / 8) + 8 * half + j % 8;
}
static_assert(SlotOfColumn(ColumnOfSlot(0)) == 0 && SlotOfColumn(ColumnOfSlot(13)) == 13 &&
              SlotOfColumn(ColumnOfSlot(40)) == 40 && SlotOfColumn(ColumnOfSlot(63)) == 63);

}  // namespace

PackedBf16Matrix PackBf16(const uint16_t* w, size_t rows, size_t cols) {
  PackedBf16Matrix m;
  m.rows_ = rows;
  m.cols_ = cols;
  const size_t chunks = (cols + kPackedChunkColumns - 1) / kPackedChunkColumns;
  m.chunks_.assign(rows * chunks * kPackedChunkBytes, 0);
  m.tables_.assign(rows * kPackedTableBytes, 0);
  m.exc_begin_.assign(rows + 1, 0);
  for (size_t r = 0; r < rows; ++r) {
    const uint16_t* row = w + r * cols;
    std::array<uint32_t, 256> count{};
    for (size_t c = 0; c < cols; ++c) ++count[row[c] >> 8];
    std::array<int, 256> order;
    for (int i = 0; i < 256; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return count[a] > count[b]; });
    int distinct = 0;
    while (distinct < 256 && count[order[distinct]] > 0) ++distinct;
    uint8_t* table = m.tables_.data() + r * kPackedTableBytes;
    std::array<int, 256> code;
    code.fill(-1);
    int used = 0;
    if (distinct > static_cast<int>(kPackedTableBytes)) {
      table[used] = 0x00;
      code[0x00] = used++;
    }
    for (int i = 0; i < distinct && used < static_cast<int>(kPackedTableBytes); ++i) {
      if (code[order[i]] >= 0) continue;
      table[used] = static_cast<uint8_t>(order[i]);
      code[order[i]] = used++;
    }
    // A value outside the table decodes to +0: high byte 0x00 (in the table whenever some value
    // is outside it), low byte 0.
    const int zero_code = code[0x00] >= 0 ? code[0x00] : 0;
    // Columns in order, so each row's exceptions come out by column. Padding columns keep the
    // zeros they were given: code 0, low byte 0 (a finite value: its exponent's last bit is 0).
    uint8_t* out = m.chunks_.data() + r * chunks * kPackedChunkBytes;
    for (size_t col = 0; col < cols; ++col) {
      uint8_t* codes = out + col / kPackedChunkColumns * kPackedChunkBytes;
      const size_t s = SlotOfColumn(col % kPackedChunkColumns);
      const uint16_t v = row[col];
      int c = code[v >> 8];
      if (c < 0) {
        c = zero_code;
        m.exc_col_.push_back(static_cast<uint32_t>(col));
        m.exc_bits_.push_back(v);
      } else {
        codes[32 + s] = static_cast<uint8_t>(v & 0xFF);
      }
      codes[s % 32] |= static_cast<uint8_t>(s < 32 ? c : c << 4);
    }
    m.exc_begin_[r + 1] = static_cast<uint32_t>(m.exc_col_.size());
  }
  return m;
}

void UnpackBf16RowsScalar(const PackedBf16View& w, size_t r0, size_t r1, uint16_t* out) {
  const size_t chunks = w.ChunksPerRow();
  for (size_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.Row(r);
    const uint8_t* table = w.tables + r * kPackedTableBytes;
    uint16_t* o = out + (r - r0) * w.cols;
    for (size_t ch = 0; ch < chunks; ++ch) {
      const uint8_t* codes = row + ch * kPackedChunkBytes;
      const uint8_t* low = codes + 32;
      for (size_t s = 0; s < kPackedChunkColumns; ++s) {
        const size_t col = ch * kPackedChunkColumns + ColumnOfSlot(s);
        if (col >= w.cols) continue;
        const int c = s < 32 ? (codes[s] & 0x0F) : (codes[s - 32] >> 4);
        o[col] = static_cast<uint16_t>((table[c] << 8) | low[s]);
      }
    }
    for (uint32_t i = w.exc_begin[r]; i < w.exc_begin[r + 1]; ++i) o[w.exc_col[i]] = w.exc_bits[i];
  }
}

void UnpackBf16Rows(const PackedBf16View& w, size_t r0, size_t r1, uint16_t* out) {
  static const bool avx2 = BestIsa() >= kernels::Backend::kAvx2;
  if (avx2) {
    UnpackBf16RowsAvx2(w, r0, r1, out);
  } else {
    UnpackBf16RowsScalar(w, r0, r1, out);
  }
}

bool PackingPays(const kernels::DenseKernels& k) { return UsesAvx512Bf16(k); }

void MatmulPackedBf16(const kernels::DenseKernels& k, const float* x, size_t ldx, size_t T,
                      const PackedBf16View& w, size_t n_begin, size_t n_end, float* y, size_t ldy,
                      uint16_t* scratch, size_t scratch_values) {
  if (n_begin >= n_end || T == 0) return;
  if (w.FitsInRegisterProducts() && UsesAvx512Bf16(k)) {
    MatmulPackedBf16Avx512Bf16(x, ldx, T, w, n_begin, n_end, y, ldy);
    return;
  }
  if (T == 1 && w.FitsInRegisterProducts() && (&k == &kAvx2Kernels || &k == &kAvx2Bf16ActsKernels)) {
    GemvPackedBf16Avx2(x, &k == &kAvx2Bf16ActsKernels, w, n_begin, n_end, y);
    return;
  }
  const size_t block = w.cols == 0 ? n_end - n_begin : scratch_values / w.cols;
  if (block == 0) {
    std::fprintf(stderr, "MatmulPackedBf16: scratch of %zu values is less than a row of %zu\n",
                 scratch_values, w.cols);
    std::abort();
  }
  for (size_t n = n_begin; n < n_end; n += block) {
    const size_t nr = std::min(block, n_end - n);
    UnpackBf16Rows(w, n, n + nr, scratch);
    k.matmul_bf16(x, ldx, T, scratch, w.cols, 0, nr, y + n, ldy);
  }
}

}  // namespace pw::cpu
