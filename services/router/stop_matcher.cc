#include "services/router/stop_matcher.h"

#include <algorithm>

namespace pw::router {

std::string StopMatcher::Push(std::string_view text) {
  if (stopped_) return "";
  pending_.append(text);
  if (stops_.empty()) {
    std::string out;
    out.swap(pending_);
    return out;
  }
  // The match that completes first (generation stops there); among matches ending at the same
  // byte, the one that starts first.
  size_t cut = std::string::npos, cut_end = std::string::npos;
  for (const auto& s : stops_) {
    size_t pos = pending_.find(s);
    if (pos == std::string::npos) continue;
    size_t end = pos + s.size();
    if (end < cut_end || (end == cut_end && pos < cut)) {
      cut = pos;
      cut_end = end;
    }
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, cut);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix of pending_ that is a proper prefix of a stop sequence.
  size_t hold = 0;
  for (const auto& s : stops_) {
    size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) ==
          std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::Flush() {
  if (stopped_) return "";
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace pw::router
