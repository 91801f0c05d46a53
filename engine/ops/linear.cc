#include "engine/ops/linear.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

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
    std::fprintf(stderr, "dense int8 product: %s\n", s.ToString().c_str());
    std::abort();
  }
}

// x quantized once per chunk of anyprec::kMaxTokens tokens, then rows(acts, yt, b, e) for row
// ranges split over the pool.
template <typename RowsFn>
void LinearInt(cpu::ThreadPool* pool, const float* x, size_t ldx, size_t T, int rows, int cols,
               float* y, size_t ldy, const RowsFn& rows_fn) {
  for (size_t t0 = 0; t0 < T; t0 += anyprec::kMaxTokens) {
    const int n = static_cast<int>(std::min<size_t>(anyprec::kMaxTokens, T - t0));
    const anyprec::Workspace ws = ActsBuffer(anyprec::Q8ActsBytes(n, cols));
    anyprec::Q8Acts acts;
    Check(anyprec::QuantizeActs(x + t0 * ldx, ldx, n, cols, ws, &acts));
    float* yt = y + t0 * ldy;
    const size_t min_rows = MinRowsPerThread(static_cast<size_t>(cols), static_cast<size_t>(n));
    auto run = [&](size_t b, size_t e) {
      Check(rows_fn(acts, yt, static_cast<int>(b), static_cast<int>(e)));
    };
    if (pool == nullptr) {
      run(0, static_cast<size_t>(rows));
    } else {
      pool->ParallelFor(static_cast<size_t>(rows), 16, min_rows, run);
    }
  }
}

}  // namespace

void MatmulPacked(const kernels::DenseKernels& k, const float* x, size_t ldx, size_t T,
                  const cpu::PackedBf16View& w, size_t r0, size_t r1, float* y, size_t ldy) {
  thread_local std::vector<uint16_t> scratch;
  const size_t values = std::max<size_t>(size_t{128} << 10, w.cols);
  if (scratch.size() < values) scratch.resize(values);
  cpu::MatmulPackedBf16(k, x, ldx, T, w, r0, r1, y, ldy, scratch.data(), scratch.size());
}

void LinearPacked(cpu::ThreadPool* pool, const kernels::DenseKernels& k, const float* x, size_t ldx,
                  size_t T, const cpu::PackedBf16Matrix& w, float* y, size_t ldy) {
  const cpu::PackedBf16View v = w.view();
  auto run = [&](size_t b, size_t e) { MatmulPacked(k, x, ldx, T, v, b, e, y, ldy); };
  if (pool == nullptr) {
    run(0, v.rows);
  } else {
    pool->ParallelFor(v.rows, 16, MinRowsPerThread(v.cols, T), run);
  }
}

void LinearQ8(cpu::ThreadPool* pool, const float* x, size_t ldx, size_t T, const anyprec::Q8Matrix& w,
              float* y, size_t ldy) {
  static const kernels::Backend backend = anyprec::BestQ8Backend();
  LinearInt(pool, x, ldx, T, w.rows, w.cols, y, ldy,
            [&](const anyprec::Q8Acts& acts, float* yt, int b, int e) {
              return anyprec::DenseQ8Rows(backend, w, acts, yt, ldy, b, e);
            });
}

void LinearAp(cpu::ThreadPool* pool, const float* x, size_t ldx, size_t T,
              const anyprec::DenseApMatrix& w, float* y, size_t ldy) {
  static const kernels::Backend backend = anyprec::BestQ8Backend();
  const anyprec::BlockView& v = w.view();
  LinearInt(pool, x, ldx, T, v.rows, v.cols, y, ldy,
            [&](const anyprec::Q8Acts& acts, float* yt, int b, int e) {
              return anyprec::ApGemmQ8Rows(backend, v, w.bits, w.lut, acts, yt, ldy, b, e);
            });
}

}  // namespace pw::engine
