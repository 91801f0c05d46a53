#include "policies/placement/placement.h"

#include <string>
#include <tuple>

namespace pw::placement {

std::optional<Choice> Place(std::span<const DecodeCandidate> decode,
                            std::span<const PrefillCandidate> prefill,
                            int64_t same_node_slack_tokens) {
  std::optional<size_t> best_d;
  std::tuple<bool, int64_t, int64_t> best_d_key{false, 0, 0};
  for (size_t i = 0; i < decode.size(); ++i) {
    const DecodeCandidate& c = decode[i];
    if (c.draining || !c.reachable || c.assigned >= c.max_assigned) continue;
    const std::tuple<bool, int64_t, int64_t> key{!c.failed_before,
                                                 c.free_kv_blocks - c.recent_blocks, -c.assigned};
    if (!best_d || key > best_d_key) {
      best_d_key = key;
      best_d = i;
    }
  }
  if (!best_d) return std::nullopt;
  const uint64_t layout = decode[*best_d].layout_hash;
  const std::string& node = decode[*best_d].node;
  auto eligible = [&](const PrefillCandidate& c) {
    return !c.draining && c.reachable && c.layout_hash == layout;
  };
  std::optional<int64_t> shortest;
  for (const PrefillCandidate& c : prefill) {
    if (eligible(c) && (!shortest || c.queued_tokens < *shortest)) shortest = c.queued_tokens;
  }
  std::optional<size_t> best_p;
  std::tuple<bool, bool, bool, int64_t> best_p_key{false, false, false, 0};
  for (size_t i = 0; i < prefill.size(); ++i) {
    const PrefillCandidate& c = prefill[i];
    if (!eligible(c)) continue;
    const bool near = !node.empty() && c.node == node &&
                      c.queued_tokens - *shortest <= same_node_slack_tokens;
    const std::tuple<bool, bool, bool, int64_t> key{c.failed_before, !c.group_peer, !near,
                                                    c.queued_tokens};
    if (!best_p || key < best_p_key) {
      best_p_key = key;
      best_p = i;
    }
  }
  if (!best_p) return std::nullopt;
  return Choice{*best_d, *best_p};
}

}  // namespace pw::placement
