// One expert block on the integer fast path, and the scratch its quantized activations use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "kernels/anyprec/anyprec.h"
#include "kernels/anyprec/q8.h"
#include "kernels/cpu/thread_pool.h"

namespace pw::anyprec {

// Scratch for quantized activations (Q8ActsBytes), grown on demand and reused.
class Q8ActsScratch {
 public:
  uint8_t* Get(size_t bytes);
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<uint8_t, Free> buf_;
  size_t bytes_ = 0;
};

// One block on the fast path: y[t][r] for t < num_tokens (in chunks of kMaxTokens, each
// quantized once for all the threads that share its rows) and every row r, split across
// `pool` when the block is large enough. The per-block form of RunQ8Experts (q8_experts.h),
// which gives the same bits for a whole layer.
Status ApplyQ8Block(kernels::Backend backend, const BlockView& view, int bits, const Q8Lut& lut,
                    const float* x, size_t ldx, size_t num_tokens, float* y, size_t ldy,
                    cpu::ThreadPool* pool, Q8ActsScratch* acts);

}  // namespace pw::anyprec
