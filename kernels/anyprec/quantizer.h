// Any-precision quantization of one linear block (DESIGN.md section 3, after Any-Precision LLM):
//
//   1. seed: per output row, sensitivity-weighted 1-D k-means into 2^seed_bits clusters
//      (Lloyd iterations on the sorted row, where clusters are intervals; init at weighted
//      quantiles);
//   2. upscale: every cluster of level b is split into children 2c (smaller values) and 2c+1
//      by the optimal weighted 2-means split (exhaustive over split points of the interval),
//      up to max_bits; levels above max_bits (if max_bits < 8) keep every weight in child 2c;
//      levels below seed_bits merge sibling pairs (weighted means);
//   3. every level's centroids, rounded to fp16, are its LUT (never refit); the 8-bit leaf id
//      of each weight is its parent code, so its b-bit code is the top b bits;
//   4. damage table: D[b] = sum_r sum_c h_c (w_rc - LUT_b[r][code_b(r, c)])^2 for b in 3..8 and
//      D[0] = sum h_c w_rc^2 (block dropped), computed exactly with the fp16 centroids.
//
// Split identity (checked by the tests): with the unrounded (fp64) centroids, for b > seed,
//   D64[b-1] - D64[b] = sum over splits c -> (L, R) of S_L S_R / (S_L + S_R) (mu_L - mu_R)^2,
// S = sensitivity mass of a child, mu its weighted mean.
//
// Deterministic: the same inputs give the same bytes whatever the thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "kernels/anyprec/pack.h"

namespace pw::anyprec {

struct QuantizeOptions {
  int seed_bits = 3;     // in [3, max_bits]
  int max_bits = 8;      // in [seed_bits, 8]
  int lloyd_iters = 50;  // cap on seed Lloyd iterations (stops earlier when stable)
  int threads = 1;       // rows are split across this many threads
};

struct QuantizedBlock {
  PackedBlock block;             // planes of the parent codes + LUT_3..LUT_8
  double damage[kMaxBits + 1] = {};      // exact, fp16 centroids; entries 0 and 3..8
  double damage_fp64[kMaxBits + 1] = {};  // exact, unrounded centroids; entries 0 and 3..8
  double split_gain[kMaxBits + 1] = {};   // [b]: sum of split terms creating level b from b-1
};

// w: [rows][cols] row-major fp32 weights (finite); h: [cols] sensitivities (finite, > 0),
// the same for every row (diagonal Hessian E[x_c^2] of the block's input).
Result<QuantizedBlock> QuantizeBlock(const float* w, int rows, int cols, const float* h,
                                     const QuantizeOptions& options);

// The same with the weights given a row at a time: row_of(r, out) writes row r's cols fp32
// weights to out. It is called once per row from the quantizer's threads, rows in any order
// (a checkpoint's bf16 rows are converted there, in parallel, not into a block-sized copy
// first). A non-finite weight is an error naming the first one in row-major order.
using WeightRowFn = std::function<void(int row, float* out)>;
Result<QuantizedBlock> QuantizeBlock(const WeightRowFn& row_of, int rows, int cols, const float* h,
                                     const QuantizeOptions& options);

}  // namespace pw::anyprec
