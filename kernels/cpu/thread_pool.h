// A small fixed thread pool that splits one range of work into contiguous chunks.
//
// The engine uses it to split kernels by output rows (matmuls) or by (token, head) pairs
// (attention). ParallelFor cuts the range into a few chunks per thread and every thread, the
// calling one included, claims the next unclaimed chunk until none is left: a thread that
// runs slow (a shared memory bus) or starts late leaves its remaining chunks to the others.
// (The caller still returns only after every worker has acknowledged the job, so a worker
// woken from sleep delays the return by its wake-up even when the others ran its chunks; the
// spin below keeps that rare within a decode step.) The chunk boundaries depend only on the
// arguments and the thread count, never on timing, so results do not depend on which thread
// ran a chunk.
// Dispatch never allocates. Waiting threads spin for a while (kDefaultSpinMicros, or
// PW_POOL_SPIN_US) before blocking on a condition variable, so back-to-back kernels do not pay
// a futex wake each. One thread drives a pool at a time (not reentrant: calling ParallelFor
// from inside a chunk runs that inner loop inline on the calling thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace pw::cpu {

class ThreadPool {
 public:
  // num_threads: total threads doing work, including the caller; values < 1 mean 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Chunks per thread a range is cut into, at most.
  static constexpr size_t kChunksPerThread = 4;
  // How long an idle thread polls for the next job before it sleeps: the kernels of one decode
  // step follow each other within this, so the workers stay awake through a step (a worker
  // woken from sleep starts tens to hundreds of microseconds late in a VM: at 50 us, batch-1
  // decode of the OLMoE-dimension model was 1.13-1.22x slower, docs/benchmarks.md).
  // PW_POOL_SPIN_US overrides it (0 to 1000000).
  static constexpr int kDefaultSpinMicros = 500;
  // The polling time in force (kDefaultSpinMicros or PW_POOL_SPIN_US), microseconds: how long
  // after its last job a worker may still hold a core.
  static long SpinMicros();

  // Calls fn(begin, end) on disjoint ranges covering [0, n), at most kChunksPerThread x
  // num_threads() of them, from any of the pool's threads. Range boundaries are multiples of
  // `align` (except n itself), so a kernel splitting output rows can keep its row blocks whole.
  // Every range but the last holds at least `min_per_thread` items; work under two such ranges,
  // or a pool of one thread, runs inline in one call.
  // Returns after every call has returned.
  template <typename F>
  void ParallelFor(size_t n, size_t align, size_t min_per_thread, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    auto thunk = [](void* ctx, size_t b, size_t e) { (*static_cast<Fn*>(ctx))(b, e); };
    Run(n, align, min_per_thread, thunk, const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using Thunk = void (*)(void*, size_t, size_t);
  void Run(size_t n, size_t align, size_t min_per_thread, Thunk fn, void* ctx);
  void WorkerLoop();
  // Claims and runs chunks of the current job until none is left.
  void RunChunks();

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  // The job of generation_: written by the caller before generation_ is bumped (release),
  // read by workers after they observe the new generation (acquire).
  std::atomic<uint64_t> generation_{0};
  Thunk fn_ = nullptr;
  void* ctx_ = nullptr;
  size_t chunks_ = 0;
  size_t chunk_ = 0;
  size_t n_ = 0;
  std::atomic<size_t> next_chunk_{0};
  std::atomic<int> pending_{0};  // workers that have not acknowledged the current job
  std::atomic<bool> busy_{false};
  std::atomic<bool> stop_{false};
};

}  // namespace pw::cpu
