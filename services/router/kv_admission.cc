#include "services/router/kv_admission.h"

#include <cmath>

namespace pw::router {

int64_t KvAdmission::BlocksFor(int64_t prompt, int64_t max_tokens, int32_t block_tokens) {
  if (block_tokens <= 0) return 0;
  const int64_t tokens = prompt + (max_tokens > 0 ? max_tokens : 0);
  return (tokens + block_tokens - 1) / block_tokens;
}

int64_t KvAdmission::queue_bound() const {
  return static_cast<int64_t>(std::floor(queue_factor_ * static_cast<double>(capacity_)));
}

KvAdmission::Verdict KvAdmission::Arrive(int64_t candidates, int64_t blocks) const {
  if (capacity_ <= 0 || blocks <= 0) return Verdict::kQueue;
  if (blocks > largest_) return Verdict::kTooLarge;
  if (queued_ > 0 && queued_ + candidates * blocks > queue_bound()) return Verdict::kBusy;
  return Verdict::kQueue;
}

bool KvAdmission::CanStart(int64_t blocks) const {
  return capacity_ <= 0 || committed_ <= 0 || committed_ + blocks <= capacity_;
}

}  // namespace pw::router
