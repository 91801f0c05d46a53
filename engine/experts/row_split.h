// Splitting one expert block's output rows over the engine's thread pool.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/thread_pool.h"

namespace pw::anyprec {

// Splits rows only when each thread gets a meaningful share of the block.
inline int Pieces(int rows, int cols, int tokens, int threads) {
  return (static_cast<int64_t>(rows) * cols * tokens >= (1 << 16)) ? std::min(threads, rows) : 1;
}

// Runs piece(i, r0, r1) for `pieces` contiguous shares of [0, rows), on the pool when there is
// more than one, and returns the first error.
template <typename F>
Status SplitRows(cpu::ThreadPool* pool, int rows, int pieces, F&& piece) {
  std::vector<Status> status(pieces);
  auto run = [&](int i) {
    const int r0 = static_cast<int>(static_cast<int64_t>(rows) * i / pieces);
    const int r1 = static_cast<int>(static_cast<int64_t>(rows) * (i + 1) / pieces);
    status[i] = piece(i, r0, r1);
  };
  if (pieces > 1) {
    pool->ParallelFor(static_cast<size_t>(pieces), 1, 1, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) run(static_cast<int>(i));
    });
  } else {
    run(0);
  }
  for (const Status& s : status) PW_RETURN_IF_ERROR(s);
  return Status::Ok();
}

}  // namespace pw::anyprec
