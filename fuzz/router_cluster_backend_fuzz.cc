// libFuzzer target: control-plane frames from the router's own workers, registered and trusted,
// into ClusterBackend (services/router/cluster_backend.h): what an insider with the node's
// control keys, or a worker gone wrong, can send. The backend runs in memory (its second
// Create: an in-memory transport and a manual clock, no thread), with two decode workers and a
// prefill worker registered and four requests in flight in every phase: decoding (streamed
// tokens), prefilling, reserving, and one asking for log-probabilities. The input is a sequence
// of steps, each [control u8][length u16 LE][frame bytes]: control & 3 picks the sender
// (decode-0, decode-1, prefill-0, a stranger), bits 2..4 advance the clock by that many
// heartbeats of 100 ms (phase timeouts, fences and deaths fall due), bit 7 cancels request
// 1 + (control >> 5 & 3) first. After each step the backend runs one turn of its loop.
// Nothing a worker sends may crash the router, and the events keep GenerationEvents' promises:
// no index skipped, nothing after a request's end, at most one end per request.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "common/logging.h"
#include "services/proto/codec.h"
#include "services/router/cluster_backend.h"

// No input (at most 64 frames of 64 KiB) may make the router allocate this much at once. A
// KvReady whose promptLogprobs was a long list of empty structs (no bytes per entry on the
// wire, 40 in the router) once did, before its count was checked
// (fuzz/corpus/router_cluster_backend_fuzz/kvready-empty-prompt-logprobs). The smoke binary
// checks it here; libFuzzer has its own bound (-malloc_limit_mb, by default -rss_limit_mb, 2048 in
// tools/fuzz.sh) and allocates
// with the sanitizer's operator new itself, so its binary keeps that one.
#ifndef PW_LIBFUZZER
constexpr size_t kMaxAllocation = size_t{256} << 20;

void* operator new(size_t n) {
  PW_CHECK_MSG(n <= kMaxAllocation, "an allocation of 256 MiB or more");
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  PW_CHECK_MSG(n <= kMaxAllocation, "an allocation of 256 MiB or more");
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
#endif

namespace {

using pw::transport::Frame;
namespace proto = pw::proto;
namespace wire = pw::wire;

const char* const kPeers[] = {"decode-0", "decode-1", "prefill-0", "stranger"};
constexpr uint64_t kRequests = 4;

// Hands queued frames to Recv; keeps what the backend sends.
class QueueTransport final : public pw::transport::Transport {
 public:
  QueueTransport(std::deque<Frame>* in, std::vector<Frame>* out) : in_(in), out_(out) {}
  pw::Status Send(std::string_view peer, std::string_view bytes) override {
    out_->push_back({std::string(peer), std::string(bytes)});
    return pw::Status::Ok();
  }
  pw::Result<std::optional<Frame>> Recv(int) override {
    if (in_->empty()) return std::optional<Frame>();
    Frame f = std::move(in_->front());
    in_->pop_front();
    return std::optional<Frame>(std::move(f));
  }
  std::string Describe() const override { return "fuzz queue"; }

 private:
  std::deque<Frame>* in_;
  std::vector<Frame>* out_;
};

class NullTransport final : public pw::transport::Transport {
 public:
  pw::Status Send(std::string_view, std::string_view) override { return pw::Status::Ok(); }
  pw::Result<std::optional<Frame>> Recv(int) override { return std::optional<Frame>(); }
  std::string Describe() const override { return "fuzz waker"; }
};

// Every request's max_tokens; request 4's log-probability alternatives (tokens, prompt).
constexpr int kMaxTokens = 8;
constexpr int kAlternatives = 2;
constexpr int kPromptAlternatives = 1;

// Checks the promises of GenerationEvents (services/router/backend.h), and that nothing a worker
// sends makes the router deliver more than a request asked for.
class CheckedEvents final : public pw::router::GenerationEvents {
 public:
  void OnTokens(uint64_t id, uint32_t start_index, std::vector<int32_t> tokens,
                std::vector<pw::router::TokenLogprob> logprobs) override {
    PW_CHECK_MSG(!finished_.count(id), "tokens after the request's end");
    PW_CHECK_MSG(start_index <= delivered_[id], "a token index skipped");
    PW_CHECK(logprobs.empty() || logprobs.size() == tokens.size());
    delivered_[id] = std::max<uint64_t>(delivered_[id], start_index + tokens.size());
    PW_CHECK_MSG(delivered_[id] <= uint64_t{kMaxTokens}, "tokens past max_tokens");
    for (const auto& lp : logprobs) {
      PW_CHECK_MSG(lp.top.size() <= size_t{kAlternatives}, "more alternatives than asked for");
    }
  }
  void OnPromptLogprobs(uint64_t id, std::vector<pw::router::TokenLogprob> lps) override {
    PW_CHECK_MSG(!finished_.count(id), "prompt log-probabilities after the request's end");
    PW_CHECK_MSG(delivered_[id] == 0, "prompt log-probabilities after tokens");
    for (const auto& lp : lps) {
      PW_CHECK_MSG(lp.top.size() <= size_t{kPromptAlternatives}, "more prompt alternatives than asked for");
    }
  }
  void OnFinished(uint64_t id, pw::router::FinishReason, pw::Status, std::string) override {
    PW_CHECK_MSG(finished_.insert(id).second, "a request ended twice");
  }

 private:
  std::map<uint64_t, uint64_t> delivered_;
  std::set<uint64_t> finished_;
};

// One worker's side of its link: numbers its frames, acknowledges the router's.
struct Link {
  uint64_t seq = 0;    // last seq sent
  uint64_t acked = 0;  // last router seq seen
  uint32_t pid = 0;
};

// The backend with its workers registered and its requests placed, as every input starts.
struct Fixture {
  pw::ManualClock clock{1000};
  std::deque<Frame> in;
  std::vector<Frame> out;
  size_t out_seen = 0;
  CheckedEvents events;
  std::unique_ptr<pw::router::ClusterBackend> backend;
  std::map<std::string, Link> links;
  // Per request: its decode worker and lease (0 while reserving).
  std::map<uint64_t, std::string> decode_of;
  std::map<uint64_t, uint64_t> lease_of;

  std::string Stamp(const std::string& peer, proto::OutMessage& m) {
    Link& l = links[peer];
    m.envelope().setAckSeq(l.acked);
    return proto::Encode(m, ++l.seq, peer, clock.NowMs());
  }
  void Deliver(const std::string& peer, proto::OutMessage& m) {
    in.push_back({peer, Stamp(peer, m)});
    Turn();
  }
  // One loop turn; then reads what the router sent (acks, reservations).
  void Turn() {
    backend->RunOnce(0);
    for (; out_seen < out.size(); ++out_seen) {
      const auto& f = out[out_seen];
      auto m = proto::InMessage::Parse(f.bytes);
      PW_CHECK_MSG(m.ok(), "the router sent a frame it cannot parse");
      links[f.peer].acked = (*m)->seq();
      if ((*m)->which() == proto::Body::KV_RESERVE) {
        decode_of[(*m)->body().getKvReserve().getRequestId()] = f.peer;
      }
    }
  }
  void Register(const std::string& peer, wire::Role role, uint32_t pid) {
    links[peer].pid = pid;
    proto::OutMessage m;
    auto r = m.body().initRegister();
    r.setRole(role);
    r.setWorkerId(peer);
    r.setPid(pid);
    r.setModelName("tiny-moe");
    r.setHeartbeatIntervalMs(100);
    r.setMaxBatch(role == wire::Role::DECODE ? 2 : 8);
    r.setMaxContext(2048);
    auto l = r.initKvLayout();
    l.setNumBlocks(64);
    l.setBlockTokens(16);
    l.setLayoutHash(42);
    if (role == wire::Role::DECODE) {
      auto mem = r.initKvMemory();
      mem.setWorkerAddress(proto::AsData("worker-address"));
      mem.setRkey(proto::AsData("rkey"));
      mem.setBaseAddr(0x10000);
      mem.setBytes(64 * 4096);
    }
    Deliver(peer, m);
  }
  void Heartbeat(const std::string& peer, uint32_t free_blocks) {
    proto::OutMessage m;
    auto h = m.body().initHeartbeat();
    h.setFreeKvBlocks(free_blocks);
    Deliver(peer, m);
  }
  void Grant(uint64_t id, uint64_t lease) {
    proto::OutMessage m;
    auto r = m.body().initKvReserveReply();
    r.setRequestId(id);
    r.setOk(true);
    r.setLeaseId(lease);
    auto blocks = r.initBlockIds(2);
    blocks.set(0, static_cast<uint32_t>(2 * lease));
    blocks.set(1, static_cast<uint32_t>(2 * lease + 1));
    lease_of[id] = lease;
    Deliver(decode_of[id], m);
  }
  void Ready(uint64_t id, uint32_t first) {
    proto::OutMessage m;
    auto k = m.body().initKvReady();
    k.setRequestId(id);
    k.setOk(true);
    k.setFirstToken(first);
    k.setNumTokens(3);
    k.setLeaseId(lease_of[id]);
    k.setDecodeWorkerId(decode_of[id]);
    Deliver("prefill-0", m);
  }
  void Chunk(uint64_t id, uint32_t start, std::vector<uint32_t> tokens) {
    proto::OutMessage m;
    auto c = m.body().initTokenChunk();
    c.setRequestId(id);
    c.setStartIndex(start);
    proto::FillU32([&](unsigned n) { return c.initTokens(n); }, tokens);
    Deliver(decode_of[id], m);
  }

  Fixture() {
    pw::router::ClusterBackendOptions o;
    o.model_name = "tiny-moe";
    o.heartbeat_ms = 100;
    o.phase_timeout_ms = 1000;
    o.writer_grace_ms = 3000;
    o.cancel_grace_ms = 500;
    backend = pw::router::ClusterBackend::Create(o, std::make_unique<QueueTransport>(&in, &out),
                                                 std::make_unique<NullTransport>(), &clock, "fuzz");
    backend->SetEvents(&events);
    Register("decode-0", wire::Role::DECODE, 11);
    Register("decode-1", wire::Role::DECODE, 12);
    Register("prefill-0", wire::Role::PREFILL, 21);
    Heartbeat("decode-0", 64);
    Heartbeat("decode-1", 60);
    for (uint64_t id = 1; id <= kRequests; ++id) {
      pw::router::GenerationRequest r;
      r.id = id;
      r.prompt = {5, 6, 7};
      r.sampling.max_tokens = kMaxTokens;
      r.sampling.has_seed = true;
      if (id == 4) {
        r.sampling.logprobs = kAlternatives;
        r.sampling.prompt_logprobs = kPromptAlternatives;
      }
      PW_CHECK(backend->Submit(std::move(r)).ok());
    }
    Turn();
    PW_CHECK_MSG(decode_of.size() == kRequests, "the fixture's requests were not all placed");
    // 1: decoding, two tokens streamed; 2: prefilling; 3: reserving; 4: prefilling.
    Grant(1, 7);
    Ready(1, 100);
    Chunk(1, 1, {101, 102});
    Grant(2, 8);
    Grant(4, 9);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {  // every refusal is logged: keep the run fast
    pw::SetLogLevel(pw::LogLevel::kError);
    return true;
  }();
  (void)quiet;
  Fixture fx;
  size_t at = 0;
  for (int steps = 0; at + 3 <= size && steps < 64; ++steps) {
    const uint8_t control = data[at];
    uint16_t len;
    std::memcpy(&len, data + at + 1, 2);
    at += 3;
    len = static_cast<uint16_t>(std::min<size_t>(len, size - at));
    if (control & 0x80) fx.backend->Cancel(1 + (control >> 5 & 3));
    fx.clock.Advance(100 * (control >> 2 & 7));
    fx.in.push_back(
        {kPeers[control & 3], std::string(reinterpret_cast<const char*>(data + at), len)});
    at += len;
    fx.Turn();
  }
  return 0;
}

// Well-formed frames of every kind a worker sends, numbered to follow the fixture's, for the
// requests and leases it holds.
std::vector<std::string> PwFuzzSeeds() {
  pw::SetLogLevel(pw::LogLevel::kError);
  Fixture fx;  // the same placements every input starts from
  const std::map<std::string, Link> start = fx.links;  // each seed numbers from there
  auto step = [&](const std::string& peer, proto::OutMessage& m, uint8_t advance = 0) {
    uint8_t who = 0;
    while (kPeers[who] != peer) ++who;
    const std::string bytes = fx.Stamp(peer, m);
    std::string s(1, static_cast<char>(who | advance << 2));
    const uint16_t len = static_cast<uint16_t>(bytes.size());
    s.append(reinterpret_cast<const char*>(&len), 2);
    return s + bytes;
  };
  std::vector<std::string> seeds;
  {  // request 1 streams on, then ends
    fx.links = start;
    proto::OutMessage a, b;
    auto c = a.body().initTokenChunk();
    c.setRequestId(1);
    c.setStartIndex(3);
    c.initTokens(2).set(1, 104);
    auto f = b.body().initFinish();
    f.setRequestId(1);
    f.setReason(wire::FinishReason::LENGTH);
    f.setNumGenerated(5);
    std::string s = step(fx.decode_of[1], a);
    s += step(fx.decode_of[1], b);
    seeds.push_back(s);
  }
  {  // request 2's prefill is done; request 4's fails as the request's own fault
    fx.links = start;
    proto::OutMessage a, b;
    auto k = a.body().initKvReady();
    k.setRequestId(2);
    k.setOk(true);
    k.setFirstToken(200);
    k.setNumTokens(3);
    k.setLeaseId(fx.lease_of[2]);
    k.setDecodeWorkerId(fx.decode_of[2]);
    k.initPromptRouting(4).set(2, 1);
    auto k4 = b.body().initKvReady();
    k4.setRequestId(4);
    k4.setOk(false);
    k4.setError("temperature refused");
    k4.setErrorKind(wire::ErrorKind::INVALID_REQUEST);
    k4.setErrorParam("temperature");
    k4.setLeaseId(fx.lease_of[4]);
    k4.setDecodeWorkerId(fx.decode_of[4]);
    std::string s = step("prefill-0", a);
    s += step("prefill-0", b);
    seeds.push_back(s);
  }
  {  // request 4's prefill with its log-probabilities (one per prompt token after the first)
    fx.links = start;
    proto::OutMessage a;
    auto k = a.body().initKvReady();
    k.setRequestId(4);
    k.setOk(true);
    k.setFirstToken(400);
    k.setNumTokens(3);
    k.setLeaseId(fx.lease_of[4]);
    k.setDecodeWorkerId(fx.decode_of[4]);
    auto first = k.initFirstLogprob();
    first.setToken(400);
    first.setLogprob(-0.5f);
    first.initTopTokens(2).set(0, 400);
    first.initTopLogprobs(2).set(0, -0.5f);
    auto lps = k.initPromptLogprobs(2);
    for (unsigned i = 0; i < 2; ++i) {
      lps[i].setToken(6 + i);
      lps[i].setLogprob(-1.0f);
      lps[i].initTopTokens(1).set(0, 6 + i);
      lps[i].initTopLogprobs(1).set(0, -1.0f);
    }
    seeds.push_back(step("prefill-0", a));
  }
  {  // request 3's reservation granted, then refused (late); two heartbeats later, draining
    fx.links = start;
    proto::OutMessage a, b, c;
    auto r = a.body().initKvReserveReply();
    r.setRequestId(3);
    r.setOk(true);
    r.setLeaseId(11);
    r.initBlockIds(1).set(0, 30);
    r.initPageIds(1).set(0, 30);
    auto n = b.body().initKvReserveReply();
    n.setRequestId(3);
    n.setOk(false);
    n.setError("no free KV blocks");
    auto h = c.body().initHeartbeat();
    h.setFreeKvBlocks(3);
    h.setDraining(true);
    std::string s = step(fx.decode_of[3], a);
    s += step(fx.decode_of[3], b);
    s += step(fx.decode_of[3], c, 2);
    s += step("prefill-0", c, 2);
    seeds.push_back(s);
  }
  {  // request 1 errors on its worker; telemetry; a cancelled prefill
    fx.links = start;
    proto::OutMessage a, b, c;
    auto f = a.body().initFinish();
    f.setRequestId(1);
    f.setReason(wire::FinishReason::ERROR);
    f.setError("engine failed");
    b.body().initTelemetry().initExpertMass(4).set(1, 0.5f);
    auto f2 = c.body().initFinish();
    f2.setRequestId(2);
    f2.setReason(wire::FinishReason::CANCELLED);
    std::string s = step(fx.decode_of[1], a);
    s += step(fx.decode_of[1], b);
    s += step("prefill-0", c);
    seeds.push_back(s);
  }
  {  // the prefill worker registers again (same process): it dropped what it held
    fx.links = start;
    proto::OutMessage a;
    auto r = a.body().initRegister();
    r.setRole(wire::Role::PREFILL);
    r.setWorkerId("prefill-0");
    r.setPid(21);
    r.setModelName("tiny-moe");
    r.setHeartbeatIntervalMs(100);
    auto l = r.initKvLayout();
    l.setNumBlocks(64);
    l.setBlockTokens(16);
    l.setLayoutHash(42);
    seeds.push_back(step("prefill-0", a));
  }
  return seeds;
}
