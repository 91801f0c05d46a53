// BlockTimes: wall time a runner spent in each kind of layer block, for benchmarks that ask
// where a forward pass goes (pw-bench-engine --block-times: a hybrid's linear-attention layers
// against its full-attention ones). A runner given one (Runner::SetBlockTimes) adds each
// block's time and count to it; with none it reads no clock.
#pragma once

#include <array>
#include <cstdint>

namespace pw::engine {

enum class BlockKind : uint8_t {
  kFullAttention = 0,    // softmax attention over the paged KV (sliding layers included)
  kLinearAttention = 1,  // a hybrid's Gated DeltaNet
  kLatentAttention = 2,  // MLA
  kMlp = 3,              // the routed experts with their router and shared expert, or a dense MLP
};
inline constexpr int kNumBlockKinds = 4;
const char* BlockKindName(BlockKind k);

struct BlockTimes {
  std::array<double, kNumBlockKinds> seconds{};
  std::array<int64_t, kNumBlockKinds> blocks{};  // blocks run (layers x forward passes)
  int64_t passes = 0;                            // forward passes timed

  // Layers of kind k in the model: every pass runs each layer's blocks once.
  int64_t Layers(BlockKind k) const { return passes > 0 ? blocks[static_cast<int>(k)] / passes : 0; }

  void Add(BlockKind k, double s) {
    seconds[static_cast<int>(k)] += s;
    ++blocks[static_cast<int>(k)];
  }
  void Reset() { *this = BlockTimes{}; }
};

}  // namespace pw::engine
