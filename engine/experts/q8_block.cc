#include "engine/experts/q8_block.h"

#include <algorithm>
#include <cstdlib>

#include "engine/experts/row_split.h"

namespace pw::anyprec {

void Q8ActsScratch::Free::operator()(void* p) const { std::free(p); }

uint8_t* Q8ActsScratch::Get(size_t bytes) {
  if (bytes_ < bytes) {
    buf_.reset(static_cast<uint8_t*>(std::aligned_alloc(kWorkspaceAlign, (bytes + 63) / 64 * 64)));
    bytes_ = bytes;
  }
  return buf_.get();
}

Status ApplyQ8Block(kernels::Backend backend, const BlockView& view, int bits, const Q8Lut& lut,
                    const float* x, size_t ldx, size_t num_tokens, float* y, size_t ldy,
                    cpu::ThreadPool* pool, Q8ActsScratch* acts) {
  const int threads = pool != nullptr ? std::max(1, pool->num_threads()) : 1;
  for (size_t t0 = 0; t0 < num_tokens; t0 += kMaxTokens) {
    const int n = static_cast<int>(std::min<size_t>(kMaxTokens, num_tokens - t0));
    const size_t need = Q8ActsBytes(n, view.cols);
    Q8Acts a;
    PW_RETURN_IF_ERROR(QuantizeActs(x + t0 * ldx, ldx, n, view.cols, {acts->Get(need), need}, &a));
    float* yt = y + t0 * ldy;
    PW_RETURN_IF_ERROR(SplitRows(pool, view.rows, Pieces(view.rows, view.cols, n, threads),
                                 [&](int, int r0, int r1) {
                                   return ApGemmQ8Rows(backend, view, bits, lut, a, yt, ldy, r0, r1);
                                 }));
  }
  return Status::Ok();
}

}  // namespace pw::anyprec
