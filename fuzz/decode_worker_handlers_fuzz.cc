// libFuzzer target: the router's frames into a decode worker (services/workers/decode/
// decode_worker.h: KvReserve, StartDecode, Cancel, Drain; what an insider with the node's control
// keys can send it). A real DecodeWorker on the embedded model models/tiny-moe (engine, page
// pool, UCX registration; no broker), its replies read back from its ZeroMQ link to a socket
// bound here (fuzz/worker_link.h). The input is a sequence of frames, each [length u16 LE]
// [bytes], passed through a registered ControlClient to DecodeWorker::HandleRouter. Lease ids
// are random per process, so a StartDecode or Cancel whose leaseId is k in 1..n (n leases
// granted so far in this input) is given the k-th granted lease instead.
//
// The worker lives across inputs (loading the model per input would leave a few runs per
// second): after each input every request it named is cancelled and every lease granted is
// released as writer-done, and a worker that was told to drain is replaced. Nothing the router
// sends may crash or abort the worker; every KvReserve is answered; every frame it sends parses.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/logging.h"
#include "fuzz/worker_link.h"
#include "services/workers/decode/decode_worker.h"

namespace {

namespace proto = pw::proto;
namespace wire = pw::wire;
using pw::fuzz::Framed;
using pw::fuzz::RouterFrame;

constexpr const char* kWorkerId = "decode-fuzz";

struct Worker {
  pw::fuzz::RouterEnd router;
  pw::ManualClock clock{1000};
  std::unique_ptr<pw::workers::DecodeWorker> worker;
  bool drained = false;

  Worker() {
    pw::workers::DecodeWorkerOptions o;
    o.id = kWorkerId;
    o.model_dir = std::string(PW_SOURCE_DIR) + "/models/tiny-moe";
    o.router_endpoints = {router.endpoint()};
    o.num_kv_blocks = 256;
    o.max_batch = 8;
    o.max_batch_tokens = 64;
    auto w = pw::workers::DecodeWorker::Create(o, &clock);
    if (!w.ok()) {
      PW_LOG(ERROR) << "decode worker: " << w.status().ToString();
      PW_CHECK_MSG(false, "the fuzz target's decode worker did not start");
    }
    worker = std::move(*w);
  }
  // `id`'s Cancel (leaseId 0, or a named lease writer-done), straight to the handler.
  void Cancel(uint64_t id, uint64_t lease, bool writer_done) {
    proto::OutMessage m;
    auto c = m.body().initCancel();
    c.setRequestId(id);
    c.setLeaseId(lease);
    c.setWriterDone(writer_done);
    auto in = proto::InMessage::Parse(RouterFrame(m, 1));
    PW_CHECK(in.ok());
    PW_CHECK(worker->HandleRouter(**in).ok());
  }
};

Worker& TheWorker() {
  static std::unique_ptr<Worker> w;
  if (!w || w->drained) {
    w.reset();
    w = std::make_unique<Worker>();
  }
  return *w;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {  // every refusal is logged: keep the run fast
    pw::SetLogLevel(pw::LogLevel::kError);
    return true;
  }();
  (void)quiet;
  Worker& w = TheWorker();
  pw::fuzz::RouterLink link(kWorkerId, wire::Role::DECODE);
  std::vector<uint64_t> granted;
  std::set<uint64_t> named;  // request ids the input's accepted frames named
  auto handler = [&](const std::string&, const proto::InMessage& m) -> pw::Status {
    const auto which = m.which();
    auto body = m.body();
    if (which == proto::Body::KV_RESERVE) named.insert(body.getKvReserve().getRequestId());
    if (which == proto::Body::START_DECODE) named.insert(body.getStartDecode().getRequestId());
    if (which == proto::Body::CANCEL) named.insert(body.getCancel().getRequestId());
    if (which == proto::Body::DRAIN) w.drained = true;
    pw::Status st = w.worker->HandleRouter(m);
    if (which == proto::Body::KV_RESERVE) {
      // Answered at once (no reserve wait configured): the reply is on its way.
      bool answered = false;
      w.router.Read(10000, [&](const proto::InMessage& r) {
        if (r.which() != proto::Body::KV_RESERVE_REPLY) return false;
        auto reply = r.body().getKvReserveReply();
        if (reply.getOk()) granted.push_back(reply.getLeaseId());
        answered = true;
        return true;
      });
      PW_CHECK_MSG(answered, "a KvReserve was not answered");
    }
    return st;
  };
  for (std::string& bytes : pw::fuzz::SplitFrames(data, size)) {
    // The k-th lease granted, for a leaseId k (see the file comment).
    auto m = proto::InMessage::Parse(bytes);
    if (m.ok() && (*m)->which() != proto::Body::KV_RESERVE) {
      uint64_t k = 0;
      (void)proto::GuardWire("lease", [&]() -> pw::Status {
        auto body = (*m)->body();
        if ((*m)->which() == proto::Body::START_DECODE) k = body.getStartDecode().getLeaseId();
        if ((*m)->which() == proto::Body::CANCEL) k = body.getCancel().getLeaseId();
        return pw::Status::Ok();
      });
      if (k >= 1 && k <= granted.size()) bytes = pw::fuzz::WithLease(bytes, granted[k - 1]);
    }
    link.Deliver(std::move(bytes), handler);
  }
  // Leave nothing for the next input.
  for (uint64_t id : named) w.Cancel(id, 0, false);
  for (uint64_t id : named) {
    for (uint64_t lease : granted) w.Cancel(id, lease, true);
  }
  w.router.Read(0, nullptr);
  return 0;
}

// Frames of every kind the router sends, in the orders it sends them (seq from 2).
std::vector<std::string> PwFuzzSeeds() {
  auto reserve = [](uint64_t seq, uint64_t id, uint32_t tokens) {
    proto::OutMessage m;
    auto r = m.body().initKvReserve();
    r.setRequestId(id);
    r.setNumTokens(tokens);
    r.setLeaseMs(10000);
    r.setMaxTokens(8);
    return Framed(RouterFrame(m, seq));
  };
  auto start = [](uint64_t seq, uint64_t id, uint64_t lease, uint32_t prompt, uint32_t generated,
                  uint32_t uncached, float temperature) {
    proto::OutMessage m;
    auto s = m.body().initStartDecode();
    s.setRequestId(id);
    s.setLeaseId(lease);
    auto t = s.initTokens(prompt + generated - 1);
    for (unsigned i = 0; i < t.size(); ++i) t.set(i, 10 + i);
    s.setFirstToken(42);
    auto p = s.initSampling();
    p.setTemperature(temperature);
    p.setTopK(4);
    p.setSeed(7);
    p.setMaxTokens(8);
    p.initStopTokenIds(1).set(0, 0);
    p.setLogprobs(id % 2 == 0 ? 2 : -1);
    s.setGeneratedSoFar(generated);
    s.setUncachedTokens(uncached);
    s.initPromptRouting(4).set(1, 3);
    return Framed(RouterFrame(m, seq));
  };
  auto cancel = [](uint64_t seq, uint64_t id, uint64_t lease, bool writer_done) {
    proto::OutMessage m;
    auto c = m.body().initCancel();
    c.setRequestId(id);
    c.setLeaseId(lease);
    c.setWriterDone(writer_done);
    return Framed(RouterFrame(m, seq));
  };
  auto drain = [](uint64_t seq) {
    proto::OutMessage m;
    m.body().initDrain().setDeadlineMs(1000);
    return Framed(RouterFrame(m, seq));
  };
  return {
      // reserve, start, cancel while running
      reserve(2, 1, 5) + start(3, 1, 1, 5, 1, 0, 0.f) + cancel(4, 1, 0, false),
      // two reservations; one cancelled (quarantined) then writer-done, one started after
      // tokens were streamed elsewhere (KV of the streamed ones computed here)
      reserve(2, 2, 20) + reserve(3, 3, 22) + cancel(4, 2, 1, false) + cancel(5, 2, 1, true) +
          start(6, 3, 2, 20, 3, 2, 0.7f),
      // refusals: no tokens, a lease that is not live, sampling out of range
      reserve(2, 4, 0) + start(3, 4, 99, 5, 1, 0, 0.f) + reserve(4, 5, 3) +
          start(5, 5, 1, 3, 1, 0, -1.f),
      // writer-done for a lease still live, then a StartDecode for it
      reserve(2, 6, 9) + cancel(3, 6, 1, true) + start(4, 6, 1, 9, 1, 0, 0.f),
      // drain, then a reservation
      drain(2) + reserve(3, 7, 4),
  };
}
