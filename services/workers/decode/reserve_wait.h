// ReserveWait: KV reservations a decode worker holds back for a while instead of granting them
// into KV its running requests will still need (where they would be preempted later) or
// refusing them, while a planned lowering of expert widths frees the pages (DESIGN.md 5.1,
// "router admission knows the pool").
//
// With wait_ms > 0, a KvReserve for `prompt` tokens and `max_tokens` to follow needs
//   need = pages of BlocksFor(prompt + 1 + max_tokens) blocks (kv_demand.h);
// and, with `free` pool pages free and `reserve` pages kept for the running requests' growth
// and the leases (KvDemand::reserve_pages), it is
//   granted now   when need <= free - reserve and nothing waits before it (FIFO);
//   held          when need <= free - reserve + room and fewer than max_waiting wait, room
//                 being what a wait can make: the pages the broker planner's lowest widths
//                 would free (every block at min_bits, or, with a mean-width floor, as far
//                 down as the floor lets the mean go; see LowerablePages) plus the KV pages
//                 held now (the decode worker adds them: they come back as requests finish): it
//                 counts in Telemetry's kvDemandPages, so the broker's planner lowers widths
//                 for it, and is granted at the first iteration boundary where it fits;
//   answered now  otherwise (waiting cannot help): granted if the KV pool has the prompt's
//                 blocks, refused if not, as without waiting.
// A held reservation is answered after at most wait_ms either way (granted if the prompt's
// blocks are free then, refused otherwise; the router retries a refusal after a backoff). The
// router waits for a KvReserveReply up to its phase_timeout_ms (30 s by default), so wait_ms
// must stay well below it. wait_ms 0 (the default): every reservation is answered at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "common/plane_layout.h"
#include "memory/weight_page_table.h"

namespace pw::workers {

// The widths a lowering may reach: the broker planner's floors (policies/planner/
// planner_params.h), which the decode worker is told (pw-decode --planner-min-bits,
// --planner-max-bits, --planner-min-mean-bits).
struct LowerFloors {
  int min_bits = anyprec::kMinBits;
  int max_bits = anyprec::kMaxBits;
  // The planner's floor on the mean committed width, blocks weighted by their pages at
  // max_bits; 0 = none.
  double min_mean_bits = 0;
};

// One expert block as LowerablePages sees it: its committed width and the pages it holds at
// each width 0..8 (non-decreasing).
struct LowerableBlock {
  int committed = 0;
  std::array<int, anyprec::kMaxBits + 1> pages{};
};

struct HeldReserve {
  uint64_t request_id = 0;
  uint32_t num_tokens = 0;  // prompt tokens prefill will write
  uint32_t max_tokens = 0;  // 0: unknown (the router did not say)
  uint32_t lease_ms = 0;
  uint64_t since_ms = 0;
  int64_t need_pages = 0;
};

class ReserveWait {
 public:
  enum class Admit { kNow, kHold, kAnswer };

  ReserveWait(uint64_t wait_ms, size_t max_waiting) : wait_ms_(wait_ms), max_waiting_(max_waiting) {}

  bool enabled() const { return wait_ms_ > 0; }
  uint64_t wait_ms() const { return wait_ms_; }
  size_t size() const { return held_.size(); }
  const std::deque<HeldReserve>& held() const { return held_; }

  // What to do with a new reservation (see the file comment).
  Admit Decide(int64_t need, int64_t free, int64_t reserve, int64_t room) const;
  void Hold(HeldReserve r) { held_.push_back(r); }
  // Drops a held reservation (the router cancelled it); false if none is held for it.
  bool Drop(uint64_t request_id);
  // The oldest held reservation when it fits now (`fits` true) or has waited wait_ms
  // (`fits` false: answer it as without waiting); removed from the queue. nullopt: none due.
  struct Due {
    HeldReserve reserve;
    bool fits = false;
  };
  std::optional<Due> Next(uint64_t now_ms, int64_t free, int64_t reserve);
  // Every held reservation, removed (draining).
  std::deque<HeldReserve> TakeAll();
  // The held reservations `pred` picks, removed (a lost router's).
  template <typename Pred>
  std::deque<HeldReserve> TakeIf(Pred pred) {
    std::deque<HeldReserve> out, keep;
    for (auto& r : held_) (pred(r) ? out : keep).push_back(r);
    held_.swap(keep);
    return out;
  }

  // Pages the lowest widths `floors` allow would free. Blocks committed within
  // [min_bits, max_bits] move (as in the planner); without a mean floor each goes to min_bits.
  // With min_mean_bits, the mean width may fall only to it: one-width steps are taken greedily
  // by pages freed per unit of mean width given up (a step over what is left is skipped, as the
  // planner skips it), which is about the most any lowering within the floors frees.
  static int64_t LowerablePages(const std::vector<LowerableBlock>& blocks, const LowerFloors& floors);
  static int64_t LowerablePages(const memory::WeightPageTable& table, const LowerFloors& floors);

 private:
  uint64_t wait_ms_;
  size_t max_waiting_;
  std::deque<HeldReserve> held_;
};

}  // namespace pw::workers
