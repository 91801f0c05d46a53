// PlaneMover: fills weight pages with bit-planes and LUTs from the broker's store, in the
// background (DESIGN.md 4: pages move asynchronously, commit at safe points).
//
// Owns one thread and one UCX endpoint to the broker's worker (used by that thread only). A
// job names one block's transition: for each part (plane or LUT) the store range to read and
// the pages it lands in. The thread gets every range with one-sided UCX gets, checks each
// part's checksum against the manifest (of the kind the manifest names: Options::checksum_kind),
// and turns a fetched fp16 LUT into the int8 LUT the fast-path kernels read (kernels/anyprec/q8.h),
// row tile by row tile, straight into its pages. Transfers are rate-limited (bytes per second)
// so decode keeps its share of the memory bus. Results come back through TakeDone(); the caller
// commits or aborts the block at its next iteration boundary (memory/weight_page_table.h).
//
// The pages of a submitted job belong to the mover until its result is taken. Cancel() ends
// the job in flight and fails every queued one (the broker is gone or the worker stops).
//
// Pacing: the background thread gives way to latency-critical work. While the mover is held
// (Hold/Release, counted; and, with Options::yield_to_fetches, during every synchronous
// FetchNow) it starts no new get: it waits before its next page or LUT until the last hold is
// released (or Options::max_held_us passed: then it posts that one get and waits again), so a
// synchronous fetch does not queue behind background gets at the broker nor share the cores
// and the worker's progress with them. A get already posted completes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "services/proto/part_checksum.h"
#include "services/transport/ucx.h"

namespace pw::workers {

struct MovePart {
  bool lut = false;           // false: a bit-plane, copied as is; true: an fp16 LUT
  int lut_bits = 0;
  int rows = 0;
  int tile_rows = 0;          // rows per page
  size_t row_bytes = 0;       // bytes of one row in a page (plane row, or 2^b int8 values)
  uint64_t remote_offset = 0; // the part's first byte in the broker's region
  uint64_t bytes = 0;         // the part's bytes in the store
  uint64_t checksum = 0;      // of those bytes, as PlaneMover::Options::checksum_kind (manifest)
  std::vector<uint8_t*> pages;
  float* scales = nullptr;    // LUT: rows fp32 scales written here
};

struct MoveJob {
  uint64_t id = 0;
  size_t block = 0;
  int target = 0;
  std::vector<MovePart> parts;
};

// Where one synchronous FetchNow(parts) spent its time.
struct FetchTimes {
  double get_s = 0;    // posting the gets and waiting for them (UCX)
  double check_s = 0;  // checksums and LUT quantization on arrival
  double table_s = 0;  // page-table work and job building around it (PagedWeights)
};

struct MoveResult {
  uint64_t id = 0;
  size_t block = 0;
  int target = 0;
  Status status;
  uint64_t bytes = 0;      // bytes read from the store
  uint64_t elapsed_us = 0; // submit to done
};

class PlaneMover {
 public:
  struct Options {
    uint64_t max_bytes_per_s = 0;  // 0 = unlimited
    int timeout_ms = 10000;        // per chunk of gets (get_chunk_bytes) or LUT get
    bool yield_to_fetches = true;  // the background thread waits while a FetchNow runs
    uint32_t max_held_us = 5000;   // a held background thread posts its next gets after this
    // A plane's pages are posted this many bytes at a time (at least one page) and waited for
    // together; a hold or the rate limit takes effect between such chunks. One get waited for
    // at a time, each wait ending in the endpoint's backoff sleep, moved 18 KiB pages at
    // 16 MB/s: 64 blocks of DeepSeek-V3's expert shape at 4 bits (726 MB) loaded in 43.9 s;
    // chunks of 1, 4 and 8 MiB took 4.6, 3.1 and 2.6 s (docs/benchmarks.md, "Loading experts
    // from the broker in chunks"). 4 MiB holds one such 4-bit plane.
    size_t get_chunk_bytes = size_t{4} << 20;
    // How every part's checksum is computed (the manifest's checksumKind; one the worker
    // accepts, services/proto/part_checksum.h).
    wire::ChecksumKind checksum_kind = proto::kPartChecksumKind;
  };
  // The background thread's pacing so far (it may read them while the mover runs).
  struct PacingStats {
    uint64_t waits = 0;     // chunks of gets the background thread held back
    uint64_t wait_us = 0;   // time it spent held
  };
  // Connects to the broker's UCX worker and opens its store region, twice (the background
  // thread's endpoint and the synchronous one), each endpoint on a worker of its own created
  // from `worker`'s context: a broker that dies mid-transfer takes only those down, and the
  // two waits never contend for one worker's lock.
  static Result<std::unique_ptr<PlaneMover>> Start(transport::ucx::Worker& worker,
                                                   const std::string& remote_address,
                                                   const std::string& rkey, uint64_t base,
                                                   uint64_t bytes, Options options);
  ~PlaneMover();
  PlaneMover(const PlaneMover&) = delete;
  PlaneMover& operator=(const PlaneMover&) = delete;

  void Submit(MoveJob job);
  std::vector<MoveResult> TakeDone();
  // Jobs submitted and not yet taken back.
  size_t outstanding() const;
  // Fails the job in flight and every queued one (their results still come back).
  void Cancel(const std::string& why);
  // Holds the background thread (see the file comment); every Hold needs its Release. Any
  // thread.
  void Hold();
  void Release();
  PacingStats pacing() const { return {pacing_waits_.load(), pacing_wait_us_.load()}; }
  // Synchronous fetch of one part on the calling thread (a second endpoint; for the
  // synchronous-miss path): fills `pages` and `scales` as a job would.
  Status FetchNow(const MovePart& part);
  // The same for several parts with every get posted at once and waited for together (one
  // round trip instead of one per page); each part's checksum is checked after they all
  // arrived. On error the pages may hold partial data.
  // `times` (optional) gains where the time went.
  Status FetchNow(std::span<const MovePart> parts, FetchTimes* times = nullptr);

 private:
  PlaneMover(Options options) : options_(options) {}
  void Loop();
  Status Run(const MoveJob& job, uint64_t* bytes);
  Status RunPart(transport::ucx::RemoteRegion& region, const MovePart& part,
                 std::vector<uint8_t>* staging, const std::atomic<bool>* cancel, uint64_t* bytes);
  // Mover thread: returns once no hold is left (or on cancel / stop).
  void WaitWhileHeld();

  Options options_;
  std::unique_ptr<transport::ucx::Endpoint> ep_;
  std::unique_ptr<transport::ucx::RemoteRegion> region_;
  std::unique_ptr<transport::ucx::Endpoint> sync_ep_;
  std::unique_ptr<transport::ucx::RemoteRegion> sync_region_;
  std::vector<uint8_t> sync_staging_;
  std::vector<std::vector<uint8_t>> sync_luts_;  // FetchNow(parts): one staging buffer per LUT

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<MoveJob, uint64_t>> queue_;  // job, submit time (us)
  std::vector<MoveResult> done_;
  size_t outstanding_ = 0;
  bool stop_ = false;
  std::atomic<bool> cancel_{false};
  std::atomic<int> holds_{0};
  std::atomic<bool> held_waiting_{false};  // the mover thread waits on held_cv_ (set under mu_)
  std::condition_variable held_cv_;
  std::atomic<uint64_t> pacing_waits_{0}, pacing_wait_us_{0};
  std::string cancel_why_;
  std::thread thread_;
  // Rate limit state (mover thread only).
  double budget_bytes_ = 0;
  uint64_t budget_at_us_ = 0;
};

}  // namespace pw::workers
