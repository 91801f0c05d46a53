#include "services/transport/fault_transport.h"

namespace pw::transport {

FaultInjectingTransport::FaultInjectingTransport(std::unique_ptr<Transport> inner,
                                                 FaultConfig config, const Clock* clock)
    : inner_(std::move(inner)), config_(config), clock_(clock), rng_(config.seed) {}

Status FaultInjectingTransport::FlushDue() {
  const uint64_t now = clock_->NowMs();
  Status first;
  while (!held_.empty() && held_.front().due_ms <= now) {
    Held h = std::move(held_.front());
    held_.pop_front();
    Status st = inner_->Send(h.peer, h.bytes);
    if (st.ok()) ++counters_.sent;
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

Status FaultInjectingTransport::Send(std::string_view peer, std::string_view bytes) {
  PW_RETURN_IF_ERROR(FlushDue());
  if (config_.fail_after >= 0 && successful_sends_ >= config_.fail_after) {
    ++counters_.failed;
    return Unavailable("injected link failure after " + std::to_string(config_.fail_after) +
                       " sends");
  }
  ++successful_sends_;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  if (config_.drop_rate > 0 && u(rng_) < config_.drop_rate) {
    ++counters_.dropped;
    return Status::Ok();
  }
  std::string out(bytes);
  if (config_.corrupt_rate > 0 && u(rng_) < config_.corrupt_rate && !out.empty()) {
    ++counters_.corrupted;
    if (rng_() % 4 == 0) {
      out.resize(rng_() % out.size());  // truncation
    } else {
      size_t pos = rng_() % out.size();
      out[pos] = static_cast<char>(out[pos] ^ static_cast<char>(1 + rng_() % 255));
    }
  }
  if (config_.delay_ms > 0) {
    ++counters_.delayed;
    held_.push_back(Held{clock_->NowMs() + config_.delay_ms, std::string(peer), std::move(out)});
    return Status::Ok();
  }
  Status st = inner_->Send(peer, out);
  if (st.ok()) ++counters_.sent;
  return st;
}

Result<std::optional<Frame>> FaultInjectingTransport::Recv(int timeout_ms) {
  PW_RETURN_IF_ERROR(FlushDue());
  // With frames held, wake up often enough to release them near their due time.
  if (!held_.empty() && (timeout_ms < 0 || timeout_ms > 5)) timeout_ms = 5;
  auto r = inner_->Recv(timeout_ms);
  PW_RETURN_IF_ERROR(FlushDue());
  return r;
}

}  // namespace pw::transport
