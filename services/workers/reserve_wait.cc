#include "services/workers/reserve_wait.h"

#include <algorithm>

namespace pw::workers {

ReserveWait::Admit ReserveWait::Decide(int64_t need, int64_t free, int64_t reserve, int64_t lowerable) const {
  if (!enabled()) return Admit::kAnswer;
  if (held_.empty() && need <= free - reserve) return Admit::kNow;
  if (held_.size() < max_waiting_ && need <= free - reserve + lowerable) return Admit::kHold;
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

int64_t ReserveWait::LowerablePages(const memory::WeightPageTable& table, int min_bits) {
  int64_t pages = 0;
  for (int i = 0; i < table.num_blocks(); ++i) {
    const auto& e = table.entry(static_cast<size_t>(i));
    const int from = e.committed;
    if (from > min_bits) pages += table.PagesAt(static_cast<size_t>(i), from) - table.PagesAt(static_cast<size_t>(i), min_bits);
  }
  return std::max<int64_t>(0, pages);
}

}  // namespace pw::workers
