// A small fixed thread pool that splits one range of work into contiguous pieces.
//
// The engine uses it to split kernels by output rows (matmuls) or by (token, head) pairs
// (attention). ParallelFor blocks until every piece is done; the calling thread runs the first
// piece itself. Dispatch never allocates. One thread drives a pool at a time (not reentrant:
// calling ParallelFor from inside a piece runs that inner loop inline on the calling thread).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
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

  // Calls fn(begin, end) on disjoint ranges covering [0, n), at most num_threads() of them.
  // Range boundaries are multiples of `align` (except n itself), so a kernel splitting output
  // rows can keep its row blocks whole. Ranges with fewer than `min_per_thread` items are not
  // split further (small work runs inline). Returns after every call has returned.
  template <typename F>
  void ParallelFor(size_t n, size_t align, size_t min_per_thread, F&& fn) {
    auto thunk = [](void* ctx, size_t b, size_t e) { (*static_cast<F*>(ctx))(b, e); };
    Run(n, align, min_per_thread, thunk, &fn);
  }

 private:
  using Thunk = void (*)(void*, size_t, size_t);
  void Run(size_t n, size_t align, size_t min_per_thread, Thunk fn, void* ctx);
  void WorkerLoop(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  // Job published under mu_; workers run piece `index` of generation_.
  unsigned long generation_ = 0;
  Thunk fn_ = nullptr;
  void* ctx_ = nullptr;
  size_t pieces_ = 0;
  size_t chunk_ = 0;
  size_t n_ = 0;
  int pending_ = 0;
  bool busy_ = false;
  bool stop_ = false;
};

}  // namespace pw::cpu
