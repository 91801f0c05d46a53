// Worker deadlines read the injected clock (pw::Clock), not the wall clock: a decode
// worker run in this process with a ManualClock, the test acting as its router.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "common/clock.h"
#include "services/transport/control.h"
#include "services/transport/zmq_transport.h"
#include "services/workers/decode/decode_worker.h"

namespace pw {
namespace {

using transport::ControlServer;

constexpr uint64_t kHourMs = 3600 * 1000;

// The test's router: a control server on loopback that sends KvReserves and reads the replies.
class Router {
 public:
  Router() {
    auto t = transport::ZmqRouterTransport::Bind("tcp://127.0.0.1:0");
    EXPECT_TRUE(t.ok());
    endpoint_ = (*t)->endpoint();
    ControlServer::Options o;
    o.id = "router";
    // The worker's heartbeats follow its manual clock; the router must not time it out.
    o.heartbeat_ms = 60000;
    server_ =
        std::make_unique<ControlServer>(std::move(t).value(), pw::SteadyClock::Get(), o);
  }
  const std::string& endpoint() const { return endpoint_; }

  // Polls until `done()` or `timeout_ms` of wall time.
  template <typename Done>
  bool PollUntil(int timeout_ms, Done done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      server_->Poll(10, [this](const std::string&, const proto::InMessage& m) {
        if (m.which() == proto::Body::KV_RESERVE_REPLY) {
          auto r = m.body().getKvReserveReply();
          replies_++;
          last_ok_ = r.getOk();
          last_error_ = proto::ToString(r.getError());
        }
        return Status::Ok();
      });
    }
    return done();
  }

  // Sends a KvReserve and waits for its reply; true when one came.
  bool Reserve(uint64_t request_id, uint32_t lease_ms) {
    proto::OutMessage m;
    auto k = m.body().initKvReserve();
    k.setRequestId(request_id);
    k.setNumTokens(8);
    k.setMaxTokens(4);
    k.setLeaseMs(lease_ms);
    if (!server_->Send("decode-0", m).ok()) return false;
    const int before = replies_;
    return PollUntil(60000, [&] { return replies_ > before; });
  }

  bool up() const { return server_->FindPeer("decode-0") != nullptr; }
  bool last_ok() const { return last_ok_; }
  const std::string& last_error() const { return last_error_; }

 private:
  std::string endpoint_;
  std::unique_ptr<ControlServer> server_;
  int replies_ = 0;
  bool last_ok_ = false;
  std::string last_error_;
};

// A lease holds a draining decode worker open; its drain deadline (drain_timeout_ms) is read
// from the worker's clock, so moving that clock past the deadline (and not past the lease)
// ends the drain at once, although the wall clock is far from it.
TEST(WorkerClock, DecodeDrainDeadlineFollowsTheInjectedClock) {
  pw::ManualClock clock(1000);
  Router router;
  workers::DecodeWorkerOptions o;
  o.id = "decode-0";
  o.model_dir = std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/qwen2_moe";
  o.router_endpoints = {router.endpoint()};
  o.num_kv_blocks = 64;
  o.block_size = 4;
  o.max_lease_ms = 2 * kHourMs;
  // Heartbeats an hour apart on the worker's clock: the clock's jumps below stay within three
  // of them, so the worker never takes the router for lost (which would end its leases).
  o.heartbeat_ms = kHourMs;
  o.kv_dtype = engine::KvDtype::kF32;
  auto worker = workers::DecodeWorker::Create(o, &clock);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();

  constexpr int kDrainMs = 20 * 60 * 1000;  // wall time the test never waits
  std::atomic<bool> stop{false};
  std::atomic<bool> returned{false};
  Status run_status;
  std::thread run([&] {
    run_status = (*worker)->Run(stop, kDrainMs);
    returned = true;
  });
  ASSERT_TRUE(router.PollUntil(120000, [&] { return router.up(); })) << "no registration";
  ASSERT_TRUE(router.Reserve(1, static_cast<uint32_t>(kHourMs)));
  ASSERT_TRUE(router.last_ok()) << router.last_error();

  // Draining: new reservations are refused, the lease keeps the worker serving.
  stop = true;
  bool draining = false;
  for (int i = 0; i < 600 && !draining; ++i) {
    ASSERT_TRUE(router.Reserve(100 + i, 1000));
    draining = !router.last_ok() && router.last_error().find("draining") != std::string::npos;
  }
  ASSERT_TRUE(draining) << router.last_error();
  EXPECT_FALSE(returned.load());

  clock.Advance(kDrainMs + 1000);  // past the drain deadline, an hour before the lease ends
  const bool ended = router.PollUntil(120000, [&] { return returned.load(); });
  if (!ended) clock.Advance(2 * kHourMs);  // the lease expires: the drain ends anyway
  run.join();
  EXPECT_TRUE(ended) << "the drain outlived its deadline on the worker's clock by 2 minutes";
  EXPECT_TRUE(run_status.ok()) << run_status.ToString();
}

}  // namespace
}  // namespace pw
