// ClusterBackend (the router's side of the worker protocol) against ProtocolTestWorker: a test
// worker that speaks the real control plane (ZeroMQ + Cap'n Proto, registration, heartbeats)
// but computes tokens with a toy rule instead of a model. The rule makes the next token a
// function of the whole sequence, like greedy decoding, so a request moved to another worker
// after a failure must continue with exactly the tokens it would have had.
#include "services/router/cluster_backend.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "services/transport/zmq_transport.h"

namespace pw::router {
namespace {

// The toy "model": next token of a sequence.
uint32_t NextToken(const std::vector<uint32_t>& seq) {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t t : seq) h = (h ^ t) * 1099511628211ull;
  return static_cast<uint32_t>(10 + h % 900);
}

std::vector<int32_t> Reference(std::vector<int32_t> prompt, int n) {
  std::vector<uint32_t> seq(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    uint32_t t = NextToken(seq);
    seq.push_back(t);
    out.push_back(static_cast<int32_t>(t));
  }
  return out;
}

class ProtocolTestWorker {
 public:
  struct Stats {
    int reserves = 0, prefills = 0, starts = 0, cancels = 0;
  };
  ProtocolTestWorker(const std::string& endpoint, const std::string& id, wire::Role role,
                     uint32_t blocks = 64, uint32_t step_ms = 3)
      : role_(role), total_blocks_(blocks), free_blocks_(blocks), step_ms_(step_ms) {
    auto t = transport::ZmqDealerTransport::Connect(endpoint, id);
    EXPECT_TRUE(t.ok());
    transport::ControlClient::Options o;
    o.id = id;
    o.role = role;
    o.heartbeat_ms = 100;
    client_ =
        std::make_unique<transport::ControlClient>(std::move(*t), transport::SteadyClock::Get(), o);
    client_->fill_register = [this](wire::Register::Builder r) {
      r.setModelName("tiny-moe");
      r.setMaxBatch(16);
      r.setMaxContext(2048);
      auto l = r.initKvLayout();
      l.setNumBlocks(total_blocks_);
      l.setBlockTokens(16);
      l.setLayoutHash(42);
      auto mem = r.initKvMemory();
      mem.setWorkerAddress(proto::AsData("worker-address"));
      mem.setRkey(proto::AsData("rkey"));
      mem.setBaseAddr(0x10000);
      mem.setBytes(uint64_t{total_blocks_} * 4096);
    };
    client_->fill_heartbeat = [this](wire::Heartbeat::Builder h) {
      std::lock_guard<std::mutex> lock(mu_);
      h.setFreeKvBlocks(free_blocks_);
      h.setUsedKvBlocks(total_blocks_ - free_blocks_);
      h.setRunningRequests(static_cast<uint32_t>(running_.size()));
    };
    EXPECT_TRUE(client_->Start().ok());
    thread_ = std::thread([this] { Run(); });
  }
  ~ProtocolTestWorker() { Kill(); }

  // Stops at once without a word, as SIGKILL would.
  void Kill() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // While set, a prefill worker ignores PrefillRequests (to kill it mid-prefill).
  void SetStall(bool s) { stall_ = s; }
  // While set, a decode worker refuses reservations (no free KV).
  void SetRefuseKv(bool r) { refuse_kv_ = r; }
  bool registered() const { return registered_; }
  Stats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  uint32_t free_blocks() {
    std::lock_guard<std::mutex> lock(mu_);
    return free_blocks_;
  }
  size_t running() {
    std::lock_guard<std::mutex> lock(mu_);
    return running_.size();
  }

 private:
  struct Running {
    std::vector<uint32_t> seq;
    uint32_t generated = 0;
    uint32_t max_tokens = 0;
    std::set<uint32_t> stops;
  };

  void Run() {
    auto handler = [this](const std::string&, const proto::InMessage& m) { return Handle(m); };
    auto next_step = std::chrono::steady_clock::now();
    while (!stop_) {
      client_->Poll(1, handler);
      registered_ = client_->registered();
      if (std::chrono::steady_clock::now() >= next_step) {
        next_step += std::chrono::milliseconds(step_ms_);
        Step();
      }
    }
  }

  uint32_t BlocksFor(uint32_t tokens) { return tokens / 16 + 1; }

  Status Handle(const proto::InMessage& m) {
    std::lock_guard<std::mutex> lock(mu_);
    auto body = m.body();
    switch (m.which()) {
      case proto::Body::KV_RESERVE: {
        auto r = body.getKvReserve();
        ++stats_.reserves;
        proto::OutMessage out;
        auto rep = out.body().initKvReserveReply();
        rep.setRequestId(r.getRequestId());
        uint32_t need = BlocksFor(r.getNumTokens());
        if (refuse_kv_ || need > free_blocks_) {
          rep.setOk(false);
          rep.setError("no free KV blocks");
        } else {
          free_blocks_ -= need;
          uint64_t lease = next_lease_++;
          leases_[r.getRequestId()] = {lease, need};
          rep.setOk(true);
          rep.setLeaseId(lease);
          auto ids = rep.initBlockIds(need);
          for (uint32_t i = 0; i < need; ++i) ids.set(i, i);
        }
        return client_->Send(out);
      }
      case proto::Body::PREFILL_REQUEST: {
        ++stats_.prefills;
        if (stall_) return Status::Ok();
        auto p = body.getPrefillRequest();
        auto toks = proto::ToVector<uint32_t>(p.getTokens());
        proto::OutMessage out;
        auto kr = out.body().initKvReady();
        kr.setRequestId(p.getRequestId());
        // The request must carry the decode worker's registered KV pool and layout.
        const bool target_ok =
            proto::ToBytes(p.getDecodeMemory().getRkey()) == "rkey" &&
            proto::ToBytes(p.getDecodeMemory().getWorkerAddress()) == "worker-address" &&
            p.getDecodeMemory().getBaseAddr() == 0x10000 &&
            p.getDecodeLayout().getLayoutHash() == 42 &&
            p.getDecodeLayout().getBlockTokens() == 16 &&
            p.getBlockIds().size() == BlocksFor(toks.size());
        kr.setOk(target_ok);
        if (!target_ok) kr.setError("PrefillRequest without the decode worker's KV target");
        kr.setFirstToken(NextToken(toks));
        kr.setNumTokens(static_cast<uint32_t>(toks.size()));
        kr.setLeaseId(p.getLeaseId());
        kr.setDecodeWorkerId(p.getDecodeWorkerId());
        return client_->Send(out);
      }
      case proto::Body::START_DECODE: {
        ++stats_.starts;
        auto s = body.getStartDecode();
        Running r;
        r.seq = proto::ToVector<uint32_t>(s.getTokens());
        r.seq.push_back(s.getFirstToken());
        r.generated = s.getGeneratedSoFar();
        r.max_tokens = s.getSampling().getMaxTokens();
        for (uint32_t t : s.getSampling().getStopTokenIds()) r.stops.insert(t);
        running_[s.getRequestId()] = std::move(r);
        return Status::Ok();
      }
      case proto::Body::CANCEL: {
        ++stats_.cancels;
        uint64_t id = body.getCancel().getRequestId();
        Free(id);
        running_.erase(id);
        return Status::Ok();
      }
      default:
        return Status::Ok();
    }
  }

  void Free(uint64_t id) {
    auto it = leases_.find(id);
    if (it == leases_.end()) return;
    free_blocks_ += it->second.second;
    leases_.erase(it);
  }

  void Step() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<uint64_t> done;
    for (auto& [id, r] : running_) {
      uint32_t t = NextToken(r.seq);
      r.seq.push_back(t);
      proto::OutMessage out;
      auto c = out.body().initTokenChunk();
      c.setRequestId(id);
      c.setStartIndex(r.generated);
      c.initTokens(1).set(0, t);
      (void)client_->Send(out);
      ++r.generated;
      bool stop = r.stops.count(t) != 0;
      if (stop || r.generated >= r.max_tokens) {
        proto::OutMessage f;
        auto fin = f.body().initFinish();
        fin.setRequestId(id);
        fin.setReason(stop ? wire::FinishReason::STOP : wire::FinishReason::LENGTH);
        fin.setNumGenerated(r.generated);
        (void)client_->Send(f);
        done.push_back(id);
      }
    }
    for (uint64_t id : done) {
      running_.erase(id);
      Free(id);
    }
  }

  wire::Role role_;
  uint32_t total_blocks_;
  uint32_t free_blocks_;
  uint32_t step_ms_;
  std::unique_ptr<transport::ControlClient> client_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, stall_{false}, refuse_kv_{false}, registered_{false};
  std::mutex mu_;
  Stats stats_;
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> leases_;  // request -> (lease, blocks)
  std::map<uint64_t, Running> running_;
  uint64_t next_lease_ = 1;
};

// Collects events; checks indices are contiguous (no gap, no repeat reaches the router).
class Collector final : public GenerationEvents {
 public:
  void OnTokens(uint64_t id, uint32_t start, std::vector<int32_t> tokens) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& v = tokens_[id];
    if (start != v.size()) {
      ADD_FAILURE() << "request " << id << ": tokens at index " << start << ", expected "
                    << v.size();
      violations_.push_back(id);
    }
    v.insert(v.end(), tokens.begin(), tokens.end());
    cv_.notify_all();
  }
  void OnFinished(uint64_t id, FinishReason reason, Status error) override {
    std::lock_guard<std::mutex> lock(mu_);
    finished_[id] = {reason, error};
    cv_.notify_all();
  }
  bool WaitFinished(uint64_t id, int timeout_ms = 10000) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                        [&] { return finished_.count(id) != 0; });
  }
  bool WaitTokens(uint64_t id, size_t n, int timeout_ms = 10000) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                        [&] { return tokens_[id].size() >= n; });
  }
  std::vector<int32_t> tokens(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_[id];
  }
  std::pair<FinishReason, Status> finish(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_[id];
  }
  std::vector<uint64_t> violations() {
    std::lock_guard<std::mutex> lock(mu_);
    return violations_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::vector<int32_t>> tokens_;
  std::map<uint64_t, std::pair<FinishReason, Status>> finished_;
  std::vector<uint64_t> violations_;
};

class ClusterBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterBackendOptions o;
    o.bind = "tcp://127.0.0.1:0";
    o.model_name = "tiny-moe";
    o.heartbeat_ms = 100;
    auto b = ClusterBackend::Create(o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(*b);
    backend_->SetEvents(&events_);
    backend_->Start();
  }
  void TearDown() override {
    backend_->Stop();
    workers_.clear();
  }
  ProtocolTestWorker* AddWorker(const std::string& id, wire::Role role, uint32_t blocks = 64) {
    workers_.push_back(
        std::make_unique<ProtocolTestWorker>(backend_->endpoint(), id, role, blocks));
    return workers_.back().get();
  }
  bool WaitCapacity(int decode, int prefill) {
    for (int i = 0; i < 1000; ++i) {
      BackendLoad l = backend_->Load();
      if (l.decode_workers == decode && l.prefill_workers == prefill && l.capacity > 0 &&
          l.free_kv_blocks > 0) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  GenerationRequest Request(uint64_t id, int max_tokens, std::vector<int32_t> prompt = {5, 6, 7}) {
    GenerationRequest r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    return r;
  }

  Collector events_;
  std::unique_ptr<ClusterBackend> backend_;
  std::vector<std::unique_ptr<ProtocolTestWorker>> workers_;
};

TEST_F(ClusterBackendTest, RequestFlowsThroughPrefillAndDecode) {
  auto* p = AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 1));
  EXPECT_EQ(backend_->Load().capacity, 16);
  ASSERT_TRUE(backend_->Submit(Request(1, 12)).ok());
  ASSERT_TRUE(events_.WaitFinished(1));
  EXPECT_EQ(events_.finish(1).first, FinishReason::kLength);
  EXPECT_EQ(events_.tokens(1), Reference({5, 6, 7}, 12));
  EXPECT_TRUE(events_.violations().empty());
  EXPECT_EQ(p->stats().prefills, 1);
  EXPECT_EQ(d->stats().starts, 1);
  EXPECT_EQ(d->free_blocks(), 64u);
}

TEST_F(ClusterBackendTest, ManyRequestsOverOneRegistration) {
  // Every placement uses the decode worker's registration; hundreds of them must work.
  AddWorker("prefill-0", wire::Role::PREFILL);
  AddWorker("decode-0", wire::Role::DECODE, 1024);
  ASSERT_TRUE(WaitCapacity(1, 1));
  for (uint64_t id = 1; id <= 400; ++id) ASSERT_TRUE(backend_->Submit(Request(id, 2)).ok());
  for (uint64_t id = 1; id <= 400; ++id) {
    ASSERT_TRUE(events_.WaitFinished(id)) << id;
    ASSERT_EQ(events_.finish(id).first, FinishReason::kLength)
        << id << ": " << events_.finish(id).second.ToString();
  }
}

TEST_F(ClusterBackendTest, FirstTokenStopAndMaxTokensOneEndAtPrefill) {
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 1));
  ASSERT_TRUE(backend_->Submit(Request(1, 1)).ok());
  GenerationRequest stop = Request(2, 10);
  stop.sampling.stop_token_ids = {Reference({5, 6, 7}, 1)[0]};
  ASSERT_TRUE(backend_->Submit(stop).ok());
  ASSERT_TRUE(events_.WaitFinished(1));
  ASSERT_TRUE(events_.WaitFinished(2));
  EXPECT_EQ(events_.finish(1).first, FinishReason::kLength);
  EXPECT_EQ(events_.finish(2).first, FinishReason::kStop);
  EXPECT_EQ(events_.tokens(2).size(), 1u);
  EXPECT_EQ(d->stats().starts, 0);
  // The reservations were given back.
  for (int i = 0; i < 200 && d->free_blocks() != 64u; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(d->free_blocks(), 64u);
}

TEST_F(ClusterBackendTest, PlacementSpreadsOverDecodeWorkersByFreeBlocks) {
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d0 = AddWorker("decode-0", wire::Role::DECODE);
  auto* d1 = AddWorker("decode-1", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(2, 1));
  for (uint64_t id = 1; id <= 24; ++id) ASSERT_TRUE(backend_->Submit(Request(id, 30)).ok());
  for (uint64_t id = 1; id <= 24; ++id) {
    ASSERT_TRUE(events_.WaitFinished(id)) << id;
    EXPECT_EQ(events_.tokens(id), Reference({5, 6, 7}, 30));
  }
  EXPECT_GT(d0->stats().starts, 0);
  EXPECT_GT(d1->stats().starts, 0);
  EXPECT_EQ(d0->stats().starts + d1->stats().starts, 24);
  EXPECT_TRUE(events_.violations().empty());
}

TEST_F(ClusterBackendTest, CancelFreesTheWorkersBlocks) {
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 1));
  ASSERT_TRUE(backend_->Submit(Request(7, 100000)).ok());
  ASSERT_TRUE(events_.WaitTokens(7, 3));
  EXPECT_LT(d->free_blocks(), 64u);
  backend_->Cancel(7);
  for (int i = 0; i < 400 && (d->free_blocks() != 64u || d->running() != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(d->free_blocks(), 64u);
  EXPECT_EQ(d->running(), 0u);
  EXPECT_GE(d->stats().cancels, 1);
}

TEST_F(ClusterBackendTest, DeadDecodeWorkerRequestsContinueWithoutGapOrRepeat) {
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d0 = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 1));
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(backend_->Submit(Request(id, 150)).ok());
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(events_.WaitTokens(id, 10));
  auto* d1 = AddWorker("decode-1", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(2, 1));
  d0->Kill();  // silent from now on: declared dead after 3 heartbeats
  for (uint64_t id = 1; id <= 4; ++id) {
    ASSERT_TRUE(events_.WaitFinished(id, 20000)) << id;
    EXPECT_EQ(events_.finish(id).first, FinishReason::kLength)
        << events_.finish(id).second.ToString();
    EXPECT_EQ(events_.tokens(id), Reference({5, 6, 7}, 150)) << "request " << id;
  }
  EXPECT_TRUE(events_.violations().empty());
  EXPECT_EQ(d1->stats().starts, 4);
  EXPECT_EQ(backend_->Load().decode_workers, 1);
}

TEST_F(ClusterBackendTest, DeadPrefillWorkerRequestsAreRedispatched) {
  auto* p0 = AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 1));
  p0->SetStall(true);
  ASSERT_TRUE(backend_->Submit(Request(1, 20)).ok());
  for (int i = 0; i < 400 && p0->stats().prefills == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(p0->stats().prefills, 1);
  AddWorker("prefill-1", wire::Role::PREFILL);
  p0->Kill();
  ASSERT_TRUE(events_.WaitFinished(1, 20000));
  EXPECT_EQ(events_.finish(1).first, FinishReason::kLength);
  EXPECT_EQ(events_.tokens(1), Reference({5, 6, 7}, 20));
  for (int i = 0; i < 200 && d->free_blocks() != 64u; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(d->free_blocks(), 64u) << "the first lease was not given back";
}

TEST_F(ClusterBackendTest, UnansweredPrefillIsPlacedAgainElsewhere) {
  backend_->Stop();
  ClusterBackendOptions o;
  o.bind = "tcp://127.0.0.1:0";
  o.model_name = "tiny-moe";
  o.heartbeat_ms = 100;
  o.phase_timeout_ms = 300;
  auto b = ClusterBackend::Create(o);
  ASSERT_TRUE(b.ok());
  backend_ = std::move(*b);
  backend_->SetEvents(&events_);
  backend_->Start();
  auto* p0 = AddWorker("prefill-0", wire::Role::PREFILL);
  auto* p1 = AddWorker("prefill-1", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 2));
  p0->SetStall(true);  // alive (heartbeats) but never answers PrefillRequest
  p1->SetStall(true);
  ASSERT_TRUE(backend_->Submit(Request(1, 6)).ok());
  for (int i = 0; i < 400 && p0->stats().prefills + p1->stats().prefills == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(p0->stats().prefills + p1->stats().prefills, 1);
  ProtocolTestWorker* stalled = p0->stats().prefills == 1 ? p0 : p1;
  ProtocolTestWorker* other = stalled == p0 ? p1 : p0;
  other->SetStall(false);
  ASSERT_TRUE(events_.WaitFinished(1, 10000));
  EXPECT_EQ(events_.finish(1).first, FinishReason::kLength);
  EXPECT_EQ(events_.tokens(1), Reference({5, 6, 7}, 6));
  EXPECT_EQ(other->stats().prefills, 1);
  EXPECT_GE(stalled->stats().cancels, 1);
  for (int i = 0; i < 200 && d->free_blocks() != 64u; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(d->free_blocks(), 64u);
}

TEST_F(ClusterBackendTest, RefusedReservationIsRetried) {
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 1));
  d->SetRefuseKv(true);
  ASSERT_TRUE(backend_->Submit(Request(1, 5)).ok());
  for (int i = 0; i < 400 && d->stats().reserves < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(d->stats().reserves, 3);
  d->SetRefuseKv(false);
  ASSERT_TRUE(events_.WaitFinished(1));
  EXPECT_EQ(events_.tokens(1), Reference({5, 6, 7}, 5));
}

TEST_F(ClusterBackendTest, NoWorkersMeansNoCapacityAndRequestsWait) {
  EXPECT_EQ(backend_->Load().capacity, 0);
  ASSERT_TRUE(backend_->Submit(Request(1, 4)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  AddWorker("prefill-0", wire::Role::PREFILL);
  AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(events_.WaitFinished(1));
  EXPECT_EQ(events_.tokens(1), Reference({5, 6, 7}, 4));
}

TEST_F(ClusterBackendTest, WorkerOfAnotherModelIsRefused) {
  auto t = transport::ZmqDealerTransport::Connect(backend_->endpoint(), "odd");
  ASSERT_TRUE(t.ok());
  transport::ControlClient::Options o;
  o.id = "odd";
  o.role = wire::Role::DECODE;
  o.heartbeat_ms = 100;
  transport::ControlClient c(std::move(*t), transport::SteadyClock::Get(), o);
  c.fill_register = [](wire::Register::Builder r) { r.setModelName("another-model"); };
  ASSERT_TRUE(c.Start().ok());
  for (int i = 0; i < 40; ++i) c.Poll(5, nullptr);
  EXPECT_FALSE(c.registered());
  EXPECT_EQ(backend_->Load().decode_workers, 0);
}

}  // namespace
}  // namespace pw::router
