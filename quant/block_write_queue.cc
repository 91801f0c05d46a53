#include "quant/block_write_queue.h"

#include <chrono>
#include <utility>

namespace pw::anyprec {

BlockWriteQueue::BlockWriteQueue(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {
  thread_ = std::thread([this] { Run(); });
}

BlockWriteQueue::~BlockWriteQueue() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return queue_.empty() && !running_; });
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

Status BlockWriteQueue::Push(std::function<Status()> write) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return queue_.size() < capacity_ || !failed_.ok(); });
  if (!failed_.ok()) return failed_;
  queue_.push_back(std::move(write));
  changed_.notify_all();
  return Status::Ok();
}

Status BlockWriteQueue::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return queue_.empty() && !running_; });
  return failed_;
}

void BlockWriteQueue::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    changed_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_
    std::function<Status()> write = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    const bool skip = !failed_.ok();
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    Status st = skip ? Status::Ok() : write();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    busy_seconds_ += seconds;
    if (failed_.ok() && !st.ok()) {
      failed_ = std::move(st);
      queue_.clear();
    }
    running_ = false;
    changed_.notify_all();
  }
}

}  // namespace pw::anyprec
