#include "services/workers/weights/plane_mover.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kernels/anyprec/q8.h"

namespace pw::workers {
namespace {

uint64_t NowUs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

Result<std::unique_ptr<PlaneMover>> PlaneMover::Start(transport::ucx::Worker& worker,
                                                      const std::string& remote_address,
                                                      const std::string& rkey, uint64_t base,
                                                      uint64_t bytes, Options options) {
  std::unique_ptr<PlaneMover> m(new PlaneMover(options));
  using transport::ucx::Endpoint;
  PW_ASSIGN_OR_RETURN(m->ep_, Endpoint::ConnectOnOwnWorker(worker.context(), remote_address,
                                                             Endpoint::ErrorMode::kNone));
  // The background thread's waits sleep after a short spin: spinning, it would hold a core the
  // decode step (and its synchronous fetches on sync_ep_, which keep spinning) needs.
  m->ep_->SetWaitBackoff(/*spins=*/16, /*sleep_us=*/200);
  PW_ASSIGN_OR_RETURN(m->region_, m->ep_->OpenRegion(rkey, base, bytes));
  PW_ASSIGN_OR_RETURN(m->sync_ep_, Endpoint::ConnectOnOwnWorker(worker.context(), remote_address,
                                                             Endpoint::ErrorMode::kNone));
  PW_ASSIGN_OR_RETURN(m->sync_region_, m->sync_ep_->OpenRegion(rkey, base, bytes));
  m->thread_ = std::thread([p = m.get()] { p->Loop(); });
  return m;
}

PlaneMover::~PlaneMover() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    cancel_ = true;
  }
  cv_.notify_all();
  held_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  region_.reset();
  ep_.reset();
  sync_region_.reset();
  sync_ep_.reset();
}

void PlaneMover::Submit(MoveJob job) {
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.emplace_back(std::move(job), NowUs());
    ++outstanding_;
  }
  cv_.notify_all();
}

std::vector<MoveResult> PlaneMover::TakeDone() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<MoveResult> out;
  out.swap(done_);
  outstanding_ -= out.size();
  return out;
}

size_t PlaneMover::outstanding() const {
  std::lock_guard<std::mutex> l(mu_);
  return outstanding_;
}

void PlaneMover::Cancel(const std::string& why) {
  {
    std::lock_guard<std::mutex> l(mu_);
    cancel_ = true;
    cancel_why_ = why;
    for (auto& [job, t0] : queue_) {
      done_.push_back({job.id, job.block, job.target, Cancelled("plane transfer cancelled: " + why), 0,
                       NowUs() - t0});
    }
    queue_.clear();
  }
  cv_.notify_all();
  held_cv_.notify_all();
}

void PlaneMover::Hold() { holds_.fetch_add(1); }

void PlaneMover::Release() {
  const int before = holds_.fetch_sub(1);
  PW_CHECK(before > 0);
  // Only a waiting mover thread is woken, so a release on the fetch path costs no lock and no
  // wake-up otherwise. (The waiter sets held_waiting_ before it reads holds_, this reads
  // held_waiting_ after it wrote holds_: one of the two sees the other; taking mu_ before the
  // notify means the waiter is either still to test holds_ or already asleep.)
  if (before == 1 && held_waiting_.load()) {
    { std::lock_guard<std::mutex> l(mu_); }
    held_cv_.notify_one();
  }
}

void PlaneMover::WaitWhileHeld() {
  if (holds_.load() == 0) return;
  const uint64_t t0 = NowUs();
  {
    std::unique_lock<std::mutex> l(mu_);
    held_waiting_.store(true);
    // Bounded: width changes keep moving (slowly) when the holds never end, e.g. back-to-back
    // steps under kSteps.
    held_cv_.wait_for(l, std::chrono::microseconds(options_.max_held_us),
                      [this] { return holds_.load() == 0 || stop_ || cancel_.load(); });
    held_waiting_.store(false);
  }
  pacing_waits_.fetch_add(1);
  pacing_wait_us_.fetch_add(NowUs() - t0);
}

void PlaneMover::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
    if (stop_) break;
    auto [job, t0] = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    uint64_t bytes = 0;
    Status st = cancel_.load() ? Cancelled("plane transfer cancelled") : Run(job, &bytes);
    l.lock();
    done_.push_back({job.id, job.block, job.target, std::move(st), bytes, NowUs() - t0});
  }
  // Whatever is still queued fails (the caller takes the results back).
  for (auto& [job, t0] : queue_) {
    done_.push_back({job.id, job.block, job.target, Cancelled("plane mover stopped"), 0, NowUs() - t0});
  }
  queue_.clear();
}

Status PlaneMover::Run(const MoveJob& job, uint64_t* bytes) {
  std::vector<uint8_t> staging;
  for (const MovePart& part : job.parts) {
    PW_RETURN_IF_ERROR(RunPart(*region_, part, &staging, &cancel_, bytes));
  }
  return Status::Ok();
}

namespace {
// Holds `m`'s background thread for a synchronous fetch when its options ask for it.
class FetchHold {
 public:
  FetchHold(PlaneMover* m, bool on) : m_(on ? m : nullptr) {
    if (m_) m_->Hold();
  }
  ~FetchHold() {
    if (m_) m_->Release();
  }
  FetchHold(const FetchHold&) = delete;
  FetchHold& operator=(const FetchHold&) = delete;

 private:
  PlaneMover* m_;
};
}  // namespace

Status PlaneMover::FetchNow(const MovePart& part) {
  FetchHold hold(this, options_.yield_to_fetches);
  uint64_t bytes = 0;
  return RunPart(*sync_region_, part, &sync_staging_, nullptr, &bytes);
}

Status PlaneMover::RunPart(transport::ucx::RemoteRegion& region, const MovePart& part,
                           std::vector<uint8_t>* staging, const std::atomic<bool>* cancel,
                           uint64_t* bytes) {
  auto throttle = [&](uint64_t n) {
    if (options_.max_bytes_per_s == 0 || cancel == nullptr) return;
    const uint64_t now = NowUs();
    const double rate = static_cast<double>(options_.max_bytes_per_s);
    budget_bytes_ = std::min(rate * 0.05, budget_bytes_ + rate * static_cast<double>(now - budget_at_us_) * 1e-6);
    budget_at_us_ = now;
    budget_bytes_ -= static_cast<double>(n);
    if (budget_bytes_ < 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<uint64_t>(-budget_bytes_ / rate * 1e6)));
    }
  };
  proto::PartChecksum h(options_.checksum_kind);
  if (!part.lut) {
    // A plane: row tiles straight into the pages, posted options_.get_chunk_bytes at a time and
    // waited for together; a hold or the pacing takes effect between chunks.
    std::vector<transport::ucx::RemoteRegion::GetSegment> segs;
    uint64_t off = 0;
    size_t k = 0;
    while (k < part.pages.size()) {
      segs.clear();
      size_t chunk = 0;
      for (; k < part.pages.size() && (segs.empty() || chunk < options_.get_chunk_bytes); ++k) {
        const int r0 = static_cast<int>(k) * part.tile_rows;
        const int n = std::min(part.tile_rows, part.rows - r0);
        const size_t len = static_cast<size_t>(n) * part.row_bytes;
        if (off + len > part.bytes) return Corrupt("plane transfer: pages overrun the part");
        segs.push_back({part.remote_offset + off, part.pages[k], len});
        off += len;
        chunk += len;
      }
      if (cancel != nullptr) WaitWhileHeld();
      PW_RETURN_IF_ERROR(region.GetAll(segs, options_.timeout_ms, cancel));
      for (const auto& seg : segs) h.Update(seg.local, seg.bytes);
      *bytes += chunk;
      throttle(chunk);
    }
    if (off != part.bytes) return Corrupt("plane transfer: pages cover " + std::to_string(off) + " of " + std::to_string(part.bytes) + " bytes");
  } else {
    // A LUT: the fp16 centroids into staging, checked, then quantized tile by tile.
    staging->resize(part.bytes);
    if (cancel != nullptr) WaitWhileHeld();
    PW_RETURN_IF_ERROR(region.Get(part.remote_offset, staging->data(), part.bytes, options_.timeout_ms, cancel));
    h.Update(staging->data(), part.bytes);
    *bytes += part.bytes;
    throttle(part.bytes);
  }
  if (h.digest() != part.checksum) {
    return Corrupt(std::string("plane transfer: checksum mismatch on arrival (") +
                   (part.lut ? "LUT " + std::to_string(part.lut_bits) + " bits" : "plane") + ")");
  }
  if (part.lut) {
    const auto* lut = reinterpret_cast<const uint16_t*>(staging->data());
    for (size_t k = 0; k < part.pages.size(); ++k) {
      const int r0 = static_cast<int>(k) * part.tile_rows;
      const int n = std::min(part.tile_rows, part.rows - r0);
      PW_RETURN_IF_ERROR(anyprec::QuantizeLut(lut + (static_cast<size_t>(r0) << part.lut_bits), n,
                                              part.lut_bits, reinterpret_cast<int8_t*>(part.pages[k]),
                                              part.scales + r0));
    }
  }
  return Status::Ok();
}

Status PlaneMover::FetchNow(std::span<const MovePart> parts, FetchTimes* times) {
  FetchHold hold(this, options_.yield_to_fetches);
  std::vector<transport::ucx::RemoteRegion::GetSegment> segs;
  size_t luts = 0;
  for (const MovePart& part : parts) luts += part.lut ? 1 : 0;
  if (sync_luts_.size() < luts) sync_luts_.resize(luts);
  size_t lut = 0;
  for (const MovePart& part : parts) {
    if (part.lut) {
      sync_luts_[lut].resize(part.bytes);
      segs.push_back({part.remote_offset, sync_luts_[lut++].data(), part.bytes});
      continue;
    }
    uint64_t off = 0;
    for (size_t k = 0; k < part.pages.size(); ++k) {
      const int n = std::min(part.tile_rows, part.rows - static_cast<int>(k) * part.tile_rows);
      const size_t len = static_cast<size_t>(n) * part.row_bytes;
      if (off + len > part.bytes) return Corrupt("plane transfer: pages overrun the part");
      segs.push_back({part.remote_offset + off, part.pages[k], len});
      off += len;
    }
    if (off != part.bytes) return Corrupt("plane transfer: pages cover " + std::to_string(off) + " of " + std::to_string(part.bytes) + " bytes");
  }
  const auto t_get = std::chrono::steady_clock::now();
  PW_RETURN_IF_ERROR(sync_region_->GetAll(segs, options_.timeout_ms));
  const auto t_check = std::chrono::steady_clock::now();
  if (times != nullptr) times->get_s += std::chrono::duration<double>(t_check - t_get).count();
  struct AddCheck {
    FetchTimes* times;
    std::chrono::steady_clock::time_point t0;
    ~AddCheck() {
      if (times != nullptr) times->check_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  } add_check{times, t_check};
  size_t seg = 0;
  lut = 0;
  for (const MovePart& part : parts) {
    proto::PartChecksum h(options_.checksum_kind);
    const uint8_t* staged = nullptr;
    if (part.lut) {
      staged = sync_luts_[lut++].data();
      h.Update(staged, part.bytes);
      ++seg;
    } else {
      for (size_t k = 0; k < part.pages.size(); ++k, ++seg) h.Update(part.pages[k], segs[seg].bytes);
    }
    if (h.digest() != part.checksum) {
      return Corrupt(std::string("plane transfer: checksum mismatch on arrival (") +
                     (part.lut ? "LUT " + std::to_string(part.lut_bits) + " bits" : "plane") + ")");
    }
    if (!part.lut) continue;
    const auto* values = reinterpret_cast<const uint16_t*>(staged);
    for (size_t k = 0; k < part.pages.size(); ++k) {
      const int r0 = static_cast<int>(k) * part.tile_rows;
      const int n = std::min(part.tile_rows, part.rows - r0);
      PW_RETURN_IF_ERROR(anyprec::QuantizeLut(values + (static_cast<size_t>(r0) << part.lut_bits), n,
                                              part.lut_bits, reinterpret_cast<int8_t*>(part.pages[k]),
                                              part.scales + r0));
    }
  }
  return Status::Ok();
}

}  // namespace pw::workers
