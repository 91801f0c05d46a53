// Threaded wrappers over the dense CPU kernels, used by the forward pass.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/dense.h"
#include "kernels/cpu/thread_pool.h"
#include "engine/models/model.h"

namespace pw::engine {

// Least work (multiply-adds) worth handing to another thread.
inline constexpr size_t kMinParallelMacs = size_t{1} << 19;

// Fewest output rows worth giving one thread for a product of `cols` x `T` per row.
inline size_t MinRowsPerThread(size_t cols, size_t T) {
  return std::max<size_t>(16, kMinParallelMacs / std::max<size_t>(1, cols * T));
}

// One product per head, all in one pool hand-off: for h < heads, the rows x cols bf16 matrix at
// w + h * w_head times the head's input at x + h * x_head (T tokens, ldx apart) into
// y + h * y_head (ldy apart). The range split over the pool is heads x rows, so a batch-1 step's
// many small per-head products (MLA's absorbed W_UK and W_UV) share both threads instead of
// each running alone under kMinParallelMacs.
inline void HeadsLinear(cpu::ThreadPool* pool, const kernels::DenseKernels& k, size_t heads,
                        const float* x, size_t x_head, size_t ldx, size_t T, const uint16_t* w,
                        size_t w_head, size_t rows, size_t cols, float* y, size_t y_head,
                        size_t ldy) {
  auto run = [&](size_t b, size_t e) {
    while (b < e) {
      const size_t h = b / rows, r0 = b % rows;
      const size_t r1 = std::min(rows, r0 + (e - b));
      k.matmul_bf16(x + h * x_head, ldx, T, w + h * w_head, cols, r0, r1, y + h * y_head, ldy);
      b += r1 - r0;
    }
  };
  if (pool == nullptr) {
    run(0, heads * rows);
  } else {
    pool->ParallelFor(heads * rows, 16, MinRowsPerThread(cols, T), run);
  }
}

// y[t * ldy + n] = sum_k x[t * ldx + k] * W[n, k] for t < T and every row n of w, split over
// the pool by output rows (blocks of 16). Products under kMinParallelMacs multiply-adds per
// thread run on the calling thread: a pool hand-off costs microseconds (much more on a loaded
// host), which small matrices do not repay. One head of HeadsLinear.
inline void Linear(cpu::ThreadPool* pool, const kernels::DenseKernels& k, const float* x,
                   size_t ldx, size_t T, const uint16_t* w, size_t rows, size_t cols, float* y,
                   size_t ldy) {
  HeadsLinear(pool, k, 1, x, 0, ldx, T, w, 0, rows, cols, y, 0, ldy);
}

// The int8 copy of a matrix (Model::QuantizeDense): x quantized once per call (chunks of
// anyprec::kMaxTokens tokens), rows split over the pool as above. Aborts on a kernel error,
// which only a broken invariant can cause (shapes come from the model).
void LinearQ8(cpu::ThreadPool* pool, const float* x, size_t ldx, size_t T, const anyprec::Q8Matrix& w,
              float* y, size_t ldy);

// The any-precision copy of a matrix (Model::QuantizeDense), as LinearQ8 with the block kernel.
void LinearAp(cpu::ThreadPool* pool, const float* x, size_t ldx, size_t T,
              const anyprec::DenseApMatrix& w, float* y, size_t ldy);

// cpu::MatmulPackedBf16 over rows [r0, r1) of w with the calling thread's unpacking buffer
// (256 KB, or a row where rows are longer).
void MatmulPacked(const kernels::DenseKernels& k, const float* x, size_t ldx, size_t T,
                  const cpu::PackedBf16View& w, size_t r0, size_t r1, float* y, size_t ldy);

// The packed bf16 copy of a matrix (Model::QuantizeDense, kernels/cpu/packed_bf16.h), split
// over the pool as Linear.
void LinearPacked(cpu::ThreadPool* pool, const kernels::DenseKernels& k, const float* x, size_t ldx,
                  size_t T, const cpu::PackedBf16Matrix& w, float* y, size_t ldy);

inline void Linear(cpu::ThreadPool* pool, const kernels::DenseKernels& k, const float* x,
                   size_t ldx, size_t T, const Bf16Matrix& w, float* y, size_t ldy) {
  if (w.packed != nullptr) {
    LinearPacked(pool, k, x, ldx, T, *w.packed, y, ldy);
    return;
  }
  if (w.q8 != nullptr) {
    LinearQ8(pool, x, ldx, T, *w.q8, y, ldy);
    return;
  }
  if (w.ap != nullptr) {
    LinearAp(pool, x, ldx, T, *w.ap, y, ldy);
    return;
  }
  Linear(pool, k, x, ldx, T, w.data, static_cast<size_t>(w.rows), static_cast<size_t>(w.cols), y,
         ldy);
}

}  // namespace pw::engine
