// PlaneMover's pacing over real UCX in one process (a "broker" worker owning a registered
// region of known bytes, a client worker the mover connects from): a held mover starts no get
// until the last hold is released; with yield_to_fetches its background thread is held while
// a synchronous FetchNow runs, and without it never. A byte that changed at the broker after
// the manifest's checksum was taken fails the fetch, with either checksum kind.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "services/transport/ucx.h"
#include "services/workers/weights/plane_mover.h"

namespace pw::workers {
namespace {

using transport::ucx::Context;
using transport::ucx::MemoryRegion;
using transport::ucx::Worker;

constexpr size_t kRowBytes = 128;
constexpr int kTileRows = 8;  // 1 KiB pages

class PlaneMoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = Context::Create().value();
    owner_ = Worker::Create(*ctx_).value();
    client_ = Worker::Create(*ctx_).value();
    owner_->StartProgressThread();
    client_->StartProgressThread();
    store_.resize(4 << 20);
    std::mt19937 rng(7);
    for (auto& b : store_) b = static_cast<uint8_t>(rng());
    region_ = MemoryRegion::Register(*ctx_, store_.data(), store_.size()).value();
  }
  void TearDown() override {
    mover_.reset();
    region_.reset();
    client_.reset();
    owner_.reset();
    ctx_.reset();
  }

  void Start(PlaneMover::Options o) {
    auto m = PlaneMover::Start(*client_, owner_->Address(), region_->PackedRkey(), region_->base(),
                               store_.size(), o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    mover_ = std::move(m).value();
  }

  // A plane part of `rows` rows from `offset`, landing in fresh zeroed pages kept in `pages`.
  MovePart Part(uint64_t offset, int rows, std::vector<std::vector<uint8_t>>* pages,
                wire::ChecksumKind kind = proto::kPartChecksumKind) {
    MovePart p;
    p.rows = rows;
    p.tile_rows = kTileRows;
    p.row_bytes = kRowBytes;
    p.remote_offset = offset;
    p.bytes = static_cast<uint64_t>(rows) * kRowBytes;
    p.checksum = proto::PartChecksumOf(kind, store_.data() + offset, p.bytes);
    for (int r = 0; r < rows; r += kTileRows) {
      pages->emplace_back(kTileRows * kRowBytes, 0);
      p.pages.push_back(pages->back().data());
    }
    return p;
  }
  // Job 1: one part of `rows` rows at `offset`, its pages appended to *pages.
  MoveJob OnePartJob(uint64_t offset, int rows, std::vector<std::vector<uint8_t>>* pages) {
    MoveJob job;
    job.id = 1;
    job.parts.push_back(Part(offset, rows, pages));
    return job;
  }
  bool Holds(const std::vector<std::vector<uint8_t>>& pages, uint64_t offset) const {
    for (size_t k = 0; k < pages.size(); ++k) {
      if (std::memcmp(pages[k].data(), store_.data() + offset + k * pages[k].size(), pages[k].size()) != 0) return false;
    }
    return true;
  }
  std::vector<MoveResult> WaitDone(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    std::vector<MoveResult> done;
    while (done.empty() && std::chrono::steady_clock::now() < until) {
      done = mover_->TakeDone();
      if (done.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return done;
  }

  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Worker> owner_, client_;
  std::vector<uint8_t> store_;
  std::unique_ptr<MemoryRegion> region_;
  std::unique_ptr<PlaneMover> mover_;
};

TEST_F(PlaneMoverTest, AHeldMoverStartsNoGetUntilTheLastHoldIsReleased) {
  PlaneMover::Options o;
  o.max_held_us = 60'000'000;
  Start(o);
  std::vector<std::vector<uint8_t>> pages;
  MoveJob job = OnePartJob(4096, 64, &pages);
  mover_->Hold();
  mover_->Hold();  // counted: two holders
  mover_->Submit(job);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(mover_->TakeDone().empty());
  EXPECT_EQ(mover_->outstanding(), 1u);
  for (const auto& p : pages) {
    for (uint8_t b : p) ASSERT_EQ(b, 0) << "a page was written while the mover was held";
  }
  mover_->Release();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(mover_->TakeDone().empty()) << "one hold is left";
  mover_->Release();
  auto done = WaitDone(std::chrono::seconds(10));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status.ToString();
  EXPECT_TRUE(Holds(pages, 4096));
  EXPECT_EQ(mover_->pacing().waits, 1u);
  EXPECT_GE(mover_->pacing().wait_us, 250000u);
}

TEST_F(PlaneMoverTest, AHoldThatNeverEndsSlowsTheMoverButDoesNotStopIt) {
  // One bounded wait before each chunk of gets: chunks of one page (4 waits), of two pages
  // (2), of every page (1: the default chunk holds a whole 4 KiB plane).
  for (const auto& [chunk_bytes, waits] : {std::pair<size_t, uint64_t>{1, 4}, {2048, 2}, {size_t{1} << 20, 1}}) {
    SCOPED_TRACE(chunk_bytes);
    PlaneMover::Options o;
    o.max_held_us = 20'000;
    o.get_chunk_bytes = chunk_bytes;
    Start(o);
    std::vector<std::vector<uint8_t>> pages;
    MoveJob job = OnePartJob(8192, 4 * kTileRows, &pages);  // 4 pages of 1 KiB
    mover_->Hold();
    const auto t0 = std::chrono::steady_clock::now();
    mover_->Submit(job);
    auto done = WaitDone(std::chrono::seconds(20));
    const auto took = std::chrono::steady_clock::now() - t0;
    ASSERT_EQ(done.size(), 1u);
    EXPECT_TRUE(done[0].status.ok()) << done[0].status.ToString();
    EXPECT_TRUE(Holds(pages, 8192));
    EXPECT_EQ(mover_->pacing().waits, waits);
    EXPECT_GE(took, std::chrono::milliseconds(static_cast<int>(waits) * 20));
    mover_->Release();
    mover_.reset();
  }
}

TEST_F(PlaneMoverTest, CancelEndsAHeldWait) {
  PlaneMover::Options o;
  o.max_held_us = 60'000'000;
  Start(o);
  std::vector<std::vector<uint8_t>> pages;
  MoveJob job = OnePartJob(0, 16, &pages);
  mover_->Hold();
  mover_->Submit(job);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  mover_->Cancel("test");
  auto done = WaitDone(std::chrono::seconds(10));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), StatusCode::kCancelled) << done[0].status.ToString();
  mover_->Release();
}

// A background job slowed by the rate limit (1 KiB pages at 4 MB/s) runs while the caller
// fetches synchronously; yield_to_fetches decides whether the background thread is held
// meanwhile. Its pages go one per chunk of gets, so the hold is checked before each (at the
// default 4 MiB the whole 600 KiB plane is one chunk: one check, at its start).
TEST_F(PlaneMoverTest, SynchronousFetchesHoldTheBackgroundThreadOnlyWhenAsked) {
  for (bool yield : {true, false}) {
    SCOPED_TRACE(yield ? "yield_to_fetches" : "free");
    PlaneMover::Options o;
    o.yield_to_fetches = yield;
    o.max_bytes_per_s = 4'000'000;
    o.get_chunk_bytes = 1;
    Start(o);
    std::vector<std::vector<uint8_t>> bg_pages, fg_pages;
    MoveJob job = OnePartJob(1 << 20, 8 * 600, &bg_pages);  // 600 pages, ~0.15 s
    mover_->Submit(job);
    // Synchronous fetches (several parts at once, as a residency fetch does) until the
    // background thread was seen held, or the job is done.
    int fetches = 0;
    std::vector<MoveResult> done;
    while (done.empty()) {
      fg_pages.clear();
      std::vector<MovePart> parts{Part(0, 64, &fg_pages), Part(65536, 32, &fg_pages)};
      FetchTimes times;
      Status st = mover_->FetchNow(parts, &times);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_TRUE(Holds({fg_pages.begin(), fg_pages.begin() + 8}, 0));
      EXPECT_GT(times.get_s, 0.0);
      EXPECT_GT(times.check_s, 0.0);
      ++fetches;
      if (yield && mover_->pacing().waits > 0) break;
      done = mover_->TakeDone();
    }
    if (done.empty()) done = WaitDone(std::chrono::seconds(20));
    ASSERT_EQ(done.size(), 1u);
    EXPECT_TRUE(done[0].status.ok()) << done[0].status.ToString();
    EXPECT_TRUE(Holds(bg_pages, 1 << 20));
    if (yield) {
      EXPECT_GT(mover_->pacing().waits, 0u) << "after " << fetches << " fetches";
    } else {
      EXPECT_EQ(mover_->pacing().waits, 0u) << "after " << fetches << " fetches";
      EXPECT_GT(fetches, 10);
    }
    mover_.reset();
  }
}

// The checksum each part carries is checked on arrival: a byte flipped at the broker after the
// checksum was taken fails the fetch (synchronous and background), with CRC-32C (this build's
// brokers) and with FNV-1a 64 (a protocol 1.0 broker's manifest, still read).
TEST_F(PlaneMoverTest, AByteChangedAtTheBrokerFailsItsPartsChecksum) {
  for (wire::ChecksumKind kind : {wire::ChecksumKind::CRC32C, wire::ChecksumKind::FNV1A64}) {
    SCOPED_TRACE(proto::PartChecksumName(kind));
    PlaneMover::Options o;
    o.checksum_kind = kind;
    Start(o);
    std::vector<std::vector<uint8_t>> pages;
    std::vector<MovePart> good{Part(8192, 40, &pages, kind)};
    ASSERT_TRUE(mover_->FetchNow(good).ok());
    ASSERT_TRUE(Holds(pages, 8192));
    // The part's first byte, one inside its fourth page, its last byte.
    const size_t last = 8192 + 40 * kRowBytes - 1;
    for (size_t at : {size_t{8192}, size_t{8192 + 3 * 1024 + 517}, last}) {
      SCOPED_TRACE("byte " + std::to_string(at));
      pages.clear();
      std::vector<MovePart> parts{Part(8192, 40, &pages, kind)};
      store_[at] ^= 0x10;
      Status st = mover_->FetchNow(parts);
      EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
      EXPECT_NE(st.message().find("checksum mismatch"), std::string::npos) << st.ToString();
      std::vector<std::vector<uint8_t>> bg_pages;
      MoveJob job;
      job.id = 2;
      job.parts.push_back(parts[0]);
      job.parts[0].pages.clear();
      for (int r = 0; r < 40; r += kTileRows) {
        bg_pages.emplace_back(kTileRows * kRowBytes, 0);
        job.parts[0].pages.push_back(bg_pages.back().data());
      }
      mover_->Submit(job);
      auto done = WaitDone(std::chrono::seconds(20));
      ASSERT_EQ(done.size(), 1u);
      EXPECT_EQ(done[0].status.code(), StatusCode::kCorrupt) << done[0].status.ToString();
      store_[at] ^= 0x10;
    }
    mover_.reset();
  }
}

}  // namespace
}  // namespace pw::workers
