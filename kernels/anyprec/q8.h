// The integer fast path of the any-precision kernels: the same bit-planes as anyprec.h, with
// an int8 copy of each row's LUT and int8 activations, multiplied with integer dot products.
//
//   weight(r, c)  ~= lut_scale[r] * lut_q8[r][code_b(r, c)]       (int8 in [-L, L], Q8LutMax)
//   x(t, c)       ~= act_scale[t][g] * xq[t][c],  g = c / 256      (int8 in [-127, 127])
//   y[t, r] = lut_scale[r] * sum_g act_scale[t][g] * sum_{c in g} lut_q8[r][code] * xq[t][c]
//
// The inner sums are exact integers (int32 per 256-column group); only the group sums are
// scaled and added in fp32. One activation scale per 256 columns (one packing group), as
// llama.cpp's Q8_K: the group's 256 products stay in int32 before one float multiply-add.
//
// Backends: scalar (the reference: int64 group sums, fp64 accumulation); AVX2 (byte shuffles
// into the int8 LUT, vpmaddubsw with the sign trick; at 3-4 bits on the LUT biased to
// unsigned; dense matrices within kDenseQ8PairMax two slices per widening); AVX-512 with VNNI, VBMI and GFNI (vpermb / vpermi2b lookups, vpdpbusd on the LUT
// offset to unsigned, 5-6-bit codes of one token by vgf2p8affineqb bit transposes); AMX (the AVX-512 backend, with
// rows of up to 16384 columns at 8 tokens and more (3-4 bits; 3 bits past 4096 columns) or 12
// and more (the other widths) on AMX-INT8 tiles: the same codes and lookups in the signed LUT stored
// as A tiles, TDPBSSD per 256-column group, q8_amx.cc). The planes and the exact fp16 LUT
// stay as they are; the int8 LUT is a few KB per block and width (QuantizeLut), made when a
// store is opened or a width committed. Activations are quantized once per layer input
// (QuantizeActs) and shared by every block that reads them.
//
// As in anyprec.h, the kernels take views, never allocate and never spawn threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "kernels/anyprec/anyprec.h"

namespace pw::anyprec {

// Columns per activation scale (one packing group).
inline constexpr int kActGroupCols = kGroupCols;

// Largest |value| of a width's int8 LUT: kQ8LutBias - 1 = 31 up to kQ8BiasedMaxBits bits, 127
// above. At 3 and 4 bits (8 and 16 centroids) the narrower range costs no measurable perplexity
// (docs/quality.md, "Fast path vs exact path"), and a value plus kQ8LutBias is then an unsigned
// byte of at most 63: the AVX2 kernel (q8_avx2.cc) looks the biased value up and multiplies it
// with vpmaddubsw as it is (no sign trick), adds two slices' int16 pair sums (each within
// 2 * 63 * 127) before widening them, and takes the bias's share off at the end with
// Q8Acts::offsets. Above 4 bits the table keeps the full int8 range.
inline constexpr int kQ8BiasedMaxBits = 4;
inline constexpr int kQ8LutBias = 32;
constexpr int Q8LutMax(int bits) { return bits <= kQ8BiasedMaxBits ? kQ8LutBias - 1 : 127; }

// int8 LUT of one block at one width: values [rows][2^bits], scales [rows]. The values are
// either one contiguous array (`values`) or, when `pages` is set, row tiles: page i holds rows
// [i * tile_rows, min(rows, (i + 1) * tile_rows)) contiguously (pages of a paged pool).
struct Q8Lut {
  const int8_t* values = nullptr;
  const float* scales = nullptr;
  const int8_t* const* pages = nullptr;
  int tile_rows = 0;
};
// Start of row r's 2^bits int8 centroids.
inline const int8_t* Q8LutRow(const Q8Lut& lut, int r, int bits) {
  if (lut.pages != nullptr) {
    return lut.pages[r / lut.tile_rows] + (static_cast<size_t>(r % lut.tile_rows) << bits);
  }
  return lut.values + (static_cast<size_t>(r) << bits);
}

// Bytes of the int8 LUT values of a block (rows x 2^bits) and of its scales (rows floats).
constexpr size_t Q8LutValueBytes(int rows, int bits) { return static_cast<size_t>(rows) << bits; }

// From the exact fp16 LUT [rows][2^bits]: scales[r] = max_i |lut[r][i]| / Q8LutMax(bits) and
// values[r][i] = round(lut[r][i] / scales[r]) (0 where the row is all zero). Non-finite
// centroids are an error.
Status QuantizeLut(const uint16_t* lut_f16, int rows, int bits, int8_t* values, float* scales);

// Quantized activations of `tokens` rows of `cols` columns, in the layout the kernels read:
//   q: [tokens][Q8ActStride(cols)] int8; groups of 256 columns are taken in pairs (2P, 2P+1),
//      and inside a pair the 32-column slice k of group 2P is followed by slice k of group
//      2P+1 (so one 64-byte load matches 64 bytes of two groups of a plane row); padding 0;
//   scales: [tokens][Q8ActGroups(cols)] fp32 (0 for padding groups);
//   offsets: [tokens]: 128 * sum_g scales[t][g] * sum_{c in g} q[t][c] (the term a kernel that
//      multiplies the LUT offset to unsigned subtracts).
struct Q8Acts {
  int tokens = 0;
  int cols = 0;
  const int8_t* q = nullptr;
  const float* scales = nullptr;
  const float* offsets = nullptr;
};

constexpr int Q8ActStride(int cols) { return (cols + 2 * kGroupCols - 1) / (2 * kGroupCols) * 2 * kGroupCols; }
constexpr int Q8ActGroups(int cols) { return Q8ActStride(cols) / kGroupCols; }
// Position of column c inside a token's row of Q8Acts::q.
constexpr int Q8ActIndex(int c) {
  return (c / (2 * kGroupCols)) * (2 * kGroupCols) + ((c % kGroupCols) / 32) * 64 +
         ((c / kGroupCols) % 2) * 32 + c % 32;
}
// Bytes QuantizeActs needs in its buffer (kWorkspaceAlign-aligned).
size_t Q8ActsBytes(int tokens, int cols);

// Quantizes x [tokens][ldx] (first `cols` columns of each row) into `buf` (Q8ActsBytes bytes,
// aligned) and points *out into it. Per group: scale = max |x| / 127, q = round(x / scale).
// Non-finite x is an error. tokens in [1, kMaxTokens].
Status QuantizeActs(const float* x, size_t ldx, int tokens, int cols, Workspace buf, Q8Acts* out);

// The same quantization for any number of rows into caller arrays: row t's values at
// q + t * Q8ActStride(cols), its scales at scales + t * Q8ActGroups(cols), its offset at
// offsets[t] — so rows [a, a + n) of the result, as Q8Acts{n, cols, q + a * stride,
// scales + a * groups, offsets + a}, are exactly what QuantizeActs gives for those n rows.
// q must be kWorkspaceAlign-aligned. Non-finite x is an error (nothing is then promised).
Status QuantizeActRows(const float* x, size_t ldx, int tokens, int cols, int8_t* q, float* scales,
                       float* offsets);

// True when `backend` has an integer fast path on this CPU (AVX-512 needs VNNI, VBMI and GFNI;
// AMX needs AVX-512's, AMX-TILE and AMX-INT8, and the OS's leave to use the tile state).
bool Q8BackendAvailable(kernels::Backend backend);
// The fastest backend with a fast path (AMX > AVX-512 > AVX2 > scalar; PW_ANYPREC_BACKEND=
// scalar|avx2|avx512|amx overrides as for BestBackend()).
kernels::Backend BestQ8Backend();

// Widest width the fast path `backend` runs at least as fast as the bf16 GEMV at one token:
// 8 with a byte permute of 64+ entries (AVX-512 VBMI, AMX); 5 on AVX2, where a 2^b-entry
// lookup costs 2^(b-4) shuffles and as many blends (docs/benchmarks.md, "The AVX2 fast path at
// 5-8 bits": 8 bits measured 0.41-0.49x bf16, 6 bits 0.9-1.2x). The scalar backend gets the
// same 5 (not measured against bf16: no CPU of this project lacks AVX2).
int FastWidthLimit(kernels::Backend backend);

// Rows [row_begin, row_end) of y [acts.tokens][ldy] (other entries untouched):
//   y[t][r] = the fast-path product above for block `view` at width `bits`.
// Reads planes 0..bits-1 of the view and `lut` (the view's fp16 LUTs may be null); acts.cols
// must equal view.cols.
Status ApGemmQ8Rows(kernels::Backend backend, const BlockView& view, int bits, const Q8Lut& lut,
                    const Q8Acts& acts, float* y, size_t ldy, int row_begin, int row_end);

// ---- Dense int8 matrices ------------------------------------------------------------------
// The same integer product for a plain dense matrix (attention projections, lm_head), as
// llama.cpp's q8_0 weights: W[r][c] ~= scales[r] * values[r][Q8ActIndex(c)], values in
// [-max_value, max_value], each row Q8ActStride(cols) bytes in the activation layout (padding
// zero), so one 64-byte load of weights meets one 64-byte load of activations.
struct Q8Matrix {
  int rows = 0;
  int cols = 0;
  const int8_t* values = nullptr;
  const float* scales = nullptr;
  // Largest |value| (1..127): at most kDenseQ8PairMax lets the AVX2 kernel add two slices'
  // int16 pair sums before widening them; a larger one (or a value beyond it) is the
  // caller's promise broken, which no kernel checks.
  int max_value = 127;
};
constexpr size_t Q8MatrixValueBytes(int rows, int cols) {
  return static_cast<size_t>(rows) * Q8ActStride(cols);
}
// Weights of at most 63 in magnitude: vpmaddubsw's int16 pair sums of |w| and sign(x, w) are
// then within 2 * 63 * 127 = 16002, two slices' add without overflow and one vpmaddwd widens
// both (q8_avx2.cc), as for the 3-4-bit LUT: 3 multiply µops per 32 products instead of 4, on
// AMD Zen 1's single 128-bit integer multiply pipe the bound of batched decode and prefill.
inline constexpr int kDenseQ8PairMax = 63;
// The range QuantizeBf16Rows gives a dense matrix that `backend` will multiply: kDenseQ8PairMax
// on AVX2 (and the scalar reference, so that the two agree on a CPU without AVX-512), 127 on
// AVX-512 and AMX, whose vpdpbusd has no int16 step to save (docs/quality.md, "Int8 dense
// weights": the narrower range's perplexity).
int DenseQ8Max(kernels::Backend backend);
// The range a process quantizes its dense matrices to: the knob PW_DENSE_Q8_MAX
// (KernelSettings::dense_q8_max) when set, else DenseQ8Max(BestQ8Backend()). kInvalidArgument
// for a knob outside 1..127.
Result<int> DenseQ8Range();
// From bf16 w [rows][cols] (row-major, raw bits): per row scale = max |w| / max_value, values =
// round(w / scale) placed at Q8ActIndex(c). values: Q8MatrixValueBytes, scales: rows floats.
// Non-finite weights, or max_value outside 1..127, are an error.
Status QuantizeBf16Rows(const uint16_t* w, int rows, int cols, int8_t* values, float* scales,
                        int max_value = 127);
// Rows [row_begin, row_end) of y [acts.tokens][ldy]:
//   y[t][r] = scales[r] * sum_g act_scale[t][g] * sum_{c in g} values[r][c] * xq[t][c].
Status DenseQ8Rows(kernels::Backend backend, const Q8Matrix& w, const Q8Acts& acts, float* y,
                   size_t ldy, int row_begin, int row_end);

}  // namespace pw::anyprec
