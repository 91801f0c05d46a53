// BlockWriteQueue: the store build's writes (checksums, copies into the page cache, flushes) run
// on a thread of their own, in the order they were pushed, while the next block is fitted.
// Fitting keeps every core busy and writing a block takes a fifth of the time fitting it does;
// done in line, each block's write left the other fitting threads idle (docs/benchmarks.md,
// "The store build").
//
// Owner: QuantizeModel, one per build. Push() blocks while `capacity` writes are waiting, so
// at most that many fitted blocks are held in memory. The first write that fails stops the
// queue: later writes are dropped, and Push() and Drain() return that error, so a build stops
// at its first failed write as it did when writes were in line.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "common/status.h"

namespace pw::anyprec {

class BlockWriteQueue {
 public:
  explicit BlockWriteQueue(size_t capacity);
  ~BlockWriteQueue();  // drains what is queued
  BlockWriteQueue(const BlockWriteQueue&) = delete;
  BlockWriteQueue& operator=(const BlockWriteQueue&) = delete;

  // Queues `write` behind the others; the first failed write's status once one has failed
  // (`write` is then dropped).
  Status Push(std::function<Status()> write);
  // Waits until every queued write has run; the first failed write's status, if any.
  Status Drain();
  // Seconds the writing thread spent running writes (read after Drain).
  double busy_seconds() const { return busy_seconds_; }

 private:
  void Run();

  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::function<Status()>> queue_;
  bool running_ = false;  // a write taken off the queue is running
  bool stop_ = false;
  Status failed_;
  double busy_seconds_ = 0;
  std::thread thread_;
};

}  // namespace pw::anyprec
