#include "engine/ops/linear.h"

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace pw::engine {
namespace {

// The calling thread's activation buffer, grown on demand (the forward pass runs on one thread
// per engine; the pool's workers only read it).
anyprec::Workspace ActsBuffer(size_t bytes) {
  struct Buffer {
    std::unique_ptr<uint8_t, decltype(&std::free)> p{nullptr, &std::free};
    size_t bytes = 0;
  };
  thread_local Buffer buf;
  if (buf.bytes < bytes) {
    buf.p.reset(static_cast<uint8_t*>(std::aligned_alloc(anyprec::kWorkspaceAlign, (bytes + 63) / 64 * 64)));
    buf.bytes = bytes;
  }
  return {buf.p.get(), buf.bytes};
}

void Check(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "LinearQ8: %s\n", s.ToString().c_str());
    std::abort();
  }
}

}  // namespace

void LinearQ8(cpu::ThreadPool* pool, const float* x, size_t ldx, size_t T, const anyprec::Q8Matrix& w,
              float* y, size_t ldy) {
  static const kernels::Backend backend = anyprec::BestQ8Backend();
  const size_t rows = static_cast<size_t>(w.rows);
  for (size_t t0 = 0; t0 < T; t0 += anyprec::kMaxTokens) {
    const int n = static_cast<int>(std::min<size_t>(anyprec::kMaxTokens, T - t0));
    const anyprec::Workspace ws = ActsBuffer(anyprec::Q8ActsBytes(n, w.cols));
    anyprec::Q8Acts acts;
    Check(anyprec::QuantizeActs(x + t0 * ldx, ldx, n, w.cols, ws, &acts));
    float* yt = y + t0 * ldy;
    const size_t min_rows = MinRowsPerThread(static_cast<size_t>(w.cols), static_cast<size_t>(n));
    auto run = [&](size_t b, size_t e) {
      Check(anyprec::DenseQ8Rows(backend, w, acts, yt, ldy, static_cast<int>(b), static_cast<int>(e)));
    };
    if (pool == nullptr) {
      run(0, rows);
    } else {
      pool->ParallelFor(rows, 16, min_rows, run);
    }
  }
}

}  // namespace pw::engine
