// ExpertWorkspace: the scratch one MoE layer's expert computation runs in.
//
// The engine owns one per driving thread (in its MoE scratch) and lends it to the provider
// with every ExpertLayerCall, so a provider needs no per-call allocation of its own and two
// engines sharing a provider never share staging buffers. A provider names its buffers by
// slot numbers: slots [0, kRunnerSlots) belong to the shared layer runners
// (RunExpertsByBlock, RunBf16Experts, RunQ8Experts), [kRunnerSlots, kSlots) to the provider
// itself; a slot keeps its bytes until the next request of the same slot asks for more. Not thread-safe: the driving thread takes buffers, the pool's
// workers only read and write inside them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "engine/experts/expert_tiles.h"

namespace pw::engine {

class ExpertWorkspace {
 public:
  static constexpr int kSlots = 16;
  static constexpr int kRunnerSlots = 8;
  static constexpr size_t kAlign = 64;

  // At least `bytes` bytes, kAlign-aligned (a fresh buffer when the slot was smaller; the
  // old contents are then gone). slot in [0, kSlots).
  void* Bytes(int slot, size_t bytes) {
    if (slot < 0 || slot >= kSlots) std::abort();  // a broken invariant: slots are constants
    Buffer& b = buffers_[slot];
    if (b.bytes < bytes || b.p == nullptr) {
      const size_t n = (bytes + kAlign - 1) / kAlign * kAlign;
      b.p.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, n == 0 ? kAlign : n)));
      b.bytes = n;
    }
    return b.p.get();
  }
  // `count` elements of T (trivially constructible), uninitialised.
  template <typename T>
  T* Array(int slot, size_t count) {
    return static_cast<T*>(Bytes(slot, count * sizeof(T)));
  }
  // The tiles of one dispatch (expert_tiles.h), reused.
  std::vector<ExpertTile>& tiles() { return tiles_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  struct Buffer {
    std::unique_ptr<uint8_t, Free> p;
    size_t bytes = 0;
  };
  Buffer buffers_[kSlots];
  std::vector<ExpertTile> tiles_;
};

}  // namespace pw::engine
