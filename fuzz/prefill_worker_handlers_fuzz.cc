// libFuzzer target: the router's frames into a prefill worker's control thread
// (services/workers/prefill/prefill_worker.h: PrefillRequest, Cancel, Drain; what an insider with
// the node's control keys can send it). A real PrefillWorker on the embedded model
// models/tiny-moe (engine, UCX; no broker), its replies read back from its ZeroMQ link to a
// socket bound here (fuzz/worker_link.h). The input is a sequence of frames, each
// [length u16 LE][bytes], passed through a registered ControlClient to
// PrefillWorker::HandleRouter. The worker is not Run: its compute thread (Prepare: the checks
// of the decode layout, block ids and region a request names, then the forward passes and the
// puts) is not reached here; the handler keeps each PrefillRequest, queues, cancels, drains.
//
// The worker lives across inputs (loading the model per input would leave a few runs per
// second): after each input every request it named is cancelled, and a worker told to drain is
// replaced. Nothing the router sends may crash or abort the worker; a PrefillRequest while
// draining is answered; every frame it sends parses.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/logging.h"
#include "fuzz/worker_link.h"
#include "services/workers/prefill/prefill_worker.h"

namespace {

namespace proto = pw::proto;
namespace wire = pw::wire;
using pw::fuzz::Framed;
using pw::fuzz::RouterFrame;

constexpr const char* kWorkerId = "prefill-fuzz";

struct Worker {
  pw::fuzz::RouterEnd router;
  pw::ManualClock clock{1000};
  std::unique_ptr<pw::workers::PrefillWorker> worker;
  bool drained = false;

  Worker() {
    pw::workers::PrefillWorkerOptions o;
    o.id = kWorkerId;
    o.model_dir = std::string(PW_SOURCE_DIR) + "/models/tiny-moe";
    o.router_endpoints = {router.endpoint()};
    o.num_kv_blocks = 64;
    o.max_batch_tokens = 64;
    auto w = pw::workers::PrefillWorker::Create(o, &clock);
    if (!w.ok()) {
      PW_LOG(ERROR) << "prefill worker: " << w.status().ToString();
      PW_CHECK_MSG(false, "the fuzz target's prefill worker did not start");
    }
    worker = std::move(*w);
  }
  void Cancel(uint64_t id) {
    proto::OutMessage m;
    m.body().initCancel().setRequestId(id);
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
  pw::fuzz::RouterLink link(kWorkerId, wire::Role::PREFILL);
  std::set<uint64_t> named;  // request ids the input's accepted frames named
  auto handler = [&](const std::string&, const proto::InMessage& m) -> pw::Status {
    const auto which = m.which();
    auto body = m.body();
    if (which == proto::Body::PREFILL_REQUEST) {
      named.insert(body.getPrefillRequest().getRequestId());
    }
    if (which == proto::Body::CANCEL) named.insert(body.getCancel().getRequestId());
    const bool was_draining = w.drained;
    if (which == proto::Body::DRAIN) w.drained = true;
    pw::Status st = w.worker->HandleRouter(m);
    if (which == proto::Body::PREFILL_REQUEST && was_draining) {
      // Refused at once with KvReady{ok = false}.
      bool answered = false;
      w.router.Read(10000, [&](const proto::InMessage& r) {
        answered = r.which() == proto::Body::KV_READY && !r.body().getKvReady().getOk();
        return answered;
      });
      PW_CHECK_MSG(answered, "a PrefillRequest while draining was not refused");
    }
    return st;
  };
  for (std::string& bytes : pw::fuzz::SplitFrames(data, size)) {
    link.Deliver(std::move(bytes), handler);
  }
  for (uint64_t id : named) w.Cancel(id);  // leave nothing queued for the next input
  w.router.Read(0, nullptr);
  return 0;
}

// Frames of every kind the router sends (seq from 2).
std::vector<std::string> PwFuzzSeeds() {
  auto prefill = [](uint64_t seq, uint64_t id, uint64_t lease, uint32_t tokens) {
    proto::OutMessage m;
    auto p = m.body().initPrefillRequest();
    p.setRequestId(id);
    auto t = p.initTokens(tokens);
    for (unsigned i = 0; i < tokens; ++i) t.set(i, 10 + i);
    auto s = p.initSampling();
    s.setTemperature(0.7f);
    s.setTopP(0.9f);
    s.setSeed(id);
    s.setMaxTokens(8);
    s.initStopTokenIds(1).set(0, 0);
    s.setLogprobs(2);
    p.setDecodeWorkerId("decode-0");
    auto mem = p.initDecodeMemory();
    mem.setWorkerAddress(proto::AsData("worker-address"));
    mem.setRkey(proto::AsData("rkey"));
    mem.setBaseAddr(0x10000);
    mem.setBytes(64 * 4096);
    auto l = p.initDecodeLayout();
    l.setNumBlocks(64);
    l.setBlockTokens(16);
    l.setLayoutHash(42);
    const unsigned blocks = (tokens + 15) / 16;
    auto b = p.initBlockIds(blocks);
    for (unsigned i = 0; i < blocks; ++i) b.set(i, i);
    p.setLeaseId(lease);
    p.setPromptLogprobs(1);
    return Framed(RouterFrame(m, seq));
  };
  auto cancel = [](uint64_t seq, uint64_t id, uint64_t lease) {
    proto::OutMessage m;
    auto c = m.body().initCancel();
    c.setRequestId(id);
    c.setLeaseId(lease);
    return Framed(RouterFrame(m, seq));
  };
  auto drain = [](uint64_t seq) {
    proto::OutMessage m;
    m.body().initDrain().setDeadlineMs(1000);
    return Framed(RouterFrame(m, seq));
  };
  return {
      prefill(2, 1, 11, 5) + prefill(3, 2, 12, 40) + cancel(4, 1, 11) + cancel(5, 2, 0),
      prefill(2, 3, 13, 5) + prefill(3, 4, 14, 5) + cancel(4, 3, 99),
      drain(2) + prefill(3, 5, 15, 5),
  };
}
