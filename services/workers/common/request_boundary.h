// RequestBoundary: whether the decode worker's set of running requests changed since the last
// check (a request joined or left the batch), for the "no async movement" ablation of the
// quality-aware planner (DESIGN.md 5.1): with it on, the worker commits and starts expert
// width changes only at such a boundary instead of at every iteration boundary.
//
// The set is summarised as its size and the sum of a 64-bit mix of every id (order-free, so
// a map's iteration order does not matter; one request leaving and another joining in the
// same iteration changes the sum).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pw::workers {

class RequestBoundary {
 public:
  // Start a summary, add every running id, then Crossed(): true when it differs from the one
  // of the previous Crossed() call (true on the first call).
  void Begin() {
    n_ = 0;
    sum_ = 0;
  }
  void Add(uint64_t id) {
    ++n_;
    sum_ += Mix(id);
  }
  bool Crossed() {
    const bool changed = !seen_ || n_ != last_n_ || sum_ != last_sum_;
    seen_ = true;
    last_n_ = n_;
    last_sum_ = sum_;
    return changed;
  }

 private:
  static uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }

  size_t n_ = 0, last_n_ = 0;
  uint64_t sum_ = 0, last_sum_ = 0;
  bool seen_ = false;
};

}  // namespace pw::workers
