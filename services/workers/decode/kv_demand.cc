#include "services/workers/decode/kv_demand.h"

#include <algorithm>

namespace pw::workers {

KvDemand::KvDemand(int block_size, int pages_per_block, int64_t max_context, int64_t horizon_tokens)
    : block_size_(std::max(1, block_size)),
      pages_per_block_(std::max(1, pages_per_block)),
      max_context_(max_context),
      horizon_(std::max<int64_t>(0, horizon_tokens)) {}

void KvDemand::SetSlidingLayers(int layers, int window) {
  sliding_layers_ = std::clamp(layers, 0, pages_per_block_);
  window_blocks_ = std::max(1, window) / block_size_ + 2;
}

int64_t KvDemand::SlidingGrowth(int64_t held, int64_t need) const {
  return std::max<int64_t>(0, std::min(need, window_blocks_) - std::min(held, window_blocks_));
}

int64_t KvDemand::Blocks(int64_t tokens) const {
  tokens = std::clamp<int64_t>(tokens, 0, max_context_);
  return (tokens + block_size_ - 1) / block_size_;
}

void KvDemand::AddRunning(int64_t len, int64_t end, bool holds_kv) {
  const int64_t held = holds_kv ? Blocks(len) : 0;
  if (horizon_ > 0) end = std::min(end, len + horizon_);
  running_blocks_ += std::max<int64_t>(0, Blocks(end) - held) + 1;
  running_sliding_ += SlidingGrowth(held, std::max(held, Blocks(end)) + 1);
}

void KvDemand::AddLease(int64_t held_blocks, int64_t max_tokens) {
  if (max_tokens <= 0) {  // unknown: room for its first decode tokens
    ++lease_blocks_;
    lease_sliding_ += SlidingGrowth(held_blocks, held_blocks + 1);
    return;
  }
  if (horizon_ > 0) max_tokens = std::min(max_tokens, horizon_);
  // The prompt fills the held blocks up to at most one partial block: grow from their end.
  const int64_t end = held_blocks * block_size_ + 1 + std::max<int64_t>(0, max_tokens);
  lease_blocks_ += std::max<int64_t>(0, Blocks(end) - held_blocks) + 1;
  lease_sliding_ += SlidingGrowth(held_blocks, std::max(held_blocks, Blocks(end)) + 1);
}

void KvDemand::AddWaiting(int64_t prompt, int64_t max_tokens) {
  if (horizon_ > 0) max_tokens = std::min(max_tokens, horizon_);
  const int64_t need = Blocks(prompt + 1 + std::max<int64_t>(0, max_tokens));
  waiting_blocks_ += need;
  // Its prompt's blocks are leased whole (every layer's page) before any is released.
  waiting_sliding_ += std::max(Blocks(prompt), SlidingGrowth(0, need));
}

}  // namespace pw::workers
