#include "kernels/cpu/thread_pool.h"

#include "kernels/cpu/kernel_settings.h"

#include <chrono>
#include <cstdlib>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pw::cpu {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

std::chrono::nanoseconds SpinTime() {
  static const std::chrono::nanoseconds spin = [] {
    long us = ThreadPool::kDefaultSpinMicros;
    if (const char* v = KernelKnob("PW_POOL_SPIN_US"); v != nullptr && *v != '\0') {
      char* end = nullptr;
      const long parsed = std::strtol(v, &end, 10);
      if (*end == '\0' && parsed >= 0 && parsed <= 1000000) us = parsed;
    }
    return std::chrono::nanoseconds(us * 1000);
  }();
  return spin;
}

// Polls done() for SpinTime() (the clock read every 64 polls); true once it holds.
template <typename F>
bool Spin(F&& done) {
  const auto deadline = std::chrono::steady_clock::now() + SpinTime();
  for (unsigned i = 1;; ++i) {
    if (done()) return true;
    CpuRelax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

long ThreadPool::SpinMicros() {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::microseconds>(SpinTime()).count());
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
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
  const size_t most = kChunksPerThread * static_cast<size_t>(num_threads_);
  size_t chunks = n / min_per_thread < most ? n / min_per_thread : most;
  // Chunk size rounded up to a multiple of align.
  size_t chunk = chunks > 1 ? (n + chunks - 1) / chunks : n;
  chunk = (chunk + align - 1) / align * align;
  chunks = (n + chunk - 1) / chunk;
  if (num_threads_ == 1 || chunks <= 1 || busy_.exchange(true, std::memory_order_acq_rel)) {
    // One thread, small work, or re-entered from inside a chunk: run inline.
    fn(ctx, 0, n);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  chunks_ = chunks;
  chunk_ = chunk;
  n_ = n;
  next_chunk_.store(0, std::memory_order_relaxed);
  // Every worker acknowledges every job (idle ones too), so no worker can still be reading
  // this job's fields when the next job overwrites them.
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  RunChunks();
  auto all_acked = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!Spin(all_acked)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, all_acked);
  }
  busy_.store(false, std::memory_order_release);
}

void ThreadPool::RunChunks() {
  for (;;) {
    const size_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= chunks_) return;
    const size_t begin = c * chunk_;
    fn_(ctx_, begin, begin + chunk_ < n_ ? begin + chunk_ : n_);
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    auto woken = [&] {
      g = generation_.load(std::memory_order_acquire);
      return g != seen || stop_.load(std::memory_order_acquire);
    };
    if (!Spin(woken)) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, woken);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = g;
    RunChunks();
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace pw::cpu
