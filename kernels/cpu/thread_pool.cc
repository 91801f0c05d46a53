#include "kernels/cpu/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pw::cpu {
namespace {

// About 10-30 microseconds of polling before a thread blocks.
constexpr int kSpinIterations = 2000;

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::Run(size_t n, size_t align, size_t min_per_thread, Thunk fn, void* ctx) {
  if (n == 0) return;
  if (align == 0) align = 1;
  if (min_per_thread == 0) min_per_thread = 1;
  size_t pieces = static_cast<size_t>(num_threads_);
  if (n / min_per_thread < pieces) pieces = n / min_per_thread;
  if (pieces <= 1 || busy_.exchange(true, std::memory_order_acq_rel)) {
    // Small work, or re-entered from inside a piece: run inline.
    fn(ctx, 0, n);
    return;
  }
  // Piece size rounded up to a multiple of align.
  size_t chunk = (n + pieces - 1) / pieces;
  chunk = (chunk + align - 1) / align * align;
  pieces = (n + chunk - 1) / chunk;
  fn_ = fn;
  ctx_ = ctx;
  pieces_ = pieces;
  chunk_ = chunk;
  n_ = n;
  // Every worker acknowledges every job (idle ones too), so no worker can still be reading
  // this job's fields when the next job overwrites them.
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  fn(ctx, 0, chunk < n ? chunk : n);
  bool done = false;
  for (int i = 0; i < kSpinIterations && !done; ++i) {
    done = pending_.load(std::memory_order_acquire) == 0;
    if (!done) CpuRelax();
  }
  if (!done) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  busy_.store(false, std::memory_order_release);
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int i = 0; i < kSpinIterations && g == seen && !stop_.load(std::memory_order_acquire);
         ++i) {
      CpuRelax();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] {
        return stop_.load(std::memory_order_acquire) ||
               generation_.load(std::memory_order_acquire) != seen;
      });
      g = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = g;
    if (static_cast<size_t>(index) < pieces_) {
      const size_t begin = static_cast<size_t>(index) * chunk_;
      const size_t end = begin + chunk_ < n_ ? begin + chunk_ : n_;
      fn_(ctx_, begin, end);
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace pw::cpu
