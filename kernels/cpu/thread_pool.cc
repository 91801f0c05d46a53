#include "kernels/cpu/thread_pool.h"

namespace pw::cpu {

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
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
  if (pieces <= 1) {
    fn(ctx, 0, n);
    return;
  }
  // Piece size rounded up to a multiple of align.
  size_t chunk = (n + pieces - 1) / pieces;
  chunk = (chunk + align - 1) / align * align;
  pieces = (n + chunk - 1) / chunk;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (busy_) {  // re-entered from inside a piece: run inline.
      lock.unlock();
      fn(ctx, 0, n);
      return;
    }
    busy_ = true;
    fn_ = fn;
    ctx_ = ctx;
    pieces_ = pieces;
    chunk_ = chunk;
    n_ = n;
    pending_ = static_cast<int>(pieces) - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  fn(ctx, 0, chunk < n ? chunk : n);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  busy_ = false;
}

void ThreadPool::WorkerLoop(int index) {
  unsigned long seen = 0;
  for (;;) {
    Thunk fn;
    void* ctx;
    size_t begin, end;
    bool has_piece;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      ctx = ctx_;
      has_piece = static_cast<size_t>(index) < pieces_;
      begin = static_cast<size_t>(index) * chunk_;
      end = begin + chunk_ < n_ ? begin + chunk_ : n_;
    }
    if (!has_piece) continue;
    fn(ctx, begin, end);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
    }
    done_cv_.notify_one();
  }
}

}  // namespace pw::cpu
