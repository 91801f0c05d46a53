// ClusterBackend (the router's side of the worker protocol) against ProtocolTestWorker: a test
// worker that speaks the real control plane (ZeroMQ + Cap'n Proto, registration, heartbeats)
// but computes tokens with a toy rule instead of a model. The rule makes the next token a
// function of the whole sequence, like greedy decoding, so a request moved to another worker
// after a failure must continue with exactly the tokens it would have had.
#include "services/router/cluster_backend.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "common/sampling_check.h"
#include "common/text/tokenizer.h"
#include "services/router/chat_renderer.h"
#include "services/router/router.h"
#include "services/router/tokenizer_codec.h"
#include "services/transport/zmq_transport.h"
#include "tests/services/router/http_test_client.h"

namespace pw::router {
namespace {

// The toy "model": next token of a sequence.
uint32_t NextToken(const std::vector<uint32_t>& seq) {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t t : seq) h = (h ^ t) * 1099511628211ull;
  return static_cast<uint32_t>(10 + h % 900);
}

// The toy log-probability of token t, and its alternatives (t itself, then t + 1, ...).
float ToyLogprob(uint32_t t) { return -0.125f * static_cast<float>(t % 7 + 1); }
void FillToyLogprob(wire::TokenLogprob::Builder b, uint32_t t, int32_t top_n) {
  b.setToken(t);
  b.setLogprob(ToyLogprob(t));
  auto ids = b.initTopTokens(static_cast<unsigned>(std::max(top_n, 0)));
  auto lps = b.initTopLogprobs(static_cast<unsigned>(std::max(top_n, 0)));
  for (int32_t k = 0; k < top_n; ++k) {
    ids.set(static_cast<unsigned>(k), t + static_cast<uint32_t>(k));
    lps.set(static_cast<unsigned>(k), ToyLogprob(t) - static_cast<float>(k));
  }
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

using SteadyTime = std::chrono::steady_clock::time_point;

double ElapsedMs(SteadyTime from, SteadyTime to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// A Cancel as a decode worker received it.
struct CancelSeen {
  uint64_t request_id = 0;
  uint64_t lease_id = 0;
  bool writer_done = false;
  SteadyTime at;
};

// Test worker over the real control plane. As a decode worker it keeps KV leases the way
// services/workers/decode/decode_worker.cc does: a lease that ends before StartDecode (Cancel without
// writerDone) is quarantined, and only Cancel{leaseId, writerDone} (or a StartDecode naming it)
// returns its blocks; a running sequence's blocks return when it ends or is cancelled.
class ProtocolTestWorker {
 public:
  struct Stats {
    int reserves = 0, prefills = 0, starts = 0, cancels = 0;
    int refused_starts = 0;      // StartDecode for a lease that is not live
    size_t max_running = 0;      // largest running batch (decode worker)
    int stray_writer_done = 0;   // writerDone naming no lease this process holds
    size_t longest_prefill = 0;  // most tokens one PrefillRequest carried
    // StartDecode after tokens were streamed (generatedSoFar > 1); and those whose
    // uncachedTokens is not generatedSoFar - 1 (the prefill wrote the prompt's KV only).
    int starts_after_streaming = 0;
    int uncached_mismatch = 0;
  };
  ProtocolTestWorker(const std::string& endpoint, const std::string& id, wire::Role role,
                     uint32_t blocks = 64, uint32_t step_ms = 3, std::string node = "",
                     uint64_t heartbeat_ms = 100)
      : role_(role), total_blocks_(blocks), free_blocks_(blocks), step_ms_(step_ms),
        node_(std::move(node)) {
    auto t = transport::ZmqDealerTransport::Connect(endpoint, id);
    EXPECT_TRUE(t.ok());
    transport::ControlClient::Options o;
    o.id = id;
    o.role = role;
    o.heartbeat_ms = heartbeat_ms;
    client_ =
        std::make_unique<transport::ControlClient>(std::move(*t), pw::SteadyClock::Get(), o);
    client_->fill_register = [this](wire::Register::Builder r) {
      r.setModelName("tiny-moe");
      r.setNodeName(node_);
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
      h.setReservedKvBlocks(QuarantinedBlocksLocked());
      h.setRunningRequests(static_cast<uint32_t>(running_.size()));
      h.setKvCapacityBlocks(total_blocks_);
    };
    // A prefill worker that loses the router drops all its work (it registers again).
    client_->on_server_lost = [this] {
      std::lock_guard<std::mutex> lock(mu_);
      stash_.clear();
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
  // While set, a prefill worker keeps PrefillRequests without answering (a long prefill);
  // FlushStalled() answers them (their KvReady follows the writes, as in a real worker).
  void SetStall(bool s) { stall_ = s; }
  void FlushStalled() { flush_stash_ = true; }
  // While set, a Cancel does not drop a kept PrefillRequest: the worker is past the point
  // where it could stop, and its KvReady still comes (a late writer).
  void SetLateWriter(bool l) { late_writer_ = l; }
  // While set, a prefill worker answers PrefillRequests with KvReady{ok = false}.
  void SetFailPrefill(bool f) { fail_prefill_ = f; }
  // While non-empty, the worker refuses the request's value of field `param` as an invalid
  // request (prefill: KvReady; decode: Finish at StartDecode), as a worker whose check is
  // stricter than the router's (another version) would. Without it the worker refuses only
  // what CheckSampling refuses, as the real workers do.
  void SetRefuseParam(const std::string& param) {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_param_ = param;
  }
  // Time a Cancel's handling takes (the worker is busy: nothing is sent meanwhile).
  void SetCancelDelayMs(int ms) { cancel_delay_ms_ = ms; }
  // Time the handling of the next KvReserve takes (its reply is sent at the end).
  void SetNextReserveDelayMs(int ms) { reserve_delay_ms_ = ms; }
  // While set, the worker does nothing at all (a stopped or starved process).
  void SetPaused(bool p) { paused_ = p; }
  // While set, a decode worker reserves at once but keeps its KvReserveReply (delayed in
  // transit); FlushReserveReplies() sends them.
  void SetHoldReserveReplies(bool h) { hold_replies_ = h; }
  void FlushReserveReplies() { flush_replies_ = true; }
  // While set, a decode worker refuses reservations (no free KV).
  void SetRefuseKv(bool r) { refuse_kv_ = r; }
  // A broken or forged decode worker: its last TokenChunk carries `n` tokens past max_tokens.
  void SetOverrunTokens(int n) { overrun_tokens_ = n; }
  // A broken or forged decode worker: `n` more log-probability alternatives than asked for.
  void SetExtraAlternatives(int n) { extra_alternatives_ = n; }
  bool registered() const { return registered_; }
  Stats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  uint32_t free_blocks() {
    std::lock_guard<std::mutex> lock(mu_);
    return free_blocks_;
  }
  uint32_t quarantined_blocks() {
    std::lock_guard<std::mutex> lock(mu_);
    return QuarantinedBlocksLocked();
  }
  bool quarantined(uint64_t lease) {
    std::lock_guard<std::mutex> lock(mu_);
    return quarantine_.count(lease) != 0;
  }
  size_t running() {
    std::lock_guard<std::mutex> lock(mu_);
    return running_.size();
  }
  size_t stalled() {
    std::lock_guard<std::mutex> lock(mu_);
    return stash_.size();
  }
  std::vector<CancelSeen> cancels() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancels_;
  }
  // The first Cancel{lease, writerDone} received, if any.
  std::optional<CancelSeen> writer_done(uint64_t lease) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : cancels_) {
      if (c.writer_done && c.lease_id == lease) return c;
    }
    return std::nullopt;
  }
  // A Cancel without writerDone ended `lease` of request `id` (or all the request held).
  bool ended(uint64_t id, uint64_t lease) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : cancels_) {
      if (!c.writer_done && c.request_id == id && (c.lease_id == lease || c.lease_id == 0)) {
        return true;
      }
    }
    return false;
  }
  // Prefill: when the handling of the last Cancel for `id` ended.
  std::optional<SteadyTime> cancel_handled_at(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cancel_handled_at_.find(id);
    if (it == cancel_handled_at_.end()) return std::nullopt;
    return it->second;
  }
  // Prefill: when the KvReady of a kept request for `id` was sent.
  std::optional<SteadyTime> kv_ready_sent_at(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kv_ready_sent_at_.find(id);
    if (it == kv_ready_sent_at_.end()) return std::nullopt;
    return it->second;
  }
  // The live lease of request `id` (0: none).
  uint64_t lease_of(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [lease, l] : leases_) {
      if (l.request_id == id) return lease;
    }
    return 0;
  }
  // KvRenews that named live lease `lease` of its request.
  int renewals(uint64_t lease) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = renewals_.find(lease);
    return it == renewals_.end() ? 0 : it->second;
  }
  // Leases granted, in order.
  std::vector<uint64_t> granted() {
    std::lock_guard<std::mutex> lock(mu_);
    return granted_;
  }

 private:
  struct Lease {
    uint64_t request_id = 0;
    uint32_t blocks = 0;
  };
  struct Running {
    std::vector<uint32_t> seq;
    uint32_t generated = 0;
    uint32_t max_tokens = 0;
    std::set<uint32_t> stops;
    uint64_t lease_id = 0;
    uint32_t blocks = 0;
    int32_t logprobs = -1;
  };
  struct Kept {
    uint64_t request_id = 0;
    uint64_t lease_id = 0;
    std::string decode_worker;
    std::vector<uint32_t> tokens;
    int32_t logprobs = -1;
    int32_t prompt_logprobs = -1;
  };

  void Run() {
    auto handler = [this](const std::string&, const proto::InMessage& m) {
      if (m.which() == proto::Body::CANCEL && cancel_delay_ms_ > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(cancel_delay_ms_.load()));
      }
      if (m.which() == proto::Body::KV_RESERVE) {
        if (int ms = reserve_delay_ms_.exchange(0); ms > 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        }
      }
      return Handle(m);
    };
    auto next_step = std::chrono::steady_clock::now();
    while (!stop_) {
      if (paused_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        continue;
      }
      client_->Poll(1, handler);
      registered_ = client_->registered();
      if (flush_stash_.exchange(false)) SendKept();
      if (flush_replies_.exchange(false)) SendHeldReplies();
      if (std::chrono::steady_clock::now() >= next_step) {
        next_step += std::chrono::milliseconds(step_ms_);
        Step();
      }
    }
  }

  uint32_t BlocksFor(uint32_t tokens) { return tokens / 16 + 1; }
  uint32_t QuarantinedBlocksLocked() const {
    uint32_t n = 0;
    for (const auto& [lease, l] : quarantine_) n += l.blocks;
    return n;
  }

  // `refused`: the request's own value refused (errorKind invalidRequest).
  Status SendKvReady(const Kept& k, bool ok, const std::string& error,
                     const SamplingError* refused = nullptr) {
    proto::OutMessage out;
    auto kr = out.body().initKvReady();
    kr.setRequestId(k.request_id);
    kr.setOk(ok);
    if (!ok) kr.setError(error);
    if (refused != nullptr) {
      kr.setErrorKind(wire::ErrorKind::INVALID_REQUEST);
      kr.setErrorParam(refused->param);
    }
    kr.setFirstToken(NextToken(k.tokens));
    if (k.logprobs >= 0) FillToyLogprob(kr.initFirstLogprob(), NextToken(k.tokens), k.logprobs);
    if (k.prompt_logprobs >= 0) {
      auto list = kr.initPromptLogprobs(static_cast<unsigned>(k.tokens.size() - 1));
      for (size_t i = 1; i < k.tokens.size(); ++i) {
        FillToyLogprob(list[static_cast<unsigned>(i - 1)], k.tokens[i], k.prompt_logprobs);
      }
    }
    kr.setNumTokens(static_cast<uint32_t>(k.tokens.size()));
    kr.setLeaseId(k.lease_id);
    kr.setDecodeWorkerId(k.decode_worker);
    return client_->Send(out);
  }

  void SendKept() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Kept& k : stash_) {
      kv_ready_sent_at_[k.request_id] = std::chrono::steady_clock::now();
      (void)SendKvReady(k, true, "");
    }
    stash_.clear();
  }

  void SendHeldReplies() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [request_id, lease] : held_replies_) {
      proto::OutMessage out;
      auto rep = out.body().initKvReserveReply();
      rep.setRequestId(request_id);
      rep.setOk(true);
      rep.setLeaseId(lease.first);
      auto ids = rep.initBlockIds(lease.second);
      for (uint32_t i = 0; i < lease.second; ++i) ids.set(i, i);
      (void)client_->Send(out);
    }
    held_replies_.clear();
  }

  void SendFinish(uint64_t id, wire::FinishReason reason, uint32_t n, const std::string& error,
                  const SamplingError* refused = nullptr) {
    proto::OutMessage f;
    auto fin = f.body().initFinish();
    fin.setRequestId(id);
    fin.setReason(reason);
    fin.setNumGenerated(n);
    if (!error.empty()) fin.setError(error);
    if (refused != nullptr) {
      fin.setErrorKind(wire::ErrorKind::INVALID_REQUEST);
      fin.setErrorParam(refused->param);
    }
    (void)client_->Send(f);
  }

  // The sampling values of `s` refused, as the workers refuse them (or by SetRefuseParam).
  std::optional<SamplingError> Refused(wire::SamplingParams::Reader s) {
    if (!refuse_param_.empty()) {
      return SamplingError{refuse_param_, "'" + refuse_param_ + "' refused by this worker"};
    }
    return CheckSampling({s.getTemperature(), s.getTopP(), s.getTopK(), s.getLogprobs()});
  }

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
          leases_[lease] = {r.getRequestId(), need};
          granted_.push_back(lease);
          if (hold_replies_) {
            held_replies_.push_back({r.getRequestId(), {lease, need}});
            return Status::Ok();
          }
          rep.setOk(true);
          rep.setLeaseId(lease);
          auto ids = rep.initBlockIds(need);
          for (uint32_t i = 0; i < need; ++i) ids.set(i, i);
        }
        return client_->Send(out);
      }
      case proto::Body::KV_RENEW: {
        auto r = body.getKvRenew();
        for (unsigned i = 0; i < std::min(r.getRequestIds().size(), r.getLeaseIds().size()); ++i) {
          auto it = leases_.find(r.getLeaseIds()[i]);
          if (it != leases_.end() && it->second.request_id == r.getRequestIds()[i]) ++renewals_[it->first];
        }
        return Status::Ok();
      }
      case proto::Body::PREFILL_REQUEST: {
        ++stats_.prefills;
        auto p = body.getPrefillRequest();
        Kept k;
        k.request_id = p.getRequestId();
        k.lease_id = p.getLeaseId();
        k.decode_worker = proto::ToString(p.getDecodeWorkerId());
        k.tokens = proto::ToVector<uint32_t>(p.getTokens());
        stats_.longest_prefill = std::max(stats_.longest_prefill, k.tokens.size());
        k.logprobs = p.getSampling().getLogprobs();
        k.prompt_logprobs = p.getPromptLogprobs();
        if (auto refused = Refused(p.getSampling())) {
          return SendKvReady(k, false, refused->message, &*refused);
        }
        if (stall_) {
          stash_.push_back(std::move(k));
          return Status::Ok();
        }
        // The request must carry the decode worker's registered KV pool and layout.
        const bool target_ok =
            proto::ToBytes(p.getDecodeMemory().getRkey()) == "rkey" &&
            proto::ToBytes(p.getDecodeMemory().getWorkerAddress()) == "worker-address" &&
            p.getDecodeMemory().getBaseAddr() == 0x10000 &&
            p.getDecodeLayout().getLayoutHash() == 42 &&
            p.getDecodeLayout().getBlockTokens() == 16 &&
            p.getBlockIds().size() >= BlocksFor(static_cast<uint32_t>(k.tokens.size()));
        if (fail_prefill_) return SendKvReady(k, false, "prefill failed on purpose");
        return SendKvReady(k, target_ok,
                           target_ok ? "" : "PrefillRequest without the decode worker's KV target");
      }
      case proto::Body::START_DECODE: {
        ++stats_.starts;
        auto s = body.getStartDecode();
        const uint64_t id = s.getRequestId();
        auto lit = leases_.find(s.getLeaseId());
        if (lit == leases_.end() || lit->second.request_id != id) {
          // Not live: refused; a quarantined lease's writer is done (its KvReady came first).
          ++stats_.refused_starts;
          auto q = quarantine_.find(s.getLeaseId());
          if (q != quarantine_.end() && q->second.request_id == id) {
            free_blocks_ += q->second.blocks;
            quarantine_.erase(q);
          }
          SendFinish(id, wire::FinishReason::ERROR, s.getGeneratedSoFar(), "lease not live");
          return Status::Ok();
        }
        if (auto refused = Refused(s.getSampling())) {
          free_blocks_ += lit->second.blocks;  // as DecodeWorker::OnStartDecode
          leases_.erase(lit);
          SendFinish(id, wire::FinishReason::ERROR, s.getGeneratedSoFar(), refused->message,
                     &*refused);
          return Status::Ok();
        }
        Running r;
        r.seq = proto::ToVector<uint32_t>(s.getTokens());
        r.seq.push_back(s.getFirstToken());
        r.generated = s.getGeneratedSoFar();
        stats_.starts_after_streaming += r.generated > 1;
        stats_.uncached_mismatch += s.getUncachedTokens() + 1 != r.generated;
        r.max_tokens = s.getSampling().getMaxTokens();
        r.logprobs = s.getSampling().getLogprobs();
        for (uint32_t t : s.getSampling().getStopTokenIds()) r.stops.insert(t);
        r.lease_id = lit->first;
        r.blocks = lit->second.blocks;
        leases_.erase(lit);
        running_[id] = std::move(r);
        stats_.max_running = std::max(stats_.max_running, running_.size());
        return Status::Ok();
      }
      case proto::Body::CANCEL: {
        ++stats_.cancels;
        auto c = body.getCancel();
        const uint64_t id = c.getRequestId();
        const uint64_t lease = c.getLeaseId();
        cancels_.push_back({id, lease, c.getWriterDone(), std::chrono::steady_clock::now()});
        if (role_ == wire::Role::PREFILL) {
          if (!late_writer_) {
            std::erase_if(stash_, [&](const Kept& k) {
              return k.request_id == id && (lease == 0 || k.lease_id == lease);
            });
          }
          cancel_handled_at_[id] = std::chrono::steady_clock::now();
          return Status::Ok();
        }
        OnDecodeCancel(id, lease, c.getWriterDone());
        return Status::Ok();
      }
      default:
        return Status::Ok();
    }
  }

  // As DecodeWorker::OnCancel.
  void OnDecodeCancel(uint64_t id, uint64_t lease, bool writer_done) {
    if (writer_done) {
      if (lease == 0) return;
      auto l = leases_.find(lease);
      if (l != leases_.end() && l->second.request_id == id) {
        free_blocks_ += l->second.blocks;
        leases_.erase(l);
        SendFinish(id, wire::FinishReason::CANCELLED, 0, "");
        return;
      }
      auto q = quarantine_.find(lease);
      if (q != quarantine_.end() && q->second.request_id == id) {
        free_blocks_ += q->second.blocks;
        quarantine_.erase(q);
        return;
      }
      ++stats_.stray_writer_done;
      return;
    }
    bool found = false;
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.request_id == id && (lease == 0 || it->first == lease)) {
        quarantine_[it->first] = it->second;
        it = leases_.erase(it);
        found = true;
      } else {
        ++it;
      }
    }
    auto r = running_.find(id);
    if (r != running_.end() && (lease == 0 || r->second.lease_id == lease)) {
      free_blocks_ += r->second.blocks;
      const uint32_t n = r->second.generated;
      running_.erase(r);
      SendFinish(id, wire::FinishReason::CANCELLED, n, "");
      return;
    }
    if (found) SendFinish(id, wire::FinishReason::CANCELLED, 0, "");
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
      // The last token, and with SetOverrunTokens more after it.
      const unsigned extra = r.generated + 1 >= r.max_tokens ? unsigned(overrun_tokens_.load()) : 0;
      std::vector<uint32_t> chunk = {t};
      for (unsigned i = 0; i < extra; ++i) {
        std::vector<uint32_t> seq = r.seq;
        seq.insert(seq.end(), chunk.begin() + 1, chunk.end());
        chunk.push_back(NextToken(seq));
      }
      auto toks = c.initTokens(static_cast<unsigned>(chunk.size()));
      for (unsigned i = 0; i < chunk.size(); ++i) toks.set(i, chunk[i]);
      if (r.logprobs >= 0) {
        auto lps = c.initLogprobs(static_cast<unsigned>(chunk.size()));
        for (unsigned i = 0; i < chunk.size(); ++i) {
          FillToyLogprob(lps[i], chunk[i], r.logprobs + extra_alternatives_.load());
        }
      }
      (void)client_->Send(out);
      ++r.generated;
      bool stop = r.stops.count(t) != 0;
      if (stop || r.generated >= r.max_tokens) {
        SendFinish(id, stop ? wire::FinishReason::STOP : wire::FinishReason::LENGTH, r.generated,
                   "");
        done.push_back(id);
      }
    }
    for (uint64_t id : done) {
      free_blocks_ += running_[id].blocks;
      running_.erase(id);
    }
  }

  wire::Role role_;
  uint32_t total_blocks_;
  uint32_t free_blocks_;
  uint32_t step_ms_;
  std::string node_;  // Register.nodeName
  std::unique_ptr<transport::ControlClient> client_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, stall_{false}, refuse_kv_{false}, registered_{false};
  std::atomic<bool> late_writer_{false}, fail_prefill_{false}, paused_{false};
  std::atomic<bool> hold_replies_{false}, flush_replies_{false}, flush_stash_{false};
  std::atomic<int> cancel_delay_ms_{0}, reserve_delay_ms_{0};
  std::atomic<int> overrun_tokens_{0}, extra_alternatives_{0};
  std::mutex mu_;
  Stats stats_;
  std::map<uint64_t, Lease> leases_;      // live leases (not started)
  std::map<uint64_t, Lease> quarantine_;  // ended before StartDecode; freed by writerDone
  std::map<uint64_t, Running> running_;   // by request
  std::map<uint64_t, int> renewals_;  // lease -> KvRenews naming it
  std::vector<uint64_t> granted_;
  std::vector<std::pair<uint64_t, std::pair<uint64_t, uint32_t>>> held_replies_;
  std::vector<Kept> stash_;
  std::string refuse_param_;  // SetRefuseParam
  std::vector<CancelSeen> cancels_;
  std::map<uint64_t, SteadyTime> cancel_handled_at_;
  std::map<uint64_t, SteadyTime> kv_ready_sent_at_;
  uint64_t next_lease_ = 1;
};

// A decode process speaking the control plane frame by frame (ZeroMQ + Cap'n Proto, no
// ControlClient), so that it can register with a pid of its choosing: a process restarted
// under the same worker id. It grants every reservation from `first_lease` on and records the
// Cancels and StartDecodes it gets.
class RawDecodePeer {
 public:
  RawDecodePeer(const std::string& endpoint, std::string id, uint32_t pid, uint64_t first_lease)
      : id_(std::move(id)), pid_(pid), next_lease_(first_lease) {
    auto t = transport::ZmqDealerTransport::Connect(endpoint, id_);
    EXPECT_TRUE(t.ok());
    if (t.ok()) transport_ = std::move(*t);
    thread_ = std::thread([this] { Run(); });
  }
  ~RawDecodePeer() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  bool registered() const { return registered_; }
  std::vector<CancelSeen> cancels() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancels_;
  }
  std::vector<uint64_t> granted() {
    std::lock_guard<std::mutex> lock(mu_);
    return granted_;
  }
  std::vector<uint64_t> started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }

 private:
  void Send(proto::OutMessage& m) {
    m.envelope().setAckSeq(registered_ ? last_in_ : 0);
    std::string bytes =
        proto::Encode(m, next_seq_++, id_, pw::SteadyClock::Get()->NowMs());
    (void)transport_->Send("", bytes);
  }
  void Run() {
    auto next_beat = std::chrono::steady_clock::now();
    while (!stop_ && transport_) {
      if (std::chrono::steady_clock::now() >= next_beat) {
        next_beat += std::chrono::milliseconds(100);
        proto::OutMessage m;
        if (!registered_) {
          auto r = m.body().initRegister();
          r.setModelName("tiny-moe");
          r.setRole(wire::Role::DECODE);
          r.setWorkerId(id_);
          r.setPid(pid_);
          r.setHeartbeatIntervalMs(100);
          r.setMaxBatch(16);
          r.setMaxContext(2048);
          auto l = r.initKvLayout();
          l.setNumBlocks(64);
          l.setBlockTokens(16);
          l.setLayoutHash(42);
          auto mem = r.initKvMemory();
          mem.setWorkerAddress(proto::AsData("worker-address"));
          mem.setRkey(proto::AsData("rkey"));
          mem.setBaseAddr(0x10000);
          mem.setBytes(64 * 4096);
        } else {
          m.body().initHeartbeat().setFreeKvBlocks(64);
        }
        Send(m);
      }
      auto f = transport_->Recv(5);
      if (!f.ok() || !f->has_value()) continue;
      auto msg = proto::InMessage::Parse((*f)->bytes);
      if (!msg.ok()) continue;
      Handle(**msg);
    }
  }
  void Handle(const proto::InMessage& m) {
    if (m.which() == proto::Body::REGISTER_ACK) {
      if (m.body().getRegisterAck().getAccepted()) {
        registered_ = true;
        last_in_ = m.seq();
      }
      return;
    }
    if (m.which() == proto::Body::NOT_REGISTERED) {
      registered_ = false;
      return;
    }
    if (m.seq() <= last_in_) return;
    last_in_ = m.seq();
    std::lock_guard<std::mutex> lock(mu_);
    switch (m.which()) {
      case proto::Body::KV_RESERVE: {
        auto r = m.body().getKvReserve();
        const uint32_t need = r.getNumTokens() / 16 + 1;
        const uint64_t lease = next_lease_++;
        granted_.push_back(lease);
        proto::OutMessage out;
        auto rep = out.body().initKvReserveReply();
        rep.setRequestId(r.getRequestId());
        rep.setOk(true);
        rep.setLeaseId(lease);
        auto ids = rep.initBlockIds(need);
        for (uint32_t i = 0; i < need; ++i) ids.set(i, i);
        Send(out);
        break;
      }
      case proto::Body::START_DECODE:
        started_.push_back(m.body().getStartDecode().getLeaseId());
        break;
      case proto::Body::CANCEL: {
        auto c = m.body().getCancel();
        cancels_.push_back({c.getRequestId(), c.getLeaseId(), c.getWriterDone(),
                            std::chrono::steady_clock::now()});
        break;
      }
      default:
        break;
    }
  }

  std::string id_;
  uint32_t pid_;
  std::unique_ptr<transport::Transport> transport_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, registered_{false};
  uint64_t next_seq_ = 1;
  uint64_t last_in_ = 0;
  std::mutex mu_;
  uint64_t next_lease_;
  std::vector<uint64_t> granted_, started_;
  std::vector<CancelSeen> cancels_;
};

// Collects events; checks indices are contiguous (no gap, no repeat reaches the router).
class Collector final : public GenerationEvents {
 public:
  void OnPromptLogprobs(uint64_t id, std::vector<TokenLogprob> lps) override {
    std::lock_guard<std::mutex> lock(mu_);
    prompt_logprobs_[id].push_back(std::move(lps));
  }
  void OnTokens(uint64_t id, uint32_t start, std::vector<int32_t> tokens,
                std::vector<TokenLogprob> lps) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& l = logprobs_[id];
    l.insert(l.end(), lps.begin(), lps.end());
    auto& v = tokens_[id];
    if (start != v.size()) {
      ADD_FAILURE() << "request " << id << ": tokens at index " << start << ", expected "
                    << v.size();
      violations_.push_back(id);
    }
    v.insert(v.end(), tokens.begin(), tokens.end());
    cv_.notify_all();
  }
  void OnFinished(uint64_t id, FinishReason reason, Status error, std::string param) override {
    std::lock_guard<std::mutex> lock(mu_);
    finished_[id] = {reason, error};
    params_[id] = std::move(param);
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
  bool finished(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_.count(id) != 0;
  }
  // OnFinished's `param`.
  std::string param(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return params_[id];
  }
  std::vector<uint64_t> violations() {
    std::lock_guard<std::mutex> lock(mu_);
    return violations_;
  }
  std::vector<TokenLogprob> logprobs(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return logprobs_[id];
  }
  std::vector<std::vector<TokenLogprob>> prompt_logprobs(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return prompt_logprobs_[id];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::vector<TokenLogprob>> logprobs_;
  std::map<uint64_t, std::vector<std::vector<TokenLogprob>>> prompt_logprobs_;
  std::map<uint64_t, std::vector<int32_t>> tokens_;
  std::map<uint64_t, std::pair<FinishReason, Status>> finished_;
  std::map<uint64_t, std::string> params_;
  std::vector<uint64_t> violations_;
};

// Bounds for "soon after" in the tests below: generous, for a loaded machine. Every grace the
// tests wait for is far shorter than the graces of the other release paths, so a release seen
// within this bound came from the path under test.
constexpr int kSlackMs = 4000;

bool WaitFor(const std::function<bool()>& pred, int timeout_ms = 15000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

class ClusterBackendTest : public ::testing::Test {
 protected:
  static ClusterBackendOptions BaseOptions() {
    ClusterBackendOptions o;
    o.bind = "tcp://127.0.0.1:0";
    o.model_name = "tiny-moe";
    o.heartbeat_ms = 100;
    // Short graces, so that fenced leases come back within the tests' waits.
    o.writer_grace_ms = 1000;
    o.cancel_grace_ms = 300;
    return o;
  }
  void SetUp() override { Restart(BaseOptions()); }
  void TearDown() override {
    backend_->Stop();
    workers_.clear();
  }
  // Replaces the backend (before any worker was added).
  void Restart(const ClusterBackendOptions& o) {
    if (backend_) backend_->Stop();
    auto b = ClusterBackend::Create(o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(*b);
    backend_->SetEvents(&events_);
    backend_->Start();
  }
  ProtocolTestWorker* AddWorker(const std::string& id, wire::Role role, uint32_t blocks = 64,
                                const std::string& node = "") {
    workers_.push_back(
        std::make_unique<ProtocolTestWorker>(backend_->endpoint(), id, role, blocks, 3, node));
    return workers_.back().get();
  }
  // Ends a worker's process: its socket closes.
  void RemoveWorker(ProtocolTestWorker* w) {
    for (auto& p : workers_) {
      if (p.get() == w) p.reset();
    }
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
  // BaseOptions with these fence graces.
  static ClusterBackendOptions GraceOptions(uint64_t cancel_grace_ms, uint64_t writer_grace_ms) {
    ClusterBackendOptions o = BaseOptions();
    o.cancel_grace_ms = cancel_grace_ms;
    o.writer_grace_ms = writer_grace_ms;
    return o;
  }
  // Restarts the backend with `o`, adds prefill-0 and decode-0 and waits until both take work.
  // Call through ASSERT_NO_FATAL_FAILURE.
  void StartPrefillDecode(const ClusterBackendOptions& o, ProtocolTestWorker** p,
                          ProtocolTestWorker** d) {
    Restart(o);
    *p = AddWorker("prefill-0", wire::Role::PREFILL);
    *d = AddWorker("decode-0", wire::Role::DECODE);
    ASSERT_TRUE(WaitCapacity(1, 1));
  }
  // The end of a fence test: no writerDone reached `d` for a lease it did not hold, and
  // stopping the backend leaves no fence behind.
  void ExpectNoStrayReleaseAndNoFence(ProtocolTestWorker* d) {
    EXPECT_EQ(d->stats().stray_writer_done, 0);
    backend_->Stop();
    EXPECT_EQ(backend_->fences(), 0u);
  }
  // Request `id` (prompt {5, 6, 7}) finishes by length with the reference's first `n` tokens.
  // Call through ASSERT_NO_FATAL_FAILURE.
  void ExpectCompleted(uint64_t id, int n, int timeout_ms = 10000) {
    ASSERT_TRUE(events_.WaitFinished(id, timeout_ms));
    EXPECT_EQ(events_.finish(id).first, FinishReason::kLength)
        << events_.finish(id).second.ToString();
    EXPECT_EQ(events_.tokens(id), Reference({5, 6, 7}, n));
  }
  // Every block of `d` back in its pool, none quarantined.
  static bool WaitAllFree(ProtocolTestWorker* d, uint32_t total = 64, int timeout_ms = 15000) {
    return WaitFor([&] { return d->free_blocks() == total && d->quarantined_blocks() == 0; },
                   timeout_ms);
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
  EXPECT_EQ(backend_->Load().capacity, 16 + 16 / 4);  // maxBatch + prefill ahead
  ASSERT_TRUE(backend_->Submit(Request(1, 12)).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectCompleted(1, 12));
  EXPECT_TRUE(events_.violations().empty());
  EXPECT_EQ(p->stats().prefills, 1);
  EXPECT_EQ(d->stats().starts, 1);
  EXPECT_EQ(d->free_blocks(), 64u);
}

TEST_F(ClusterBackendTest, PrefillAheadStreamsFirstTokensButKeepsTheBatchAtMaxBatch) {
  // maxBatch 16 and 4 ahead: 20 requests of 60 tokens (180 ms of decode each) at once. All 20
  // get their first token from the prefill while the decode batch stays at 16; the other 4
  // start as slots free, and every request gets exactly its tokens.
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE, 1024);
  ASSERT_TRUE(WaitCapacity(1, 1));
  ASSERT_EQ(backend_->Load().capacity, 20);
  for (uint64_t id = 1; id <= 20; ++id) ASSERT_TRUE(backend_->Submit(Request(id, 60)).ok());
  ASSERT_TRUE(WaitFor([&] {
    for (uint64_t id = 1; id <= 20; ++id) {
      if (events_.tokens(id).empty()) return false;
    }
    return true;
  }));
  EXPECT_LE(d->running(), 16u);
  for (uint64_t id = 1; id <= 20; ++id) {
    ASSERT_TRUE(events_.WaitFinished(id)) << id;
    EXPECT_EQ(events_.finish(id).first, FinishReason::kLength);
    EXPECT_EQ(events_.tokens(id), Reference({5, 6, 7}, 60)) << id;
  }
  EXPECT_TRUE(events_.violations().empty());
  EXPECT_EQ(d->stats().starts, 20);
  EXPECT_EQ(d->stats().refused_starts, 0);
  EXPECT_EQ(d->stats().max_running, 16u);
  EXPECT_TRUE(WaitAllFree(d, 1024));
}

TEST_F(ClusterBackendTest, CancelOfAPrefilledRequestWaitingForASlotFreesItsBlocks) {
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE, 1024);
  ASSERT_TRUE(WaitCapacity(1, 1));
  for (uint64_t id = 1; id <= 17; ++id) ASSERT_TRUE(backend_->Submit(Request(id, 300)).ok());
  // Request 17 has its first token and waits: the batch is full with 1..16.
  ASSERT_TRUE(WaitFor([&] { return !events_.tokens(17).empty() && d->running() == 16; }));
  EXPECT_EQ(events_.tokens(17).size(), 1u);
  backend_->Cancel(17);  // a cancel ends a request without an event
  for (uint64_t id = 1; id <= 16; ++id) backend_->Cancel(id);
  EXPECT_LE(d->stats().starts, 16);  // 17 never started
  EXPECT_TRUE(WaitAllFree(d, 1024));  // its lease came back (writer done), none quarantined
}

// A prefilled request waiting for a decode slot (prefill ahead) keeps its lease renewed until
// its StartDecode.
TEST_F(ClusterBackendTest, LeaseOfAPrefilledRequestWaitingForASlotIsRenewed) {
  ClusterBackendOptions o = BaseOptions();
  o.lease_ms = 300;
  Restart(o);
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE, 1024);
  ASSERT_TRUE(WaitCapacity(1, 1));
  for (uint64_t id = 1; id <= 17; ++id) ASSERT_TRUE(backend_->Submit(Request(id, 600)).ok());
  // Request 17 has its first token and waits: the batch is full with 1..16 (1.8 s of decode).
  ASSERT_TRUE(WaitFor([&] { return !events_.tokens(17).empty() && d->running() == 16; }));
  const uint64_t lease = d->lease_of(17);
  ASSERT_NE(lease, 0u);
  ASSERT_TRUE(WaitFor([&] { return d->renewals(lease) >= 2 || events_.tokens(17).size() > 1; }));
  EXPECT_EQ(events_.tokens(17).size(), 1u) << "started before the test saw its lease renewed";
  EXPECT_GE(d->renewals(lease), 2);
  for (uint64_t id = 1; id <= 17; ++id) backend_->Cancel(id);
  EXPECT_TRUE(WaitAllFree(d, 1024));
}

TEST_F(ClusterBackendTest, NoPrefillAheadMeansCapacityIsMaxBatch) {
  ClusterBackendOptions o = BaseOptions();
  o.prefill_ahead = 0;
  Restart(o);
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE, 1024);
  ASSERT_TRUE(WaitCapacity(1, 1));
  EXPECT_EQ(backend_->Load().capacity, 16);
  for (uint64_t id = 1; id <= 20; ++id) ASSERT_TRUE(backend_->Submit(Request(id, 20)).ok());
  for (uint64_t id = 1; id <= 20; ++id) ASSERT_TRUE(events_.WaitFinished(id)) << id;
  EXPECT_LE(d->stats().max_running, 16u);
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
  // The reservations were given back, as leases whose writer is done.
  EXPECT_TRUE(WaitAllFree(d));
  EXPECT_EQ(d->free_blocks(), 64u);
  EXPECT_EQ(d->stats().stray_writer_done, 0);
  for (const CancelSeen& c : d->cancels()) EXPECT_TRUE(c.writer_done) << c.lease_id;
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

// A decode worker the router has not heard a heartbeat from yet is ranked by its registered
// pool, not as full: with heartbeats every 2 s, a request placed right after a large worker
// registered goes to it rather than to the small one heard from. (Placed later, it has been
// heard from, and goes there all the same.)
TEST_F(ClusterBackendTest, UnheardDecodeWorkerIsRankedByItsRegisteredPool) {
  ClusterBackendOptions o = BaseOptions();
  o.heartbeat_ms = 2000;
  Restart(o);
  auto add = [&](const std::string& id, wire::Role role, uint32_t blocks) {
    workers_.push_back(std::make_unique<ProtocolTestWorker>(backend_->endpoint(), id, role, blocks, 3, "", 2000));
    return workers_.back().get();
  };
  add("prefill-0", wire::Role::PREFILL, 64);
  auto* small = add("decode-0", wire::Role::DECODE, 64);
  ASSERT_TRUE(WaitFor([&] { return backend_->Load().free_kv_blocks == 64; }));  // heard from
  auto* large = add("decode-1", wire::Role::DECODE, 1000);
  ASSERT_TRUE(WaitFor([&] { return backend_->Load().decode_workers == 2; }));  // registered
  ASSERT_TRUE(backend_->Submit(Request(1, 4)).ok());
  ASSERT_TRUE(events_.WaitFinished(1));
  EXPECT_EQ(large->stats().reserves, 1);
  EXPECT_EQ(small->stats().reserves, 0);
  EXPECT_TRUE(events_.violations().empty());
}

// Two nodes (Register.nodeName): requests one after another go to the prefill worker on the
// decode worker's node, though the other node's sorts first; with that node lost (its workers'
// processes gone), the requests pair across to the node left.
TEST_F(ClusterBackendTest, PlacementPairsWorkersOfOneNodeAndSurvivesItsLoss) {
  auto* pa = AddWorker("prefill-a", wire::Role::PREFILL, 64, "node-a");
  auto* pb = AddWorker("prefill-b", wire::Role::PREFILL, 64, "node-b");
  auto* db = AddWorker("decode-b", wire::Role::DECODE, 64, "node-b");
  ASSERT_TRUE(WaitCapacity(1, 2));
  for (uint64_t id = 1; id <= 6; ++id) {
    ASSERT_TRUE(backend_->Submit(Request(id, 5)).ok());
    ASSERT_NO_FATAL_FAILURE(ExpectCompleted(id, 5, 20000));
  }
  EXPECT_EQ(pb->stats().prefills, 6);
  EXPECT_EQ(pa->stats().prefills, 0);
  auto* da = AddWorker("decode-a", wire::Role::DECODE, 64, "node-a");
  RemoveWorker(db);  // node-b lost
  RemoveWorker(pb);
  ASSERT_TRUE(WaitCapacity(1, 1));  // declared dead (3 silent heartbeats)
  for (uint64_t id = 7; id <= 10; ++id) {
    ASSERT_TRUE(backend_->Submit(Request(id, 5)).ok());
    ASSERT_NO_FATAL_FAILURE(ExpectCompleted(id, 5, 20000));
  }
  EXPECT_EQ(pa->stats().prefills, 4);
  EXPECT_EQ(da->stats().starts, 4);
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
  WaitFor([&] { return d->free_blocks() == 64u && d->running() == 0; });
  EXPECT_EQ(d->free_blocks(), 64u);
  EXPECT_EQ(d->running(), 0u);
  EXPECT_GE(d->stats().cancels, 1);
}

TEST_F(ClusterBackendTest, DeadDecodeWorkerRequestsContinueWithoutGapOrRepeat) {
  auto* p = AddWorker("prefill-0", wire::Role::PREFILL);
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
  // The prefill worker computed the prompt only; the new decode worker was told to compute
  // the KV of what had streamed before its first input token.
  EXPECT_EQ(p->stats().longest_prefill, 3u);
  EXPECT_EQ(d1->stats().starts_after_streaming, 4);
  EXPECT_EQ(d1->stats().uncached_mismatch, 0);
  EXPECT_EQ(d0->stats().uncached_mismatch, 0);
  EXPECT_EQ(backend_->Load().decode_workers, 1);
}

// Log-probabilities travel with their tokens (KvReady for the first, TokenChunk for the rest),
// one per token, also across a decode worker's death; the prompt's arrive once, before the
// first token, and are asked for on the first placement only.
TEST_F(ClusterBackendTest, LogprobsFollowTheirTokensAcrossAFailover) {
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d0 = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 1));
  GenerationRequest with = Request(1, 120, {5, 6, 7, 8});
  with.sampling.logprobs = 2;
  with.sampling.prompt_logprobs = 1;
  ASSERT_TRUE(backend_->Submit(with).ok());
  ASSERT_TRUE(backend_->Submit(Request(2, 120)).ok());  // asks for none
  ASSERT_TRUE(events_.WaitTokens(1, 10));
  AddWorker("decode-1", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(2, 1));
  d0->Kill();
  for (uint64_t id : {1, 2}) ASSERT_TRUE(events_.WaitFinished(id, 20000)) << id;
  const auto tokens = events_.tokens(1);
  ASSERT_EQ(tokens, Reference({5, 6, 7, 8}, 120));
  const auto lps = events_.logprobs(1);
  ASSERT_EQ(lps.size(), tokens.size());
  for (size_t i = 0; i < lps.size(); ++i) {
    EXPECT_EQ(lps[i].token, tokens[i]) << i;
    EXPECT_FLOAT_EQ(lps[i].logprob, ToyLogprob(static_cast<uint32_t>(tokens[i]))) << i;
    ASSERT_EQ(lps[i].top.size(), 2u) << i;
    EXPECT_EQ(lps[i].top[1].first, tokens[i] + 1);
  }
  const auto prompt = events_.prompt_logprobs(1);
  ASSERT_EQ(prompt.size(), 1u);  // once, although the request was placed twice
  ASSERT_EQ(prompt[0].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(prompt[0][i].token, static_cast<int32_t>(6 + i));
    EXPECT_FLOAT_EQ(prompt[0][i].logprob, ToyLogprob(6 + static_cast<uint32_t>(i)));
    EXPECT_EQ(prompt[0][i].top.size(), 1u);
  }
  EXPECT_TRUE(events_.logprobs(2).empty());
  EXPECT_TRUE(events_.prompt_logprobs(2).empty());
  EXPECT_TRUE(events_.violations().empty());
}

// A decode worker that sends tokens past max_tokens (broken, or an insider): the client gets
// max_tokens tokens, the request ends with length there, and the worker is told to stop.
TEST_F(ClusterBackendTest, TokensPastMaxTokensAreNotDelivered) {
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  d->SetOverrunTokens(5);
  ASSERT_TRUE(WaitCapacity(1, 1));
  ASSERT_TRUE(backend_->Submit(Request(1, 6)).ok());
  ASSERT_TRUE(events_.WaitFinished(1, 20000));
  EXPECT_EQ(events_.tokens(1), Reference({5, 6, 7}, 6));
  EXPECT_EQ(events_.finish(1).first, FinishReason::kLength);
  EXPECT_TRUE(events_.violations().empty());
}

// A worker that sends more log-probability alternatives than the request asked for is not
// believed: the request is placed again, on a worker that keeps to the count.
TEST_F(ClusterBackendTest, MoreAlternativesThanAskedForArePlacedAgain) {
  AddWorker("prefill-0", wire::Role::PREFILL);
  // The most free blocks: placed there first.
  auto* bad = AddWorker("decode-0", wire::Role::DECODE, /*blocks=*/128);
  bad->SetExtraAlternatives(1000);
  AddWorker("decode-1", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(2, 1));
  GenerationRequest with = Request(1, 8, {5, 6, 7, 8});
  with.sampling.logprobs = 2;
  ASSERT_TRUE(backend_->Submit(with).ok());
  ASSERT_TRUE(events_.WaitFinished(1, 20000));
  EXPECT_TRUE(events_.finish(1).second.ok()) << events_.finish(1).second.ToString();
  const auto lps = events_.logprobs(1);
  ASSERT_EQ(events_.tokens(1), Reference({5, 6, 7, 8}, 8));
  ASSERT_EQ(lps.size(), 8u);
  for (const auto& lp : lps) EXPECT_EQ(lp.top.size(), 2u);
  EXPECT_GE(backend_->Load().requests_replaced, 1u);
  EXPECT_TRUE(events_.violations().empty());
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
  ASSERT_NO_FATAL_FAILURE(ExpectCompleted(1, 20, 20000));
  // The first lease stays quarantined for writer_grace_ms after prefill-0's death, then
  // comes back.
  EXPECT_TRUE(WaitAllFree(d));
  EXPECT_EQ(d->free_blocks(), 64u) << "the first lease was not given back";
}

// A prefill worker whose process is gone (its socket closed) but not yet declared dead: the
// requests placed on it meanwhile are not failed after 3 placements within milliseconds, they
// wait (without using an attempt) until a prefill worker is back, and Load() stops counting
// the worker at the first failed send (so /health says no_workers, role prefill).
TEST_F(ClusterBackendTest, RequestsWaitForAPrefillWorkerWhoseProcessIsGone) {
  ClusterBackendOptions o = BaseOptions();
  o.dead_after_beats = 50;  // 5 s: the death is not noticed within this test
  Restart(o);
  auto* p0 = AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 1));
  RemoveWorker(p0);  // as SIGKILL: the connection closes, nothing is said
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  constexpr uint64_t kRequests = 8;
  for (uint64_t id = 1; id <= kRequests; ++id) ASSERT_TRUE(backend_->Submit(Request(id, 6)).ok());
  EXPECT_TRUE(WaitFor([&] { return backend_->Load().prefill_workers == 0; }, 2000));
  EXPECT_EQ(backend_->Load().capacity, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (uint64_t id = 1; id <= kRequests; ++id) {
    EXPECT_FALSE(events_.finished(id)) << id << " ended while it should wait";
  }
  auto* p1 = AddWorker("prefill-0", wire::Role::PREFILL);  // restarted under the same id
  for (uint64_t id = 1; id <= kRequests; ++id) {
    ASSERT_TRUE(events_.WaitFinished(id, 10000)) << id;
    EXPECT_EQ(events_.finish(id).first, FinishReason::kLength)
        << events_.finish(id).second.ToString();
    EXPECT_EQ(events_.tokens(id), Reference({5, 6, 7}, 6)) << id;
  }
  EXPECT_EQ(p1->stats().prefills, static_cast<int>(kRequests));
  EXPECT_TRUE(events_.violations().empty());
  EXPECT_EQ(backend_->Load().prefill_workers, 1);
  EXPECT_TRUE(WaitAllFree(d));
}

TEST_F(ClusterBackendTest, UnansweredPrefillIsPlacedAgainElsewhere) {
  ClusterBackendOptions o = BaseOptions();
  o.phase_timeout_ms = 300;
  Restart(o);
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
  ASSERT_NO_FATAL_FAILURE(ExpectCompleted(1, 6, 10000));
  EXPECT_EQ(other->stats().prefills, 1);
  EXPECT_GE(stalled->stats().cancels, 1);
  // The stalled worker handled the Cancel: its lease comes back cancel_grace_ms later.
  EXPECT_TRUE(WaitAllFree(d));
  EXPECT_EQ(d->free_blocks(), 64u);
}

// A request queued behind a long prefill keeps its lease: the router renews it (KvRenew) every
// third of lease_ms until StartDecode, then the request completes. The decode worker's KV
// capacity (heartbeat) reaches the router's load for admission.
TEST_F(ClusterBackendTest, LeaseOfARequestQueuedBehindPrefillIsRenewed) {
  ClusterBackendOptions o = BaseOptions();
  o.lease_ms = 300;
  Restart(o);
  auto* p = AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 1));
  for (int i = 0; i < 400 && backend_->Load().kv_capacity_blocks == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(backend_->Load().kv_capacity_blocks, 64);
  EXPECT_EQ(backend_->Load().kv_capacity_max_blocks, 64);
  EXPECT_EQ(backend_->Load().kv_block_tokens, 16);
  p->SetStall(true);  // the prefill is queued: no KvReady until flushed
  ASSERT_TRUE(backend_->Submit(Request(1, 6)).ok());
  for (int i = 0; i < 400 && p->stalled() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(p->stalled(), 1u);
  ASSERT_EQ(d->granted().size(), 1u);
  const uint64_t lease = d->granted()[0];
  // Renewed again and again, past several lease times.
  for (int i = 0; i < 1000 && d->renewals(lease) < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(d->renewals(lease), 4);
  p->FlushStalled();
  ASSERT_NO_FATAL_FAILURE(ExpectCompleted(1, 6, 10000));
  EXPECT_EQ(d->granted().size(), 1u);  // never placed again
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

TEST_F(ClusterBackendTest, RequestRefusedByThePrefillWorkerIsNotAWorkerFailure) {
  // top_p 0 (what 1e-320 is as a float): the prefill worker refuses the request's own value
  // (CheckSampling). That ends the request as invalid at once: no second placement, nothing
  // counted against the worker, the lease given back.
  AddWorker("prefill-0", wire::Role::PREFILL);
  AddWorker("prefill-1", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 2));
  GenerationRequest r = Request(1, 5);
  r.sampling.temperature = 1.f;
  r.sampling.top_p = static_cast<float>(1e-320);
  ASSERT_EQ(r.sampling.top_p, 0.f);
  ASSERT_TRUE(backend_->Submit(std::move(r)).ok());
  ASSERT_TRUE(events_.WaitFinished(1));
  EXPECT_EQ(events_.finish(1).first, FinishReason::kError);
  EXPECT_EQ(events_.finish(1).second.code(), StatusCode::kInvalidArgument)
      << events_.finish(1).second.ToString();
  EXPECT_NE(events_.finish(1).second.message().find("top_p"), std::string::npos);
  EXPECT_EQ(events_.param(1), "top_p");
  EXPECT_EQ(backend_->Load().requests_replaced, 0u);
  EXPECT_EQ(workers_[0]->stats().prefills + workers_[1]->stats().prefills, 1);
  EXPECT_EQ(d->stats().reserves, 1);
  EXPECT_EQ(d->stats().starts, 0);
  EXPECT_TRUE(WaitAllFree(d, 64, kSlackMs));  // the lease's writer is done: released at once
  ExpectNoStrayReleaseAndNoFence(d);
}

TEST_F(ClusterBackendTest, RequestRefusedByTheDecodeWorkerIsNotAWorkerFailure) {
  // The decode worker refuses at StartDecode what the prefill worker accepted (a decode worker
  // of another version): the request ends as invalid, not placed again, not counted.
  AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d0 = AddWorker("decode-0", wire::Role::DECODE);
  auto* d1 = AddWorker("decode-1", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(2, 1));
  d0->SetRefuseParam("temperature");
  d1->SetRefuseParam("temperature");
  ASSERT_TRUE(backend_->Submit(Request(1, 5)).ok());
  ASSERT_TRUE(events_.WaitFinished(1));
  EXPECT_EQ(events_.finish(1).first, FinishReason::kError);
  EXPECT_EQ(events_.finish(1).second.code(), StatusCode::kInvalidArgument)
      << events_.finish(1).second.ToString();
  EXPECT_EQ(events_.param(1), "temperature");
  EXPECT_EQ(events_.tokens(1).size(), 1u);  // the first token, from the prefill
  EXPECT_EQ(backend_->Load().requests_replaced, 0u);
  EXPECT_EQ(workers_[0]->stats().prefills, 1);
  EXPECT_EQ(d0->stats().reserves + d1->stats().reserves, 1);
  EXPECT_EQ(d0->stats().starts + d1->stats().starts, 1);
  EXPECT_TRUE(WaitAllFree(d0, 64, kSlackMs));
  EXPECT_TRUE(WaitAllFree(d1, 64, kSlackMs));
}

TEST_F(ClusterBackendTest, AWorkersRefusalReachesTheClientAs400) {
  // The router in front of this backend. The prefill worker refuses top_p, which the router
  // accepted (a worker whose check is stricter: another version): the client gets 400 naming
  // the field, as if the router had refused it, and nothing is placed again.
  backend_->Stop();
  auto b = ClusterBackend::Create(BaseOptions());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  backend_ = std::move(*b);
  auto tok = Tokenizer::FromModelDir(PW_SOURCE_DIR "/models/tiny-moe");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  TokenizerCodec codec(std::move(*tok), ChatRenderer());
  RouterOptions ro;
  ro.model_name = "tiny-moe";
  ro.context_length = 64;
  Router front(ro, &codec, backend_.get(),
                std::make_shared<RouterMetrics>(std::make_shared<prometheus::Registry>()));
  backend_->Start();  // its events go to the router
  HttpServerOptions ho;
  ho.port = 0;
  auto server = HttpServer::Create(ho, [&](HttpRequest r, std::shared_ptr<HttpExchange> e) {
    front.Handle(std::move(r), std::move(e));
  });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  front.SetServer(server->get());
  (*server)->Start();
  // However the test ends, no event reaches the router once it is gone.
  struct StopFirst {
    std::function<void()> f;
    ~StopFirst() { f(); }
  } stop_first{[&] {
    (*server)->Stop();
    backend_->Stop();
  }};
  auto* p = AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 1));
  p->SetRefuseParam("top_p");

  router::testing::TestConnection c((*server)->port());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c.Send(router::testing::PostRequest(
      "/v1/completions",
      R"({"model":"tiny-moe","prompt":"Hi","max_tokens":2,"top_p":0.5,"temperature":1})")));
  auto resp = c.Read();
  ASSERT_TRUE(resp.has_value());
  EXPECT_EQ(resp->status, 400) << resp->body;
  auto j = nlohmann::json::parse(resp->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << resp->body;
  EXPECT_EQ(j["error"]["type"], "invalid_request_error") << resp->body;
  EXPECT_EQ(j["error"]["param"], "top_p") << resp->body;
  EXPECT_TRUE(j["error"].contains("code")) << resp->body;
  EXPECT_TRUE(j["error"]["message"].is_string()) << resp->body;
  EXPECT_EQ(backend_->Load().requests_replaced, 0u);
  EXPECT_EQ(p->stats().prefills, 1);
  EXPECT_EQ(d->stats().reserves, 1);
  EXPECT_TRUE(WaitAllFree(d, 64, kSlackMs));
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
  transport::ControlClient c(std::move(*t), pw::SteadyClock::Get(), o);
  c.fill_register = [](wire::Register::Builder r) { r.setModelName("another-model"); };
  ASSERT_TRUE(c.Start().ok());
  for (int i = 0; i < 40; ++i) c.Poll(5, nullptr);
  EXPECT_FALSE(c.registered());
  EXPECT_EQ(backend_->Load().decode_workers, 0);
}

// ---- Writer fences (docs/architecture.md, "Late KV writers") ----

// Waits until `p` holds a PrefillRequest it has not answered, then cancels the request
// through the backend: its lease becomes a fence.
void CancelWhilePrefilling(ClusterBackend* backend, ProtocolTestWorker* p,
                           ProtocolTestWorker* d, uint64_t id, uint64_t lease) {
  ASSERT_TRUE(WaitFor([&] { return p->stalled() == 1; }));
  backend->Cancel(id);
  // The decode worker quarantines the lease (Cancel without writerDone).
  ASSERT_TRUE(WaitFor([&] { return d->ended(id, lease); }))
      << "the lease was not ended on the decode worker";
}

TEST_F(ClusterBackendTest, FenceIsLiftedWhenTheLeasesKvReadyArrives) {
  // Both graces are minutes: only the KvReady can lift the fence in this test.
  ProtocolTestWorker *p = nullptr, *d = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartPrefillDecode(GraceOptions(600000, 600000), &p, &d));
  p->SetStall(true);
  p->SetLateWriter(true);  // its writes go on after the Cancel
  ASSERT_TRUE(backend_->Submit(Request(1, 5)).ok());
  CancelWhilePrefilling(backend_.get(), p, d, 1, 1);
  ASSERT_TRUE(WaitFor([&] { return p->cancel_handled_at(1).has_value(); }));
  // The prefill worker handled the Cancel, but its transfer is still running: no release.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE(d->writer_done(1).has_value()) << "released while its writer was still writing";
  EXPECT_TRUE(d->quarantined(1));
  // The writer finishes: its KvReady (sent after its puts) lifts the fence.
  p->FlushStalled();
  ASSERT_TRUE(WaitFor([&] { return d->writer_done(1).has_value(); }, kSlackMs))
      << "no writerDone after the lease's KvReady";
  auto sent = p->kv_ready_sent_at(1);
  ASSERT_TRUE(sent.has_value());
  EXPECT_GE(ElapsedMs(*sent, d->writer_done(1)->at), 0.0);
  EXPECT_EQ(d->writer_done(1)->request_id, 1u);
  EXPECT_TRUE(WaitAllFree(d, 64, kSlackMs));
  EXPECT_EQ(d->stats().starts, 0) << "a cancelled request was started";
  ExpectNoStrayReleaseAndNoFence(d);
}

TEST_F(ClusterBackendTest, FenceIsLiftedCancelGraceAfterThePrefillWorkerHandledTheCancel) {
  ClusterBackendOptions o = GraceOptions(600, 600000);
  o.dead_after_beats = 50;  // the prefill worker's slow Cancel handling is not a death
  ProtocolTestWorker *p = nullptr, *d = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartPrefillDecode(o, &p, &d));
  p->SetStall(true);
  // Handling the Cancel takes a while: the grace counts from its end (the worker's ackSeq),
  // not from when the router sent it.
  p->SetCancelDelayMs(800);
  ASSERT_TRUE(backend_->Submit(Request(1, 5)).ok());
  const auto cancelled_at = std::chrono::steady_clock::now();
  CancelWhilePrefilling(backend_.get(), p, d, 1, 1);
  ASSERT_TRUE(WaitFor([&] { return d->writer_done(1).has_value(); }, 800 + 600 + kSlackMs))
      << "the fence was not lifted after the prefill worker handled the Cancel";
  const SteadyTime released = d->writer_done(1)->at;
  auto handled = p->cancel_handled_at(1);
  ASSERT_TRUE(handled.has_value()) << "released before the prefill worker handled its Cancel";
  // Not before the grace (1 ms: the router's clock counts whole milliseconds) ...
  EXPECT_GE(ElapsedMs(*handled, released), 600.0 - 1.0);
  EXPECT_GE(ElapsedMs(cancelled_at, released), 800.0 + 600.0 - 1.0);
  // ... and soon after it.
  EXPECT_LE(ElapsedMs(*handled, released), 600.0 + kSlackMs);
  EXPECT_TRUE(WaitAllFree(d, 64, kSlackMs));
  ExpectNoStrayReleaseAndNoFence(d);
}

TEST_F(ClusterBackendTest, FenceIsLiftedCancelGraceAfterThePrefillWorkerRegistersAgain) {
  ProtocolTestWorker *p = nullptr, *d = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartPrefillDecode(GraceOptions(600, 600000), &p, &d));
  p->SetStall(true);
  ASSERT_TRUE(backend_->Submit(Request(1, 8)).ok());
  ASSERT_TRUE(WaitFor([&] { return p->stalled() == 1; }));
  // The prefill worker stops (starved, not dead) and is declared dead: its request's lease is
  // ended on the decode worker and fenced; the request waits for a prefill worker.
  p->SetPaused(true);
  ASSERT_TRUE(WaitFor([&] { return backend_->Load().prefill_workers == 0; }));
  ASSERT_TRUE(WaitFor([&] { return d->ended(1, 1); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(d->writer_done(1).has_value()) << "released while its writer may still write";
  EXPECT_TRUE(d->quarantined(1));
  // It comes back, learns it was forgotten, drops its work and registers again.
  const auto resumed_at = std::chrono::steady_clock::now();
  p->SetPaused(false);
  ASSERT_TRUE(WaitFor([&] { return d->writer_done(1).has_value(); }, 600 + kSlackMs))
      << "the fence was not lifted after the prefill worker registered again";
  const SteadyTime released = d->writer_done(1)->at;
  EXPECT_GE(ElapsedMs(resumed_at, released), 600.0 - 1.0);
  EXPECT_LE(ElapsedMs(resumed_at, released), 600.0 + kSlackMs);
  // The request was placed again on it (a new lease), and completes.
  ASSERT_TRUE(WaitFor([&] { return p->stalled() == 1; }));
  p->SetStall(false);
  p->FlushStalled();
  ASSERT_NO_FATAL_FAILURE(ExpectCompleted(1, 8, 15000));
  EXPECT_TRUE(WaitAllFree(d, 64, kSlackMs));
  ExpectNoStrayReleaseAndNoFence(d);
}

TEST_F(ClusterBackendTest, FenceIsLiftedWriterGraceAfterThePrefillWorkersDeath) {
  ProtocolTestWorker *p0 = nullptr, *d = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartPrefillDecode(GraceOptions(600000, 1200), &p0, &d));
  p0->SetStall(true);
  ASSERT_TRUE(backend_->Submit(Request(1, 8)).ok());
  ASSERT_TRUE(WaitFor([&] { return p0->stalled() == 1; }));
  const auto killed_at = std::chrono::steady_clock::now();
  p0->Kill();
  ASSERT_TRUE(WaitFor([&] { return backend_->Load().prefill_workers == 0; }));
  const auto dead_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return d->ended(1, 1); }));
  ASSERT_TRUE(WaitFor([&] { return d->writer_done(1).has_value(); }, 1200 + kSlackMs))
      << "the fence was not lifted writer_grace_ms after the prefill worker's death";
  const SteadyTime released = d->writer_done(1)->at;
  EXPECT_GE(ElapsedMs(killed_at, released), 1200.0 - 1.0);
  EXPECT_LE(ElapsedMs(dead_at, released), 1200.0 + kSlackMs);
  // Another prefill worker takes the request.
  AddWorker("prefill-1", wire::Role::PREFILL);
  ASSERT_NO_FATAL_FAILURE(ExpectCompleted(1, 8, 15000));
  EXPECT_TRUE(WaitAllFree(d, 64, kSlackMs));
  ExpectNoStrayReleaseAndNoFence(d);
}

TEST_F(ClusterBackendTest, LeaseNoPrefillWorkerHadIsReleasedAtOnce) {
  ProtocolTestWorker *unused_prefill = nullptr, *d = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartPrefillDecode(GraceOptions(600000, 600000), &unused_prefill, &d));
  // The reservation reply is late: the request is cancelled before it arrives.
  d->SetHoldReserveReplies(true);
  ASSERT_TRUE(backend_->Submit(Request(1, 5)).ok());
  ASSERT_TRUE(WaitFor([&] { return d->stats().reserves == 1; }));
  backend_->Cancel(1);
  ASSERT_TRUE(WaitFor([&] { return d->ended(1, 0); }));
  EXPECT_TRUE(d->quarantined(1)) << "Cancel{lease 0} did not end the reservation";
  d->SetHoldReserveReplies(false);
  const auto replied_at = std::chrono::steady_clock::now();
  d->FlushReserveReplies();
  ASSERT_TRUE(WaitFor([&] { return d->writer_done(1).has_value(); }, kSlackMs))
      << "a lease no prefill worker had was not released at once";
  EXPECT_LE(ElapsedMs(replied_at, d->writer_done(1)->at), double(kSlackMs));
  EXPECT_TRUE(WaitAllFree(d, 64, kSlackMs));
  ExpectNoStrayReleaseAndNoFence(d);
}

TEST_F(ClusterBackendTest, LeaseOfAFailedPrefillIsReleasedAtOnce) {
  ProtocolTestWorker *p = nullptr, *d = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartPrefillDecode(GraceOptions(600000, 600000), &p, &d));
  p->SetFailPrefill(true);  // KvReady{ok = false}: the writer is done, having failed
  ASSERT_TRUE(backend_->Submit(Request(1, 5)).ok());
  ASSERT_TRUE(events_.WaitFinished(1, 15000));
  EXPECT_EQ(events_.finish(1).first, FinishReason::kError);
  EXPECT_EQ(p->stats().prefills, 3);  // max_attempts
  // Every attempt's lease came back at once (the graces are minutes).
  EXPECT_TRUE(WaitAllFree(d, 64, kSlackMs));
  int released = 0;
  for (uint64_t lease : d->granted()) released += d->writer_done(lease).has_value() ? 1 : 0;
  EXPECT_EQ(released, 3);
  ExpectNoStrayReleaseAndNoFence(d);
}

TEST_F(ClusterBackendTest, FenceIsNeverLiftedToARestartedDecodeProcess) {
  ProtocolTestWorker *p = nullptr, *d0 = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartPrefillDecode(GraceOptions(400, 600000), &p, &d0));
  p->SetStall(true);
  ASSERT_TRUE(backend_->Submit(Request(1, 5)).ok());
  ASSERT_TRUE(WaitFor([&] { return p->stalled() == 1; }));
  ASSERT_EQ(d0->granted(), std::vector<uint64_t>{1});
  // decode-0 restarts: a new process under the same id, numbering its leases from 1 again.
  RemoveWorker(d0);
  RawDecodePeer d1(backend_->endpoint(), "decode-0", static_cast<uint32_t>(getpid()) + 1, 1);
  ASSERT_TRUE(WaitFor([&] { return d1.registered(); }));
  // The request is placed again on the new process, which grants lease 1 again: the same
  // number now names a live lease, the one prefill-0 now holds a PrefillRequest for.
  ASSERT_TRUE(WaitFor([&] { return d1.granted().size() == 1; }));
  EXPECT_EQ(d1.granted()[0], 1u);
  ASSERT_TRUE(WaitFor([&] { return p->cancel_handled_at(1).has_value(); }));
  // The first lease's fence comes due cancel_grace_ms after prefill-0 handled its Cancel; the
  // process that granted it is gone, so nothing may be sent.
  std::this_thread::sleep_for(std::chrono::milliseconds(400 + kSlackMs));
  for (const CancelSeen& c : d1.cancels()) {
    EXPECT_FALSE(c.writer_done) << "writerDone for lease " << c.lease_id
                                << " sent to a process that never granted it";
  }
  backend_->Stop();
  EXPECT_EQ(backend_->fences(), 0u) << "the fence of the old process was kept";
}

TEST_F(ClusterBackendTest, LateKvReadyForARestartedDecodeProcessReleasesNothing) {
  ProtocolTestWorker *p = nullptr, *d0 = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartPrefillDecode(GraceOptions(600000, 600000), &p, &d0));
  p->SetStall(true);
  p->SetLateWriter(true);
  ASSERT_TRUE(backend_->Submit(Request(1, 5)).ok());
  ASSERT_TRUE(WaitFor([&] { return p->stalled() == 1; }));
  RemoveWorker(d0);
  RawDecodePeer d1(backend_->endpoint(), "decode-0", static_cast<uint32_t>(getpid()) + 1, 1000);
  ASSERT_TRUE(WaitFor([&] { return d1.granted().size() == 1; }));
  ASSERT_TRUE(WaitFor([&] { return p->stalled() == 2; }));
  // The writer of the old lease finishes (its KvReady lifts that fence), and so does the new
  // placement's prefill, which starts on the new process.
  p->FlushStalled();
  ASSERT_TRUE(WaitFor([&] { return d1.started().size() == 1; }));
  EXPECT_EQ(d1.started()[0], 1000u);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (const CancelSeen& c : d1.cancels()) {
    EXPECT_FALSE(c.writer_done) << "writerDone for lease " << c.lease_id
                                << " sent to a process that never granted it";
  }
  backend_->Stop();
  EXPECT_EQ(backend_->fences(), 0u);
}

TEST_F(ClusterBackendTest, ReplyToAnEarlierReservationIsNotTakenForTheCurrentOne) {
  // A reservation with no answer in time is cancelled (Cancel{lease 0}: the decode worker
  // quarantines whatever the request holds) and placed again, here on the same decode worker.
  // Its answer to the first KvReserve then arrives while the second is pending: it names a
  // lease that is quarantined by now, and must not be used for the new placement.
  ClusterBackendOptions o = BaseOptions();
  o.phase_timeout_ms = 600;
  o.dead_after_beats = 50;  // the decode worker's slow KvReserve is not a death
  o.max_attempts = 10;      // a loaded machine may time out the second placement too
  Restart(o);
  auto* p = AddWorker("prefill-0", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE);
  ASSERT_TRUE(WaitCapacity(1, 1));
  d->SetNextReserveDelayMs(1000);
  ASSERT_TRUE(backend_->Submit(Request(1, 6)).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectCompleted(1, 6, 15000));
  EXPECT_GE(d->stats().reserves, 2);
  EXPECT_EQ(d->stats().refused_starts, 0) << "StartDecode named the quarantined first lease";
  EXPECT_EQ(p->stats().prefills, 1);
  // The first lease was released at once (no prefill worker had it).
  ASSERT_GE(d->granted().size(), 2u);
  EXPECT_TRUE(WaitFor([&] { return d->writer_done(d->granted()[0]).has_value(); }, kSlackMs));
  EXPECT_TRUE(WaitAllFree(d, 64, kSlackMs));
  EXPECT_EQ(d->stats().stray_writer_done, 0);
}

TEST_F(ClusterBackendTest, EveryFenceIsLiftedUnderCancelsTimeoutsAndADeath) {
  ClusterBackendOptions o = BaseOptions();
  o.cancel_grace_ms = 200;
  o.writer_grace_ms = 800;
  o.phase_timeout_ms = 700;
  Restart(o);
  auto* p0 = AddWorker("prefill-0", wire::Role::PREFILL);
  auto* p1 = AddWorker("prefill-1", wire::Role::PREFILL);
  auto* p2 = AddWorker("prefill-2", wire::Role::PREFILL);
  auto* d = AddWorker("decode-0", wire::Role::DECODE, 256);
  ASSERT_TRUE(WaitCapacity(1, 3));
  // prefill-0 and prefill-1 (placed on first when queues tie) never answer: their requests
  // time out and are placed again elsewhere; prefill-1 handles the Cancels (its fences end
  // cancel_grace_ms later), prefill-0 dies (its fences end writer_grace_ms after its death).
  p0->SetStall(true);
  p1->SetStall(true);
  constexpr uint64_t kRequests = 24;
  for (uint64_t id = 1; id <= kRequests; ++id) {
    ASSERT_TRUE(backend_->Submit(Request(id, 40)).ok());
    if (id % 3 == 0) backend_->Cancel(id);  // at once, in whatever phase it is
    if (id % 6 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (uint64_t id = 2; id <= kRequests; id += 3) backend_->Cancel(id);  // a bit later
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  p0->Kill();
  for (uint64_t id = 1; id <= kRequests; id += 3) {
    ASSERT_TRUE(events_.WaitFinished(id, 20000)) << id;
    EXPECT_EQ(events_.finish(id).first, FinishReason::kLength)
        << id << ": " << events_.finish(id).second.ToString();
    EXPECT_EQ(events_.tokens(id), Reference({5, 6, 7}, 40)) << id;
  }
  EXPECT_GT(p0->stats().prefills, 0);
  EXPECT_GT(p1->stats().prefills, 0);
  EXPECT_GT(p2->stats().prefills, 0);
  EXPECT_TRUE(WaitAllFree(d, 256, 20000))
      << "free " << d->free_blocks() << ", quarantined " << d->quarantined_blocks();
  EXPECT_EQ(d->running(), 0u);
  EXPECT_EQ(d->stats().stray_writer_done, 0);
  EXPECT_EQ(d->stats().refused_starts, 0);
  EXPECT_TRUE(events_.violations().empty());
  backend_->Stop();
  EXPECT_EQ(backend_->fences(), 0u);
}

}  // namespace
}  // namespace pw::router
