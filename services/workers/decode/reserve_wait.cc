#include "services/workers/decode/reserve_wait.h"

#include <algorithm>
#include <limits>
#include <queue>

namespace pw::workers {

ReserveWait::Admit ReserveWait::Decide(int64_t need, int64_t free, int64_t reserve, int64_t room) const {
  if (!enabled()) return Admit::kAnswer;
  if (held_.empty() && need <= free - reserve) return Admit::kNow;
  if (held_.size() < max_waiting_ && need <= free - reserve + room) return Admit::kHold;
  return Admit::kAnswer;
}

bool ReserveWait::Drop(uint64_t request_id) {
  auto it = std::find_if(held_.begin(), held_.end(),
                         [&](const HeldReserve& r) { return r.request_id == request_id; });
  if (it == held_.end()) return false;
  held_.erase(it);
  return true;
}

std::optional<ReserveWait::Due> ReserveWait::Next(uint64_t now_ms, int64_t free, int64_t reserve) {
  if (held_.empty()) return std::nullopt;
  const HeldReserve& front = held_.front();
  const bool fits = front.need_pages <= free - reserve;
  if (!fits && now_ms < front.since_ms + wait_ms_) return std::nullopt;
  Due d{front, fits};
  held_.pop_front();
  return d;
}

std::deque<HeldReserve> ReserveWait::TakeAll() {
  std::deque<HeldReserve> out;
  out.swap(held_);
  return out;
}

int64_t ReserveWait::LowerablePages(const std::vector<LowerableBlock>& blocks, const LowerFloors& floors) {
  const int lo = std::max(floors.min_bits, 0), hi = std::min(floors.max_bits, anyprec::kMaxBits);
  auto movable = [&](const LowerableBlock& b) { return b.committed > lo && b.committed <= hi; };
  int64_t pages = 0;
  if (floors.min_mean_bits <= 0) {
    for (const auto& b : blocks) {
      if (movable(b)) pages += b.pages[static_cast<size_t>(b.committed)] - b.pages[static_cast<size_t>(lo)];
    }
    return std::max<int64_t>(0, pages);
  }
  // The mean floor: sum of size * width may fall to min_mean_bits * sum of sizes, size = pages
  // at max_bits (the planner's weighting), summed over every block.
  double size_sum = 0, size_bits = 0;
  for (const auto& b : blocks) {
    const double size = b.pages[static_cast<size_t>(hi)];
    size_sum += size;
    size_bits += size * b.committed;
  }
  double budget = size_bits - floors.min_mean_bits * size_sum;
  if (budget <= 0) return 0;
  std::vector<int> width(blocks.size());
  struct Step {
    double per_bit;  // pages freed per unit of size * width given up
    size_t block;
    int to;
  };
  auto next = [&](size_t i, Step* s) {
    const auto& b = blocks[i];
    const int w = width[i];
    for (int to = w - 1; to >= lo; --to) {
      const int freed = b.pages[static_cast<size_t>(w)] - b.pages[static_cast<size_t>(to)];
      if (freed <= 0) continue;
      const double drop = static_cast<double>(b.pages[static_cast<size_t>(hi)]) * (w - to);
      *s = Step{drop > 0 ? freed / drop : std::numeric_limits<double>::infinity(), i, to};
      return true;
    }
    return false;
  };
  auto later = [](const Step& a, const Step& b) {
    if (a.per_bit != b.per_bit) return a.per_bit < b.per_bit;  // most pages per bit first
    return a.block > b.block;
  };
  std::priority_queue<Step, std::vector<Step>, decltype(later)> heap(later);
  for (size_t i = 0; i < blocks.size(); ++i) {
    width[i] = blocks[i].committed;
    Step s;
    if (movable(blocks[i]) && next(i, &s)) heap.push(s);
  }
  while (!heap.empty()) {
    const Step s = heap.top();
    heap.pop();
    const auto& b = blocks[s.block];
    const double drop = static_cast<double>(b.pages[static_cast<size_t>(hi)]) * (width[s.block] - s.to);
    if (drop > budget) continue;  // below the mean floor: leave the block
    budget -= drop;
    pages += b.pages[static_cast<size_t>(width[s.block])] - b.pages[static_cast<size_t>(s.to)];
    width[s.block] = s.to;
    Step again;
    if (next(s.block, &again)) heap.push(again);
  }
  return std::max<int64_t>(0, pages);
}

int64_t ReserveWait::LowerablePages(const memory::WeightPageTable& table, const LowerFloors& floors) {
  std::vector<LowerableBlock> blocks(static_cast<size_t>(table.num_blocks()));
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].committed = table.entry(i).committed;
    for (int w = 0; w <= anyprec::kMaxBits; ++w) blocks[i].pages[static_cast<size_t>(w)] = table.PagesAt(i, w);
  }
  return LowerablePages(blocks, floors);
}

}  // namespace pw::workers
