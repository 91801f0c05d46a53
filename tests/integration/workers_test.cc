// Real pw-broker, pw-prefill and pw-decode processes on loopback, driven by this test acting
// as the router over the control protocol (docs/architecture.md). Checks that greedy tokens
// through prefill -> UCX KV put -> decode equal the in-process engine's, that decode experts
// come from the broker, that leases expire, that cancel frees, that preemption under a small
// KV pool loses nothing, and that bad requests are refused without harm.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "common/formats/apw_store.h"
#include "common/formats/synthetic_moe.h"
#include "common/formats/width_map.h"
#include "engine/engine.h"
#include "engine/experts/apw_expert_provider.h"
#include "services/transport/control.h"
#include "services/transport/ucx.h"
#include "services/transport/zmq_transport.h"
#include "tests/integration/split_reference.h"
#include "tests/support/batch_invariance.h"
#include "tests/support/http_util.h"
#include "tests/support/process_util.h"

namespace pw {
namespace {

using testing::FreePort;

using transport::ControlServer;

std::string Bin(const std::string& name) { return std::string(PW_BINARY_DIR) + "/bin/" + name; }
// The fixture the processes and the reference load (tests/fixtures/models/<name>), or a model
// directory of the test's own (an absolute path: a synthetic model it wrote).
std::string& ModelName() {
  static std::string name = "qwen2_moe";
  return name;
}
std::string ModelDir() {
  if (ModelName().rfind('/', 0) == 0) return ModelName();
  return std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/" + ModelName();
}

struct Req {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  std::vector<int32_t> out;
  uint64_t lease = 0;
  std::vector<uint32_t> blocks;
  std::vector<uint32_t> pages;
  bool finished = false;
  wire::FinishReason reason = wire::FinishReason::STOP;
  std::string error;
  bool cancel_after_first_chunk = false;
  uint32_t lease_ms = 0;  // 0: the router's default
};

// The test's router: places every request on the one prefill and one decode worker.
class MiniRouter {
 public:
  MiniRouter() {
    auto t = transport::ZmqRouterTransport::Bind("tcp://127.0.0.1:0");
    EXPECT_TRUE(t.ok());
    endpoint_ = (*t)->endpoint();
    ControlServer::Options o;
    o.id = "router";
    o.heartbeat_ms = 200;
    server_ = std::make_unique<ControlServer>(std::move(t).value(), pw::SteadyClock::Get(), o);
  }
  const std::string& endpoint() const { return endpoint_; }
  ControlServer& server() { return *server_; }

  bool WaitForPeers(const std::vector<std::string>& ids, int timeout_ms) {
    for (int waited = 0; waited < timeout_ms; waited += 20) {
      bool all = true;
      for (const auto& id : ids) all = all && server_->FindPeer(id) != nullptr;
      if (all) return true;
      server_->Poll(20, nullptr);
    }
    return false;
  }

  void Submit(Req* r) {
    reqs_[r->id] = r;
    proto::OutMessage m;
    auto k = m.body().initKvReserve();
    k.setRequestId(r->id);
    k.setNumTokens(static_cast<uint32_t>(r->prompt.size()));
    k.setLeaseMs(r->lease_ms != 0 ? r->lease_ms : lease_ms);
    ASSERT_TRUE(server_->Send("decode-0", m).ok());
  }

  // Polls until every submitted request finished or timeout.
  bool Run(int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      server_->Poll(10, [this](const std::string& peer, const proto::InMessage& m) {
        return Handle(peer, m);
      });
      bool all = true;
      for (auto& [id, r] : reqs_) all = all && r->finished;
      if (all) return true;
    }
    return false;
  }

  // Tells the decode worker that the prefill worker of `r`'s lease is done writing it (the
  // router knows: it got the lease's KvReady), so blocks it quarantined may be reused.
  void ReleaseWriter(const Req& r) {
    proto::OutMessage m;
    auto c = m.body().initCancel();
    c.setRequestId(r.id);
    c.setLeaseId(r.lease);
    c.setWriterDone(true);
    ASSERT_TRUE(server_->Send("decode-0", m).ok());
  }

  uint32_t lease_ms = 30000;
  std::vector<std::string> events;

 private:
  void SendSampling(wire::SamplingParams::Builder s, const Req& r) {
    s.setTemperature(0);
    s.setMaxTokens(static_cast<uint32_t>(r.max_tokens));
    s.setIgnoreEos(true);
  }
  Status Handle(const std::string& peer, const proto::InMessage& m) {
    switch (m.which()) {
      case proto::Body::KV_RESERVE_REPLY: {
        auto rep = m.body().getKvReserveReply();
        Req* r = reqs_.at(rep.getRequestId());
        if (!rep.getOk()) {
          r->finished = true;
          r->error = "reserve: " + proto::ToString(rep.getError());
          return Status::Ok();
        }
        r->lease = rep.getLeaseId();
        r->blocks = proto::ToVector<uint32_t>(rep.getBlockIds());
        r->pages = proto::ToVector<uint32_t>(rep.getPageIds());
        const transport::PeerInfo* d = server_->FindPeer("decode-0");
        auto reg = d->registration->body().getRegister();
        proto::OutMessage out;
        auto pr = out.body().initPrefillRequest();
        pr.setRequestId(r->id);
        auto toks = pr.initTokens(static_cast<unsigned>(r->prompt.size()));
        for (size_t i = 0; i < r->prompt.size(); ++i) toks.set(i, static_cast<uint32_t>(r->prompt[i]));
        SendSampling(pr.initSampling(), *r);
        pr.setDecodeWorkerId("decode-0");
        pr.setDecodeMemory(reg.getKvMemory());
        pr.setDecodeLayout(reg.getKvLayout());
        auto bl = pr.initBlockIds(static_cast<unsigned>(r->blocks.size()));
        for (size_t i = 0; i < r->blocks.size(); ++i) bl.set(i, r->blocks[i]);
        proto::FillU32([&](unsigned n) { return pr.initPageIds(n); }, r->pages);
        pr.setLeaseId(r->lease);
        if (corrupt_blocks_for == r->id) bl.set(0, 1u << 30);
        return server_->Send("prefill-0", out);
      }
      case proto::Body::KV_READY: {
        auto kr = m.body().getKvReady();
        Req* r = reqs_.at(kr.getRequestId());
        if (!kr.getOk()) {
          r->finished = true;
          r->error = "prefill: " + proto::ToString(kr.getError());
          return Status::Ok();
        }
        r->out.push_back(static_cast<int32_t>(kr.getFirstToken()));
        proto::OutMessage out;
        auto sd = out.body().initStartDecode();
        sd.setRequestId(r->id);
        sd.setLeaseId(r->lease);
        auto toks = sd.initTokens(static_cast<unsigned>(r->prompt.size()));
        for (size_t i = 0; i < r->prompt.size(); ++i) toks.set(i, static_cast<uint32_t>(r->prompt[i]));
        sd.setFirstToken(kr.getFirstToken());
        SendSampling(sd.initSampling(), *r);
        sd.setGeneratedSoFar(1);
        if (delay_start_decode_for == r->id) return Status::Ok();  // abandoned: lease must expire
        return server_->Send("decode-0", out);
      }
      case proto::Body::TOKEN_CHUNK: {
        auto tc = m.body().getTokenChunk();
        Req* r = reqs_.at(tc.getRequestId());
        if (tc.getStartIndex() != r->out.size()) {
          r->error = "gap or repeat at " + std::to_string(tc.getStartIndex());
        }
        for (uint32_t t : tc.getTokens()) r->out.push_back(static_cast<int32_t>(t));
        if (r->cancel_after_first_chunk) {
          r->cancel_after_first_chunk = false;
          proto::OutMessage c;
          c.body().initCancel().setRequestId(r->id);
          return server_->Send(peer, c);
        }
        return Status::Ok();
      }
      case proto::Body::FINISH: {
        auto f = m.body().getFinish();
        Req* r = reqs_.at(f.getRequestId());
        r->finished = true;
        r->reason = f.getReason();
        if (f.getReason() == wire::FinishReason::ERROR) r->error = proto::ToString(f.getError());
        return Status::Ok();
      }
      default:
        return Status::Ok();
    }
  }

 public:
  uint64_t corrupt_blocks_for = 0;
  uint64_t delay_start_decode_for = 0;

 private:
  std::string endpoint_;
  std::unique_ptr<ControlServer> server_;
  std::map<uint64_t, Req*> reqs_;
};

struct Cluster {
  MiniRouter router;
  testing::ChildProcess broker, prefill, decode;
  std::string broker_endpoint;
  int decode_metrics_port = 0;           // > 0: the decode worker serves Prometheus metrics there
  int prefill_metrics_port = 0;          // > 0: the prefill worker's
  std::vector<std::string> decode_args;  // more pw-decode options
  std::vector<std::string> broker_args;  // added to the broker's command line (e.g. --store)

  bool Start(int decode_kv_blocks = 256, bool use_broker = true) {
    testing::UseBatchInvariantKernels();
    const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
    mkdir(log_dir.c_str(), 0755);
    const std::string tag = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    if (use_broker) {
      broker_endpoint = "tcp://127.0.0.1:" + std::to_string(FreePort());
      std::vector<std::string> b = {Bin("pw-broker"), "--insecure", "--model", ModelDir(), "--bind",
                                    broker_endpoint, "--heartbeat-ms", "200"};
      b.insert(b.end(), broker_args.begin(), broker_args.end());
      if (!broker.Start(b, log_dir + "/" + tag + ".broker.log")) {
        return false;
      }
    }
    std::vector<std::string> d = {Bin("pw-decode"), "--insecure", "--model", ModelDir(), "--router",
                                  router.endpoint(), "--id", "decode-0", "--kv-blocks",
                                  std::to_string(decode_kv_blocks), "--heartbeat-ms", "200"};
    if (use_broker) {
      d.push_back("--broker");
      d.push_back(broker_endpoint);
    }
    if (decode_metrics_port > 0) {
      d.push_back("--metrics");
      d.push_back("127.0.0.1:" + std::to_string(decode_metrics_port));
    }
    d.insert(d.end(), decode_args.begin(), decode_args.end());
    if (!decode.Start(d, log_dir + "/" + tag + ".decode.log")) return false;
    std::vector<std::string> p = {Bin("pw-prefill"), "--insecure", "--model", ModelDir(), "--router",
                                  router.endpoint(), "--id", "prefill-0", "--heartbeat-ms", "200"};
    if (prefill_metrics_port > 0) {
      p.push_back("--metrics");
      p.push_back("127.0.0.1:" + std::to_string(prefill_metrics_port));
    }
    if (!prefill.Start(p, log_dir + "/" + tag + ".prefill.log")) return false;
    return router.WaitForPeers({"decode-0", "prefill-0"}, 120000);
  }
  std::string Logs() { return "decode:\n" + decode.Log() + "\nprefill:\n" + prefill.Log() + "\nbroker:\n" + broker.Log(); }
};

// Greedy reference from the in-process engine.
std::vector<std::vector<int32_t>> Reference(const std::vector<std::vector<int32_t>>& prompts,
                                            int max_tokens) {
  engine::EngineOptions eo;
  eo.kv_dtype = engine::KvDtype::kBf16;  // the workers' default
  eo.num_kv_blocks = 1024;
  auto e = engine::Engine::Create(ModelDir(), eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  engine::SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_TRUE((*e)->AddSequence(i + 1, prompts[i], p).ok());
  while ((*e)->HasWork()) {
    auto step = (*e)->Step();
    EXPECT_TRUE(step.ok()) << step.status().ToString();
    if (!step.ok()) break;
    for (auto& u : step->updates) {
      for (int32_t t : u.new_tokens) out[u.id - 1].push_back(t);
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> RandomPrompts(int n, uint32_t seed, int min_len, int max_len) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts(n);
  for (auto& p : prompts) {
    int len = min_len + static_cast<int>(rng() % static_cast<uint32_t>(max_len - min_len + 1));
    for (int i = 0; i < len; ++i) p.push_back(1 + static_cast<int32_t>(rng() % 4000));
  }
  return prompts;
}

// pagedweight_kv_pages{kind="`kind`"} in a worker's /metrics body; -1 when absent.
int64_t KvPagesGauge(const std::string& body, const std::string& kind) {
  const std::string key = "kind=\"" + kind + "\"";
  for (size_t at = body.find("pagedweight_kv_pages{"); at != std::string::npos;
       at = body.find("pagedweight_kv_pages{", at + 1)) {
    const size_t end = body.find('}', at);
    if (body.substr(at, end - at).find(key) == std::string::npos) continue;
    return std::atoll(body.c_str() + end + 1);
  }
  return -1;
}

// The most pages of each kind a worker's metrics showed, sampled until Stop.
class KvPagesSampler {
 public:
  explicit KvPagesSampler(int port)
      : thread_([this, port] {
          while (!done_) {
            auto [status, body] = testing::Http(port, "GET", "/metrics", "", 5);
            if (status == 200) {
              most_sliding = std::max<int64_t>(most_sliding, KvPagesGauge(body, "sliding_window"));
              most_full = std::max<int64_t>(most_full, KvPagesGauge(body, "full_attention"));
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
        }) {}
  void Stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  ~KvPagesSampler() { Stop(); }
  std::atomic<int64_t> most_sliding{-1}, most_full{-1};

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Serves `ModelName()`'s fixture for the scope's duration ("qwen2_moe" again after it).
struct UseModel {
  explicit UseModel(const std::string& model) { ModelName() = model; }
  ~UseModel() { ModelName() = "qwen2_moe"; }
};

// Through a started cluster: `n` prompts of `min_len`..`max_len` random ids (seed `seed`, folded
// into [3, 3 + id_span) for a fixture's small vocabulary), `max_tokens` greedy tokens each,
// request ids from `first_id`: every request finishes by length with the in-process engine's
// tokens, and the decode worker took its experts from the broker.
void ExpectServedTokensEqualTheEngine(Cluster& c, int n, uint32_t seed, int min_len, int max_len,
                                      int id_span, uint64_t first_id, int max_tokens) {
  auto prompts = RandomPrompts(n, seed, min_len, max_len);
  for (auto& p : prompts) {
    for (auto& id : p) id = 3 + id % id_span;
  }
  auto ref = Reference(prompts, max_tokens);
  std::vector<Req> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    reqs[i].id = first_id + i;
    reqs[i].prompt = prompts[i];
    reqs[i].max_tokens = max_tokens;
    c.router.Submit(&reqs[i]);
  }
  ASSERT_TRUE(c.router.Run(180000)) << c.Logs();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(reqs[i].error.empty()) << "request " << i << ": " << reqs[i].error;
    EXPECT_EQ(reqs[i].reason, wire::FinishReason::LENGTH);
    EXPECT_EQ(reqs[i].out.size(), static_cast<size_t>(max_tokens));
    EXPECT_EQ(reqs[i].out, ref[i]) << "request " << i << " (prompt of " << prompts[i].size()
                                   << " tokens, seed " << seed << ")";
  }
  EXPECT_NE(c.decode.Log().find("from the broker"), std::string::npos) << c.Logs();
}

// Through a cluster started with a small decode pool: `n` prompts as in
// ExpectServedTokensEqualTheEngine, growing by `max_tokens` each past what the pool holds, so
// the decode worker preempts and recomputes; every request finishes without error with the
// in-process engine's tokens, and the decode worker said it preempted.
void ExpectPreemptedTokensEqualTheEngine(Cluster& c, int n, uint32_t seed, int min_len, int max_len,
                                         int id_span, uint64_t first_id, int max_tokens) {
  auto prompts = RandomPrompts(n, seed, min_len, max_len);
  for (auto& p : prompts) {
    for (auto& id : p) id = 3 + id % id_span;
  }
  auto ref = Reference(prompts, max_tokens);
  std::vector<Req> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    reqs[i].id = first_id + i;
    reqs[i].prompt = prompts[i];
    reqs[i].max_tokens = max_tokens;
    c.router.Submit(&reqs[i]);
  }
  ASSERT_TRUE(c.router.Run(180000)) << c.Logs();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(reqs[i].error.empty()) << "request " << i << ": " << reqs[i].error;
    EXPECT_EQ(reqs[i].out, ref[i]) << "request " << i;
  }
  EXPECT_NE(c.decode.Log().find("preempted"), std::string::npos) << c.Logs();
}

// SIGTERM to the decode worker, the prefill worker and the broker: each exits 0.
void ExpectCleanStop(Cluster& c) {
  c.decode.Kill(SIGTERM);
  c.prefill.Kill(SIGTERM);
  c.broker.Kill(SIGTERM);
  EXPECT_EQ(c.decode.Wait(20000), 0) << c.Logs();
  EXPECT_EQ(c.prefill.Wait(20000), 0) << c.Logs();
  EXPECT_EQ(c.broker.Wait(20000), 0) << c.Logs();
}

TEST(Workers, GreedyTokensEqualInProcessEngine) {
  Cluster c;
  ASSERT_TRUE(c.Start()) << c.Logs();
  const int kMax = 12;
  auto prompts = RandomPrompts(16, 4242, 1, 70);
  auto ref = Reference(prompts, kMax);
  std::vector<Req> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    reqs[i].id = 100 + i;
    reqs[i].prompt = prompts[i];
    reqs[i].max_tokens = kMax;
    c.router.Submit(&reqs[i]);
  }
  ASSERT_TRUE(c.router.Run(180000)) << c.Logs();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(reqs[i].error.empty()) << "request " << i << ": " << reqs[i].error;
    EXPECT_EQ(reqs[i].reason, wire::FinishReason::LENGTH);
    EXPECT_EQ(reqs[i].out, ref[i]) << "request " << i << " (prompt of " << prompts[i].size()
                                   << " tokens, seed 4242)";
  }
  EXPECT_NE(c.decode.Log().find("from the broker"), std::string::npos) << c.Logs();
  // Every block is free again: the decode worker's heartbeat says so.
  for (int i = 0; i < 50; ++i) c.router.server().Poll(20, nullptr);
  const auto* d = c.router.server().FindPeer("decode-0");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->load.used_kv_blocks, 0u);
  EXPECT_EQ(d->load.reserved_kv_blocks, 0u);
  // SIGTERM drains and exits cleanly.
  c.decode.Kill(SIGTERM);
  c.prefill.Kill(SIGTERM);
  c.broker.Kill(SIGTERM);
  EXPECT_EQ(c.decode.Wait(20000), 0) << c.Logs();
  EXPECT_EQ(c.prefill.Wait(20000), 0) << c.Logs();
  EXPECT_EQ(c.broker.Wait(20000), 0) << c.Logs();
}

// The broker's bf16 experts packed by the decode worker (--bf16-experts packed,
// kernels/cpu/packed_bf16.h): the same values, so the in-process engine's greedy tokens. The
// embedded model's 128-column rows pack into 0.83x their bytes; the fixture's 16-column rows
// would take more packed (a 64-column chunk each), so there the worker keeps them as fetched.
TEST(Workers, PackedBf16ExpertsFromTheBrokerGiveTheEnginesTokens) {
  {
    UseModel model(std::string(PW_SOURCE_DIR) + "/models/tiny-moe");
    Cluster c;
    c.decode_args = {"--bf16-experts", "packed"};
    ASSERT_TRUE(c.Start()) << c.Logs();
    ExpectServedTokensEqualTheEngine(c, 12, 5151, 1, 60, 4000, 300, 12);  // vocabulary 4096
    EXPECT_NE(c.decode.Log().find("held packed in"), std::string::npos) << c.Logs();
    ExpectCleanStop(c);
  }
  Cluster c;
  c.decode_args = {"--bf16-experts", "packed"};
  ASSERT_TRUE(c.Start()) << c.Logs();
  ExpectServedTokensEqualTheEngine(c, 6, 5152, 1, 40, 4000, 400, 8);
  EXPECT_NE(c.decode.Log().find("held as fetched"), std::string::npos) << c.Logs();
  ExpectCleanStop(c);
}

// glm4_moe (sigmoid grouped gate, shared experts, a dense first layer, partial rotary) served by
// real processes, its routed experts from the broker: the in-process engine's tokens.
TEST(Workers, Glm4MoeGreedyTokensEqualInProcessEngine) {
  UseModel model("glm4_moe");
  Cluster c;
  ASSERT_TRUE(c.Start()) << c.Logs();
  const int kMax = 10;
  auto prompts = RandomPrompts(8, 2929, 1, 50);
  auto ref = Reference(prompts, kMax);
  std::vector<Req> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    reqs[i].id = 300 + i;
    reqs[i].prompt = prompts[i];
    reqs[i].max_tokens = kMax;
    c.router.Submit(&reqs[i]);
  }
  ASSERT_TRUE(c.router.Run(180000)) << c.Logs();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(reqs[i].error.empty()) << "request " << i << ": " << reqs[i].error;
    EXPECT_EQ(reqs[i].reason, wire::FinishReason::LENGTH);
    EXPECT_EQ(reqs[i].out, ref[i]) << "request " << i << " (prompt of " << prompts[i].size()
                                   << " tokens, seed 2929)";
  }
  EXPECT_NE(c.decode.Log().find("from the broker"), std::string::npos) << c.Logs();
  c.decode.Kill(SIGTERM);
  c.prefill.Kill(SIGTERM);
  c.broker.Kill(SIGTERM);
  EXPECT_EQ(c.decode.Wait(20000), 0) << c.Logs();
  EXPECT_EQ(c.prefill.Wait(20000), 0) << c.Logs();
  EXPECT_EQ(c.broker.Wait(20000), 0) << c.Logs();
}

// glm4_moe's dense first layer in the any-precision path: pw-quantize (a real process) stores
// the MoE layers 1 and 2 only; the broker serves that store, the decode worker pages its blocks
// at 8 bits and the tokens equal the in-process split (prefill on the checkpoint's experts,
// decode over the same store at 8 bits). A store whose layers are not the model's MoE layers
// is refused by the broker, naming both lists.
TEST(Workers, Glm4MoeDenseFirstLayerServedFromAnApwStore) {
  UseModel model("glm4_moe");
  const std::string dir = std::string(PW_BINARY_DIR) + "/test-tmp";
  std::filesystem::create_directories(dir);
  const std::string store = dir + "/glm4_moe_dense_first.apw";
  const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
  mkdir(log_dir.c_str(), 0755);
  {
    testing::ChildProcess q;
    const std::string log = log_dir + "/Glm4MoeDenseFirst.quantize.log";
    unlink(log.c_str());
    ASSERT_TRUE(q.Start({Bin("pw-quantize"), "--model", ModelDir(), "--calib-random-tokens", "200", "--ctx", "64",
                         "--threads", "2", "--quiet", "--out", store},
                        log));
    ASSERT_EQ(q.Wait(300000), 0) << q.Log();
  }
  auto opened = apw::ApwStore::Open(store);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  ASSERT_EQ((*opened)->info().layers, (std::vector<uint32_t>{1, 2}));
  std::shared_ptr<const apw::ApwStore> shared(std::move(opened).value());

  testing::UseBatchInvariantKernels();
  const int kMax = 10;
  auto prompts = RandomPrompts(8, 3131, 1, 50);
  std::vector<std::vector<int32_t>> ref;
  {
    engine::EngineOptions eo;
    eo.kv_dtype = engine::KvDtype::kBf16;
    auto pre = engine::Engine::Create(ModelDir(), eo).value();
    auto dec = engine::Engine::Create(ModelDir(), eo).value();
    auto provider = anyprec::ApwExpertProvider::Create(shared, dec->model(), anyprec::WidthMap::Uniform(8, 3, 16).value());
    ASSERT_TRUE(provider.ok()) << provider.status().ToString();
    engine::MoeHooks hooks;
    hooks.provider = provider->get();
    dec->SetMoeHooks(hooks);
    ref = testing::SplitGreedyTokens(*pre, *dec, prompts, kMax, /*one_at_a_time=*/false, /*ignore_eos=*/true);
    dec->SetMoeHooks({});
  }
  ASSERT_EQ(ref.size(), prompts.size());

  Cluster c;
  c.broker_args = {"--store", store, "--initial-bits", "8"};
  ASSERT_TRUE(c.Start()) << c.Logs();
  std::vector<Req> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    reqs[i].id = 500 + i;
    reqs[i].prompt = prompts[i];
    reqs[i].max_tokens = kMax;
    c.router.Submit(&reqs[i]);
  }
  ASSERT_TRUE(c.router.Run(180000)) << c.Logs();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(reqs[i].error.empty()) << "request " << i << ": " << reqs[i].error;
    EXPECT_EQ(reqs[i].out, ref[i]) << "request " << i << " (prompt of " << prompts[i].size() << " tokens, seed 3131)";
  }
  // 2 MoE layers x 16 experts x (gate_up, down) paged in; layer 0 has none.
  EXPECT_NE(c.decode.Log().find("loaded 64 expert blocks at 8 bits"), std::string::npos) << c.Logs();
  // A residency budget for such a model is over its 2 MoE layers (half of 16 experts each):
  // the worker starts with it and registers (it was refused, naming the dense layer).
  {
    testing::ChildProcess cold;
    const std::string log = log_dir + "/Glm4MoeDenseFirst.residency.log";
    unlink(log.c_str());
    ASSERT_TRUE(cold.Start({Bin("pw-decode"), "--insecure", "--model", ModelDir(), "--router", c.router.endpoint(),
                            "--broker", c.broker_endpoint, "--id", "decode-2", "--kv-blocks", "64",
                            "--residency", "0.5"},
                           log));
    // It registers first, then loads its expert weights from the broker and sizes its budget.
    for (int i = 0; i < 600 && cold.Wait(0) == -1 && cold.Log().find("residency budget of") == std::string::npos; ++i) {
      c.router.server().Poll(100, nullptr);
    }
    EXPECT_NE(cold.Log().find("registered with"), std::string::npos) << cold.Log();
    EXPECT_NE(cold.Log().find("residency budget of 8 experts per layer"), std::string::npos) << cold.Log();
    cold.Kill(SIGTERM);
    EXPECT_EQ(cold.Wait(30000), 0) << cold.Log();
  }
  c.decode.Kill(SIGTERM);
  c.prefill.Kill(SIGTERM);
  c.broker.Kill(SIGTERM);
  EXPECT_EQ(c.decode.Wait(20000), 0) << c.Logs();
  EXPECT_EQ(c.prefill.Wait(20000), 0) << c.Logs();
  EXPECT_EQ(c.broker.Wait(20000), 0) << c.Logs();

  // A store holding layer 0 as well (layer 1's blocks copied there): the broker refuses it.
  apw::StoreInfo every = shared->info();
  every.layers = {0, 1, 2};
  const std::string wrong = dir + "/glm4_moe_every_layer.apw";
  {
    auto w = apw::ApwWriter::Create(wrong, every);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (int i = 0; i < shared->num_blocks(); ++i) {
      ASSERT_TRUE((*w)->Add(shared->block(i)).ok());
      if (shared->block(i).layer != 1) continue;
      apw::BlockData copy = shared->block(i);
      copy.layer = 0;
      ASSERT_TRUE((*w)->Add(copy).ok());
    }
    ASSERT_TRUE((*w)->Finish().ok());
  }
  testing::ChildProcess refused;
  const std::string log = log_dir + "/Glm4MoeDenseFirst.refused.log";
  unlink(log.c_str());
  ASSERT_TRUE(refused.Start({Bin("pw-broker"), "--insecure", "--model", ModelDir(), "--store", wrong, "--bind",
                             "tcp://127.0.0.1:" + std::to_string(FreePort())},
                            log));
  EXPECT_NE(refused.Wait(60000), 0) << refused.Log();
  EXPECT_NE(refused.Log().find("the store holds expert blocks for layers [0, 1, 2], the model's MoE layers are [1, 2]"),
            std::string::npos)
      << refused.Log();
  std::filesystem::remove(store);
  std::filesystem::remove(wrong);
}

TEST(Workers, PreemptionUnderSmallKvPoolLosesNothing) {
  Cluster c;
  // 16 blocks of 16 tokens: 4 prompts of 20..28 tokens reserve 8 blocks; growing to 170+ tokens
  // each they need 44, so the decode worker must preempt and recompute.
  ASSERT_TRUE(c.Start(/*decode_kv_blocks=*/16, /*use_broker=*/false)) << c.Logs();
  const int kMax = 150;
  auto prompts = RandomPrompts(4, 77, 20, 28);
  auto ref = Reference(prompts, kMax);
  std::vector<Req> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    reqs[i].id = 200 + i;
    reqs[i].prompt = prompts[i];
    reqs[i].max_tokens = kMax;
    c.router.Submit(&reqs[i]);
  }
  ASSERT_TRUE(c.router.Run(180000)) << c.Logs();
  int completed = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].error.rfind("reserve:", 0) == 0) continue;  // refused for lack of KV: fine
    ++completed;
    EXPECT_TRUE(reqs[i].error.empty()) << reqs[i].error;
    EXPECT_EQ(reqs[i].out, ref[i]) << "request " << i;
  }
  EXPECT_EQ(completed, 4);
  EXPECT_NE(c.decode.Log().find("preempted"), std::string::npos) << c.Logs();
}

TEST(Workers, LeaseExpiresCancelFreesAndBadRequestsAreRefused) {
  Cluster c;
  ASSERT_TRUE(c.Start(64, /*use_broker=*/false)) << c.Logs();
  std::vector<Req> reqs(3);
  auto prompts = RandomPrompts(3, 5, 30, 40);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].id = 300 + i;
    reqs[i].prompt = prompts[i];
    reqs[i].max_tokens = 200;
  }
  c.router.delay_start_decode_for = 300;  // abandoned after prefill: the lease must expire
  reqs[0].lease_ms = 500;
  reqs[1].lease_ms = 500;                  // its prefill is refused: the lease must expire too
  c.router.corrupt_blocks_for = 301;      // block id out of range: prefill refuses
  reqs[2].cancel_after_first_chunk = true;
  for (auto& r : reqs) c.router.Submit(&r);
  // 300 never finishes by itself; run until the others did.
  c.router.Run(5000);
  EXPECT_FALSE(reqs[0].finished);
  EXPECT_TRUE(reqs[1].finished);
  EXPECT_NE(reqs[1].error.find("invalid"), std::string::npos) << reqs[1].error;
  EXPECT_TRUE(reqs[2].finished);
  EXPECT_EQ(reqs[2].reason, wire::FinishReason::CANCELLED);
  EXPECT_LT(reqs[2].out.size(), 200u);
  // The expired leases' blocks wait in quarantine until the router confirms their writer is
  // done (here it is: both KvReady arrived); then every block is back.
  c.router.ReleaseWriter(reqs[0]);
  c.router.ReleaseWriter(reqs[1]);
  bool all_free = false;
  for (int i = 0; i < 300 && !all_free; ++i) {
    c.router.server().Poll(20, nullptr);
    const auto* d = c.router.server().FindPeer("decode-0");
    all_free = d && d->load.free_kv_blocks == 64 && d->load.reserved_kv_blocks == 0;
  }
  EXPECT_TRUE(all_free) << c.Logs();
  EXPECT_NE(c.decode.Log().find("expired"), std::string::npos);
  // Late StartDecode for the expired lease is refused with an error, not a crash.
  // And the workers still serve.
  Req ok;
  ok.id = 399;
  ok.prompt = prompts[0];
  ok.max_tokens = 5;
  c.router.delay_start_decode_for = 0;
  c.router.Submit(&ok);
  reqs[0].finished = true;  // stop waiting for the abandoned one
  ASSERT_TRUE(c.router.Run(60000)) << c.Logs();
  EXPECT_TRUE(ok.error.empty()) << ok.error;
  EXPECT_EQ(ok.out.size(), 5u);
  EXPECT_TRUE(c.decode.running() && c.prefill.running());
}

// An MLA model (`model`: every KV layer a latent of kv_lora_rank + qk_rope_head_dim values a
// token) served by real processes, its routed experts from the broker: prompts over several
// 16-token blocks, their latent rows computed by the prefill worker and put into the decode
// worker's blocks, decoded from there in the absorbed form: the in-process engine's tokens. The
// decode worker's pages are 4096 bytes against the prefill worker's 1280 (16 bf16 rows of 40
// values), so the rows fill a third of each page there and whole pages here.
void LatentGreedyTokensEqualInProcessEngine(const std::string& model, uint32_t seed) {
  UseModel use(model);
  Cluster c;
  c.decode_args = {"--page-bytes", "4096"};
  ASSERT_TRUE(c.Start()) << c.Logs();
  ExpectServedTokensEqualTheEngine(c, 6, seed, 17, 90, 2000, 1000, 24);  // vocabulary 2048
  // The workers registered their pages, 4096 and 1280 bytes, the latent rows as a layer's bytes.
  for (const char* id : {"decode-0", "prefill-0"}) {
    const transport::PeerInfo* peer = c.router.server().FindPeer(id);
    ASSERT_NE(peer, nullptr) << id;
    auto kl = peer->registration->body().getRegister().getKvLayout();
    EXPECT_EQ(kl.getLayerBytes(), 16u * 40 * 2) << id;
    EXPECT_EQ(kl.getPageBytes(), std::string(id) == "decode-0" ? 4096u : 1280u) << id;
  }
  ExpectCleanStop(c);
}

TEST(Workers, DeepseekV3GreedyTokensEqualInProcessEngine) {
  LatentGreedyTokensEqualInProcessEngine("deepseek_v3", 7171);
}

// Kimi-K2's config (model_type kimi_k2, the DeepseekV3 architecture) through the same transfer.
TEST(Workers, KimiK2GreedyTokensEqualInProcessEngine) {
  LatentGreedyTokensEqualInProcessEngine("kimi_k2", 7272);
}

// deepseek_v3 under a small decode pool: 4 prompts of 30..45 tokens take at most 12 of its 16
// blocks; growing by 100 tokens each they need up to 40, so the decode worker preempts and
// recomputes the latent rows over prompt and streamed tokens: the in-process engine's tokens.
TEST(Workers, DeepseekV3PreemptionUnderSmallKvPoolLosesNothing) {
  UseModel model("deepseek_v3");
  Cluster c;
  ASSERT_TRUE(c.Start(/*decode_kv_blocks=*/16, /*use_broker=*/false)) << c.Logs();
  ExpectPreemptedTokensEqualTheEngine(c, 4, 7373, 30, 45, 2000, 1100, 100);
}

}  // namespace
}  // namespace pw

namespace pw {
namespace {

std::string Show(const std::vector<uint32_t>& v) {
  std::string s;
  for (uint32_t b : v) s += (s.empty() ? "" : " ") + std::to_string(b);
  return s;
}

// Drives one decode and two prefill workers step by step, as a router would, and records what
// they answer.
class StepRouter {
 public:
  struct Seen {
    bool reserved = false, reserve_refused = false, kv_ready = false, kv_ready_ok = false;
    bool finished = false;
    uint64_t lease = 0;
    std::vector<uint32_t> blocks;
    std::vector<uint32_t> pages;
    std::vector<int32_t> out;
    std::vector<float> logprobs;  // of the TokenChunk tokens, when asked for
    wire::FinishReason reason = wire::FinishReason::STOP;
    std::string error;
    wire::ErrorKind error_kind = wire::ErrorKind::WORKER;
    std::string error_param;
  };
  explicit StepRouter(const std::string& bind = "tcp://127.0.0.1:0") {
    auto t = transport::ZmqRouterTransport::Bind(bind);
    EXPECT_TRUE(t.ok());
    endpoint = (*t)->endpoint();
    ControlServer::Options o;
    o.id = "router";
    o.heartbeat_ms = kBeatMs;
    server = std::make_unique<ControlServer>(std::move(t).value(), pw::SteadyClock::Get(), o);
  }
  void Poll(int ms) {
    server->Poll(ms, [this](const std::string&, const proto::InMessage& m) -> Status {
      auto b = m.body();
      switch (m.which()) {
        case proto::Body::KV_RESERVE_REPLY: {
          Seen& s = seen[b.getKvReserveReply().getRequestId()];
          if (b.getKvReserveReply().getOk()) {
            s.reserved = true;
            s.lease = b.getKvReserveReply().getLeaseId();
            s.blocks = proto::ToVector<uint32_t>(b.getKvReserveReply().getBlockIds());
            s.pages = proto::ToVector<uint32_t>(b.getKvReserveReply().getPageIds());
          } else {
            s.reserve_refused = true;
          }
          break;
        }
        case proto::Body::KV_READY: {
          Seen& s = seen[b.getKvReady().getRequestId()];
          s.kv_ready = true;
          s.kv_ready_ok = b.getKvReady().getOk();
          if (s.kv_ready_ok) s.out.push_back(static_cast<int32_t>(b.getKvReady().getFirstToken()));
          break;
        }
        case proto::Body::TOKEN_CHUNK:
          for (uint32_t t : b.getTokenChunk().getTokens()) {
            seen[b.getTokenChunk().getRequestId()].out.push_back(static_cast<int32_t>(t));
          }
          for (auto lp : b.getTokenChunk().getLogprobs()) {
            seen[b.getTokenChunk().getRequestId()].logprobs.push_back(lp.getLogprob());
          }
          break;
        case proto::Body::FINISH: {
          Seen& s = seen[b.getFinish().getRequestId()];
          s.finished = true;
          s.reason = b.getFinish().getReason();
          s.error = proto::ToString(b.getFinish().getError());
          s.error_kind = b.getFinish().getErrorKind();
          s.error_param = proto::ToString(b.getFinish().getErrorParam());
          break;
        }
        default:
          break;
      }
      return Status::Ok();
    });
  }
  template <typename F>
  bool Until(F done, int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!done() && std::chrono::steady_clock::now() < deadline) Poll(10);
    return done();
  }
  void Reserve(uint64_t id, size_t tokens, uint32_t lease_ms) {
    seen[id] = Seen{};
    proto::OutMessage m;
    auto k = m.body().initKvReserve();
    k.setRequestId(id);
    k.setNumTokens(static_cast<uint32_t>(tokens));
    k.setLeaseMs(lease_ms);
    ASSERT_TRUE(server->Send("decode-0", m).ok());
  }
  // Renews request `id`'s lease for `lease_ms` more (KvRenew), as the router does while the
  // request waits for its prefill.
  void Renew(uint64_t id, uint32_t lease_ms) {
    proto::OutMessage m;
    auto k = m.body().initKvRenew();
    k.setLeaseMs(lease_ms);
    k.initRequestIds(1).set(0, id);
    k.initLeaseIds(1).set(0, seen[id].lease);
    ASSERT_TRUE(server->Send("decode-0", m).ok());
  }
  void Prefill(const std::string& prefill, uint64_t id, const std::vector<int32_t>& prompt,
               int max_tokens) {
    const Seen& s = seen[id];
    auto reg = server->FindPeer("decode-0")->registration->body().getRegister();
    proto::OutMessage out;
    auto pr = out.body().initPrefillRequest();
    pr.setRequestId(id);
    auto toks = pr.initTokens(static_cast<unsigned>(prompt.size()));
    for (size_t i = 0; i < prompt.size(); ++i) toks.set(i, static_cast<uint32_t>(prompt[i]));
    pr.initSampling().setMaxTokens(static_cast<uint32_t>(max_tokens));
    pr.getSampling().setIgnoreEos(true);
    pr.setDecodeWorkerId("decode-0");
    pr.setDecodeMemory(reg.getKvMemory());
    pr.setDecodeLayout(reg.getKvLayout());
    proto::FillU32([&](unsigned n) { return pr.initBlockIds(n); }, s.blocks);
    proto::FillU32([&](unsigned n) { return pr.initPageIds(n); }, s.pages);
    pr.setLeaseId(s.lease);
    ASSERT_TRUE(server->Send(prefill, out).ok());
  }
  void StartDecode(uint64_t id, const std::vector<int32_t>& prompt, int max_tokens,
                   float top_p = 1.f) {
    StartDecode(id, prompt, seen[id].out.at(0), 1, 0, max_tokens, -1, top_p);
  }
  // `tokens`: what precedes `first` (output index generated_so_far - 1); the KV of the last
  // `uncached` of them is not in the lease. `logprobs`: SamplingParams.logprobs.
  void StartDecode(uint64_t id, const std::vector<int32_t>& tokens, int32_t first,
                   uint32_t generated_so_far, uint32_t uncached, int max_tokens,
                   int32_t logprobs = -1, float top_p = 1.f) {
    const Seen& s = seen[id];
    proto::OutMessage out;
    auto sd = out.body().initStartDecode();
    sd.setRequestId(id);
    sd.setLeaseId(s.lease);
    auto toks = sd.initTokens(static_cast<unsigned>(tokens.size()));
    for (size_t i = 0; i < tokens.size(); ++i) toks.set(i, static_cast<uint32_t>(tokens[i]));
    sd.setFirstToken(static_cast<uint32_t>(first));
    sd.initSampling().setMaxTokens(static_cast<uint32_t>(max_tokens));
    sd.getSampling().setIgnoreEos(true);
    sd.getSampling().setLogprobs(logprobs);
    sd.getSampling().setTopP(top_p);
    sd.setGeneratedSoFar(generated_so_far);
    sd.setUncachedTokens(uncached);
    ASSERT_TRUE(server->Send("decode-0", out).ok());
  }

  // Reads request `id`'s leased blocks out of the decode worker's KV pool with UCX gets, as
  // any peer holding the pool's rkey can. Empty on failure.
  std::string ReadKv(uint64_t id) {
    auto reg = server->FindPeer("decode-0")->registration->body().getRegister();
    if (!ucx_ctx) {
      auto ctx = transport::ucx::Context::Create();
      EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
      if (!ctx.ok()) return "";
      ucx_ctx = std::move(ctx).value();
      auto w = transport::ucx::Worker::Create(*ucx_ctx);
      EXPECT_TRUE(w.ok()) << w.status().ToString();
      if (!w.ok()) return "";
      ucx_worker = std::move(w).value();
      auto mem = reg.getKvMemory();
      auto ep = transport::ucx::Endpoint::Connect(*ucx_worker, proto::ToBytes(mem.getWorkerAddress()));
      EXPECT_TRUE(ep.ok()) << ep.status().ToString();
      if (!ep.ok()) return "";
      ucx_ep = std::move(ep).value();
      auto region = ucx_ep->OpenRegion(proto::ToBytes(mem.getRkey()), mem.getBaseAddr(), mem.getBytes());
      EXPECT_TRUE(region.ok()) << region.status().ToString();
      if (!region.ok()) return "";
      kv_region = std::move(region).value();
    }
    // Every layer page of every block, in block then layer order.
    const uint64_t page_bytes = reg.getKvLayout().getPageBytes();
    const uint64_t layer_bytes = reg.getKvLayout().getLayerBytes();
    std::string out;
    for (uint32_t p : seen[id].pages) {
      std::string bytes(layer_bytes, '\0');
      Status st = kv_region->Get(static_cast<uint64_t>(p) * page_bytes, bytes.data(), bytes.size(), 30000);
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (!st.ok()) return "";
      out += bytes;
    }
    return out;
  }

  static constexpr uint64_t kBeatMs = 1000;  // nothing here depends on death detection
  std::unique_ptr<transport::ucx::Context> ucx_ctx;
  std::unique_ptr<transport::ucx::Worker> ucx_worker;
  std::unique_ptr<transport::ucx::Endpoint> ucx_ep;
  std::unique_ptr<transport::ucx::RemoteRegion> kv_region;
  std::string endpoint;
  std::unique_ptr<ControlServer> server;
  std::map<uint64_t, Seen> seen;
};

// A prefill worker that is slow (here: stopped) past its lease still writes the lease's blocks
// when it resumes. Those blocks must not have gone to another request meanwhile: the second
// request's tokens must equal the engine's, and afterwards the whole pool is free again.
TEST(Workers, LateWriterOfAnExpiredLeaseCannotCorruptAnotherRequest) {
  StepRouter r;
  const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
  mkdir(log_dir.c_str(), 0755);
  const std::string tag = "LateWriter";
  for (const char* who : {".decode.log", ".prefill-slow.log", ".prefill-fast.log"}) {
    unlink((log_dir + "/" + tag + who).c_str());  // the expiry is read from this run's log
  }
  const std::string beat = std::to_string(StepRouter::kBeatMs);
  constexpr int kBlocks = 8;  // 16 tokens each: room for one 90-token prompt and its output
  testing::ChildProcess decode, slow, fast;
  ASSERT_TRUE(decode.Start({Bin("pw-decode"), "--insecure", "--model", ModelDir(), "--router", r.endpoint,
                            "--id", "decode-0", "--kv-blocks", std::to_string(kBlocks),
                            "--heartbeat-ms", beat},
                           log_dir + "/" + tag + ".decode.log"));
  ASSERT_TRUE(slow.Start({Bin("pw-prefill"), "--insecure", "--model", ModelDir(), "--router", r.endpoint, "--id",
                          "prefill-slow", "--heartbeat-ms", beat},
                         log_dir + "/" + tag + ".prefill-slow.log"));
  ASSERT_TRUE(fast.Start({Bin("pw-prefill"), "--insecure", "--model", ModelDir(), "--router", r.endpoint, "--id",
                          "prefill-fast", "--heartbeat-ms", beat},
                         log_dir + "/" + tag + ".prefill-fast.log"));
  auto logs = [&] { return "decode:\n" + decode.Log() + "\nslow:\n" + slow.Log() + "\nfast:\n" + fast.Log(); };
  ASSERT_TRUE(r.Until([&] {
    return r.server->FindPeer("decode-0") && r.server->FindPeer("prefill-slow") &&
           r.server->FindPeer("prefill-fast");
  }, 120000)) << logs();

  auto prompts = RandomPrompts(2, 31337, 90, 90);
  const int kMax = 30;
  auto ref = Reference({prompts[1]}, kMax);
  const uint64_t kA = 1, kB = 2;
  // A: leased for 300 ms; its prefill worker is stopped before it sees the request.
  slow.Kill(SIGSTOP);
  r.Reserve(kA, prompts[0].size(), 300);
  ASSERT_TRUE(r.Until([&] { return r.seen[kA].reserved; }, 30000)) << logs();
  r.Prefill("prefill-slow", kA, prompts[0], kMax);
  ASSERT_TRUE(r.Until([&] { return decode.Log().find("expired") != std::string::npos; }, 30000))
      << logs();
  // B asks for KV while A's writer may still write A's blocks.
  r.Reserve(kB, prompts[1].size(), 30000);
  ASSERT_TRUE(r.Until([&] { return r.seen[kB].reserved || r.seen[kB].reserve_refused; }, 30000));
  std::string b_kv_written;  // B's blocks as read back once its prefill finished
  if (r.seen[kB].reserved) {
    r.Prefill("prefill-fast", kB, prompts[1], kMax);
    ASSERT_TRUE(r.Until([&] { return r.seen[kB].kv_ready; }, 60000)) << logs();
    ASSERT_TRUE(r.seen[kB].kv_ready_ok) << logs();
    b_kv_written = r.ReadKv(kB);
  }
  // A's writer resumes and writes A's (expired) lease.
  slow.Kill(SIGCONT);
  ASSERT_TRUE(r.Until([&] { return r.seen[kA].kv_ready; }, 60000)) << logs();
  // Starting A now is refused: its lease is no longer live.
  r.StartDecode(kA, prompts[0], kMax);
  ASSERT_TRUE(r.Until([&] { return r.seen[kA].finished; }, 30000)) << logs();
  EXPECT_EQ(r.seen[kA].reason, wire::FinishReason::ERROR);
  if (!r.seen[kB].reserved) {
    // B was refused while A's blocks waited for their writer; now there is room.
    r.Reserve(kB, prompts[1].size(), 30000);
    ASSERT_TRUE(r.Until([&] { return r.seen[kB].reserved || r.seen[kB].reserve_refused; }, 30000));
    ASSERT_TRUE(r.seen[kB].reserved) << "A's blocks never returned to the pool\n" << logs();
    r.Prefill("prefill-fast", kB, prompts[1], kMax);
    ASSERT_TRUE(r.Until([&] { return r.seen[kB].kv_ready; }, 60000)) << logs();
    ASSERT_TRUE(r.seen[kB].kv_ready_ok) << logs();
    b_kv_written = r.ReadKv(kB);
  }
  // B's KV is as its own prefill wrote it.
  const std::string b_kv_now = r.ReadKv(kB);
  ASSERT_FALSE(b_kv_now.empty());
  EXPECT_TRUE(b_kv_now == b_kv_written) << "A's late writer overwrote B's blocks (A: "
                                        << Show(r.seen[kA].blocks) << "; B: "
                                        << Show(r.seen[kB].blocks) << ")";
  r.StartDecode(kB, prompts[1], kMax);
  ASSERT_TRUE(r.Until([&] { return r.seen[kB].finished; }, 60000)) << logs();
  EXPECT_EQ(r.seen[kB].reason, wire::FinishReason::LENGTH) << r.seen[kB].error;
  EXPECT_EQ(r.seen[kB].out, ref[0]) << "request B read KV that A's late writer overwrote";
  // No block leaked: the decode worker's heartbeat shows the whole pool free.
  bool all_free = r.Until([&] {
    const auto* d = r.server->FindPeer("decode-0");
    return d && d->load.free_kv_blocks == kBlocks && d->load.reserved_kv_blocks == 0;
  }, 30000);
  EXPECT_TRUE(all_free) << logs();
}

// A stream taken over after its decode worker was lost, as the router places it again: a lease
// for the prompt and the tokens streamed, the prompt's KV from a prefill worker, and
// StartDecode with the streamed tokens, the KV of all but the last of them (uncachedTokens)
// for the decode worker to compute. The stream continues with the in-process engine's tokens
// and log-probabilities (which, unlike this random model's greedy tokens, show the KV of the
// whole context). An uncachedTokens beyond the tokens streamed before firstToken is refused,
// and no block leaks.
TEST(Workers, ATakenOverStreamContinuesFromTheStreamedTokensKvItComputes) {
  testing::UseBatchInvariantKernels();
  StepRouter r;
  const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
  mkdir(log_dir.c_str(), 0755);
  const std::string beat = std::to_string(StepRouter::kBeatMs);
  constexpr int kBlocks = 32;
  testing::ChildProcess decode, prefill;
  ASSERT_TRUE(decode.Start({Bin("pw-decode"), "--insecure", "--model", ModelDir(), "--router",
                            r.endpoint, "--id", "decode-0", "--kv-blocks", std::to_string(kBlocks),
                            "--heartbeat-ms", beat},
                           log_dir + "/TakenOver.decode.log"));
  ASSERT_TRUE(prefill.Start({Bin("pw-prefill"), "--insecure", "--model", ModelDir(), "--router",
                             r.endpoint, "--id", "prefill-0", "--heartbeat-ms", beat},
                            log_dir + "/TakenOver.prefill.log"));
  auto logs = [&] { return "decode:\n" + decode.Log() + "\nprefill:\n" + prefill.Log(); };
  ASSERT_TRUE(r.Until([&] {
    return r.server->FindPeer("decode-0") && r.server->FindPeer("prefill-0");
  }, 120000)) << logs();

  const auto prompt = RandomPrompts(1, 2718, 20, 20)[0];
  constexpr int kMax = 40, kStreamed = 13;
  std::vector<int32_t> ref;
  std::vector<float> ref_logprobs;
  {
    auto e = engine::Engine::Create(ModelDir(), {.kv_dtype = engine::KvDtype::kBf16});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine::SamplingParams p;
    p.max_tokens = kMax;
    p.ignore_eos = true;
    p.logprobs = 0;
    ASSERT_TRUE((*e)->AddSequence(1, prompt, p).ok());
    while ((*e)->HasWork()) {
      auto step = (*e)->Step();
      ASSERT_TRUE(step.ok()) << step.status().ToString();
      for (auto& u : step->updates) {
        ref.insert(ref.end(), u.new_tokens.begin(), u.new_tokens.end());
        for (const auto& lp : u.logprobs) ref_logprobs.push_back(lp.logprob);
      }
    }
  }
  ASSERT_EQ(ref_logprobs.size(), static_cast<size_t>(kMax));
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), ref.begin(), ref.begin() + kStreamed - 1);
  for (uint64_t id : {1, 2}) {
    r.Reserve(id, prompt.size() + kStreamed, 30000);
    ASSERT_TRUE(r.Until([&] { return r.seen[id].reserved; }, 30000)) << logs();
    r.Prefill("prefill-0", id, prompt, kMax);
    ASSERT_TRUE(r.Until([&] { return r.seen[id].kv_ready; }, 60000)) << logs();
    ASSERT_TRUE(r.seen[id].kv_ready_ok) << logs();
    ASSERT_EQ(r.seen[id].out, std::vector<int32_t>{ref[0]});  // streamed before; dropped
    r.seen[id].out.clear();
  }
  r.StartDecode(1, tokens, ref[kStreamed - 1], kStreamed, kStreamed - 1, kMax, /*logprobs=*/0);
  r.StartDecode(2, tokens, ref[kStreamed - 1], kStreamed, kStreamed, kMax);
  ASSERT_TRUE(r.Until([&] { return r.seen[1].finished && r.seen[2].finished; }, 60000)) << logs();
  EXPECT_EQ(r.seen[1].reason, wire::FinishReason::LENGTH) << r.seen[1].error;
  EXPECT_EQ(r.seen[1].out, std::vector<int32_t>(ref.begin() + kStreamed, ref.end()));
  ASSERT_EQ(r.seen[1].logprobs.size(), static_cast<size_t>(kMax - kStreamed));
  for (int i = kStreamed; i < kMax; ++i) {
    EXPECT_NEAR(r.seen[1].logprobs[i - kStreamed], ref_logprobs[i], 1e-4) << "output token " << i;
  }
  EXPECT_EQ(r.seen[2].reason, wire::FinishReason::ERROR);
  EXPECT_NE(r.seen[2].error.find("uncachedTokens"), std::string::npos) << r.seen[2].error;
  EXPECT_TRUE(r.seen[2].out.empty());
  bool all_free = r.Until([&] {
    const auto* d = r.server->FindPeer("decode-0");
    return d && d->load.free_kv_blocks == kBlocks && d->load.reserved_kv_blocks == 0;
  }, 30000);
  EXPECT_TRUE(all_free) << logs();
}

// A StartDecode whose own sampling values the decode worker cannot compute with (top_p 0: what
// 1e-320 is as a float; the prefill worker was given valid ones) is refused as an invalid
// request naming the field, and the lease's blocks go back to the pool.
TEST(Workers, DecodeWorkerRefusesTheRequestsOwnSamplingValuesAsAnInvalidRequest) {
  StepRouter r;
  const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
  mkdir(log_dir.c_str(), 0755);
  const std::string tag = "DecodeRefusesSampling";
  const std::string beat = std::to_string(StepRouter::kBeatMs);
  constexpr int kBlocks = 8;
  testing::ChildProcess decode, prefill;
  ASSERT_TRUE(decode.Start({Bin("pw-decode"), "--insecure", "--model", ModelDir(), "--router", r.endpoint,
                            "--id", "decode-0", "--kv-blocks", std::to_string(kBlocks),
                            "--heartbeat-ms", beat},
                           log_dir + "/" + tag + ".decode.log"));
  ASSERT_TRUE(prefill.Start({Bin("pw-prefill"), "--insecure", "--model", ModelDir(), "--router", r.endpoint,
                             "--id", "prefill-0", "--heartbeat-ms", beat},
                            log_dir + "/" + tag + ".prefill.log"));
  auto logs = [&] { return "decode:\n" + decode.Log() + "\nprefill:\n" + prefill.Log(); };
  ASSERT_TRUE(r.Until([&] {
    return r.server->FindPeer("decode-0") && r.server->FindPeer("prefill-0");
  }, 120000)) << logs();
  auto prompts = RandomPrompts(1, 7, 20, 20);
  const uint64_t kId = 1;
  r.Reserve(kId, prompts[0].size(), 30000);
  ASSERT_TRUE(r.Until([&] { return r.seen[kId].reserved; }, 30000)) << logs();
  r.Prefill("prefill-0", kId, prompts[0], 8);
  ASSERT_TRUE(r.Until([&] { return r.seen[kId].kv_ready; }, 60000)) << logs();
  ASSERT_TRUE(r.seen[kId].kv_ready_ok) << logs();
  r.StartDecode(kId, prompts[0], 8, static_cast<float>(1e-320));
  ASSERT_TRUE(r.Until([&] { return r.seen[kId].finished; }, 30000)) << logs();
  EXPECT_EQ(r.seen[kId].reason, wire::FinishReason::ERROR);
  EXPECT_EQ(r.seen[kId].error_kind, wire::ErrorKind::INVALID_REQUEST) << r.seen[kId].error;
  EXPECT_EQ(r.seen[kId].error_param, "top_p") << r.seen[kId].error;
  bool all_free = r.Until([&] {
    const auto* d = r.server->FindPeer("decode-0");
    return d && d->load.free_kv_blocks == kBlocks && d->load.reserved_kv_blocks == 0;
  }, 30000);
  EXPECT_TRUE(all_free) << logs();
  EXPECT_TRUE(decode.running() && prefill.running()) << logs();
}

// A request queued behind a prefill worker longer than its lease (here: the worker is stopped)
// keeps its blocks while the router renews the lease (KvRenew): once prefilled it decodes the
// engine's tokens. A lease reserved later and not renewed expires meanwhile, so the renewed one
// outlived its own lease time.
TEST(Workers, RenewedLeaseOutlivesItsTimeWhileItsPrefillWaits) {
  StepRouter r;
  const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
  mkdir(log_dir.c_str(), 0755);
  const std::string tag = "RenewedLease";
  for (const char* who : {".decode.log", ".prefill.log"}) unlink((log_dir + "/" + tag + who).c_str());
  const std::string beat = std::to_string(StepRouter::kBeatMs);
  testing::ChildProcess decode, prefill;
  ASSERT_TRUE(decode.Start({Bin("pw-decode"), "--insecure", "--model", ModelDir(), "--router", r.endpoint,
                            "--id", "decode-0", "--kv-blocks", "32", "--heartbeat-ms", beat},
                           log_dir + "/" + tag + ".decode.log"));
  ASSERT_TRUE(prefill.Start({Bin("pw-prefill"), "--insecure", "--model", ModelDir(), "--router", r.endpoint,
                             "--id", "prefill-0", "--heartbeat-ms", beat},
                            log_dir + "/" + tag + ".prefill.log"));
  auto logs = [&] { return "decode:\n" + decode.Log() + "\nprefill:\n" + prefill.Log(); };
  ASSERT_TRUE(r.Until([&] { return r.server->FindPeer("decode-0") && r.server->FindPeer("prefill-0"); },
                      120000))
      << logs();
  auto prompts = RandomPrompts(1, 4242, 40, 40);
  const int kMax = 12;
  auto ref = Reference({prompts[0]}, kMax);
  const uint64_t kA = 1, kB = 2;
  constexpr uint32_t kLeaseMs = 300;
  prefill.Kill(SIGSTOP);  // A waits behind it
  r.Reserve(kA, prompts[0].size(), kLeaseMs);
  ASSERT_TRUE(r.Until([&] { return r.seen[kA].reserved; }, 30000)) << logs();
  r.Prefill("prefill-0", kA, prompts[0], kMax);
  r.Reserve(kB, 16, kLeaseMs);  // never renewed
  ASSERT_TRUE(r.Until([&] { return r.seen[kB].reserved; }, 30000)) << logs();
  // Renew A every third of its lease until B, reserved after it, has expired.
  const auto b_expired = [&] { return decode.Log().find("of request 2 expired") != std::string::npos; };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!b_expired() && std::chrono::steady_clock::now() < deadline) {
    r.Renew(kA, kLeaseMs);
    r.Poll(kLeaseMs / 3);
  }
  ASSERT_TRUE(b_expired()) << logs();
  EXPECT_EQ(decode.Log().find("of request 1 expired"), std::string::npos) << logs();
  // The prefill worker resumes: A's KV arrives in its still-leased blocks and decodes.
  prefill.Kill(SIGCONT);
  ASSERT_TRUE(r.Until([&] {
    if (!r.seen[kA].kv_ready) r.Renew(kA, kLeaseMs);
    return r.seen[kA].kv_ready;
  }, 60000)) << logs();
  ASSERT_TRUE(r.seen[kA].kv_ready_ok) << logs();
  r.StartDecode(kA, prompts[0], kMax);
  ASSERT_TRUE(r.Until([&] { return r.seen[kA].finished; }, 60000)) << logs();
  EXPECT_EQ(r.seen[kA].reason, wire::FinishReason::LENGTH) << r.seen[kA].error;
  EXPECT_EQ(r.seen[kA].out, ref[0]);
}

// A decode worker whose broker is not there waits for its expert weights; SIGTERM in that wait
// stops it at once with exit status 0 (it used to wait out the whole weights timeout).
TEST(Workers, ADecodeWorkerWaitingForItsBrokerStopsOnSigterm) {
  const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
  mkdir(log_dir.c_str(), 0755);
  const std::string log_path = log_dir + "/WaitingForBrokerStops.decode.log";
  unlink(log_path.c_str());
  testing::ChildProcess decode;
  const std::string nobody = "tcp://127.0.0.1:" + std::to_string(testing::FreePort());
  ASSERT_TRUE(decode.Start({Bin("pw-decode"), "--insecure", "--model", ModelDir(), "--router",
                            "tcp://127.0.0.1:" + std::to_string(testing::FreePort()), "--broker", nobody,
                            "--id", "decode-0"},
                           log_path));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (decode.Log().find("waiting for the broker's expert weights") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(decode.Log().find("waiting for the broker's expert weights"), std::string::npos) << decode.Log();
  const auto t0 = std::chrono::steady_clock::now();
  decode.Kill(SIGTERM);
  EXPECT_EQ(decode.Wait(10000), 0) << decode.Log();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_NE(decode.Log().find("stopped before serving"), std::string::npos) << decode.Log();
}

// The router dies while a lease is held: the decode worker quarantines the lease's blocks (a
// prefill worker may have been writing them) and, since no router will ever speak for them,
// frees them after router_lost_quarantine_ms instead of the 600 s fallback.
TEST(Workers, RouterLossShortensTheQuarantine) {
  auto r = std::make_unique<StepRouter>();
  const std::string endpoint = r->endpoint;
  const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
  mkdir(log_dir.c_str(), 0755);
  const std::string log_path = log_dir + "/RouterLossQuarantine.decode.log";
  unlink(log_path.c_str());
  constexpr int kBlocks = 8;
  testing::ChildProcess decode;
  ASSERT_TRUE(decode.Start({Bin("pw-decode"), "--insecure", "--model", ModelDir(), "--router", endpoint, "--id",
                            "decode-0", "--kv-blocks", std::to_string(kBlocks), "--heartbeat-ms",
                            "200", "--quarantine-max-ms", "600000", "--router-lost-quarantine-ms",
                            "2000"},
                           log_path));
  ASSERT_TRUE(r->Until([&] { return r->server->FindPeer("decode-0") != nullptr; }, 120000))
      << decode.Log();
  r->Reserve(1, 40, 600000);
  ASSERT_TRUE(r->Until([&] { return r->seen[1].reserved; }, 30000)) << decode.Log();
  ASSERT_FALSE(r->seen[1].blocks.empty());
  // The router goes away; the decode worker notices after 3 silent heartbeats.
  r.reset();
  const auto lost_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (decode.Log().find("router lost") == std::string::npos &&
         std::chrono::steady_clock::now() < lost_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(decode.Log().find("router lost"), std::string::npos) << decode.Log();
  ASSERT_NE(decode.Log().find("quarantined"), std::string::npos) << decode.Log();
  // A new router on the same endpoint: the worker registers again and, within seconds (not
  // 600 s), reports its whole pool free.
  StepRouter r2(endpoint);
  ASSERT_TRUE(r2.Until([&] { return r2.server->FindPeer("decode-0") != nullptr; }, 60000))
      << decode.Log();
  const bool all_free = r2.Until([&] {
    const auto* d = r2.server->FindPeer("decode-0");
    return d && d->load.free_kv_blocks == kBlocks && d->load.reserved_kv_blocks == 0;
  }, 60000);
  EXPECT_TRUE(all_free) << decode.Log();
  EXPECT_NE(decode.Log().find("quarantined blocks freed"), std::string::npos) << decode.Log();
}

}  // namespace
}  // namespace pw

namespace pw {
namespace {

// Long engine steps must not silence the decode worker. Three 1900-token requests on the
// embedded model share a KV pool 6 blocks short of what they grow to, so the decode worker
// preempts and recomputes: steps of ~1900 prompt tokens, each many 20 ms heartbeat intervals
// long. The router side counts the decode worker's heartbeats between consecutive TokenChunk
// frames (frames of one link arrive in order): a worker that beat only between steps would
// send at most one per gap. It must never be declared dead, and the tokens must still equal
// the in-process engine's.
TEST(Workers, LongDecodeStepsDoNotStopHeartbeats) {
  constexpr uint64_t kBeatMs = 20;
  // Dead after 10 silent beats (200 ms): generous for a loaded machine, below the steps here.
  constexpr uint32_t kDeadAfterBeats = 10;
  constexpr int kPrompt = 1900, kMax = 40, kSeqs = 3;
  constexpr int kBlockTokens = 16;
  const int prompt_blocks = engine::BlocksForTokens(kPrompt, kBlockTokens);          // 119
  const int kv_blocks = kSeqs * prompt_blocks + 3;                                   // 360
  ASSERT_LT(kv_blocks, kSeqs * engine::BlocksForTokens(kPrompt + kMax, kBlockTokens));  // 366
  const std::string model = std::string(PW_SOURCE_DIR) + "/models/tiny-moe";

  auto bound = transport::ZmqRouterTransport::Bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  const std::string endpoint = (*bound)->endpoint();
  ControlServer::Options so;
  so.id = "router";
  so.heartbeat_ms = kBeatMs;
  so.dead_after_beats = kDeadAfterBeats;
  ControlServer server(std::move(bound).value(), pw::SteadyClock::Get(), so);
  std::vector<std::string> dead;
  server.on_peer_dead = [&](const std::string& peer, const transport::PeerInfo&) {
    dead.push_back(peer);
  };

  const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
  mkdir(log_dir.c_str(), 0755);
  for (const char* who : {".decode.log", ".prefill.log"}) {
    unlink((log_dir + "/LongDecodeSteps" + who).c_str());  // this run's log is read below
  }
  const std::string beat = std::to_string(kBeatMs);
  testing::ChildProcess decode, prefill;
  ASSERT_TRUE(decode.Start({Bin("pw-decode"), "--insecure", "--model", model, "--router", endpoint, "--id",
                            "decode-0", "--kv-blocks", std::to_string(kv_blocks), "--block-size",
                            std::to_string(kBlockTokens), "--max-batch-tokens", "8192",
                            "--threads", "1", "--heartbeat-ms", beat},
                           log_dir + "/LongDecodeSteps.decode.log"));
  // The prefill worker beats at 50 ms: it drops its prompts when the router has been silent for
  // 3 of its beats, and at 20 ms a test process descheduled for 60 ms on a loaded machine was
  // enough; the router still hears it within its 200 ms. The decode worker's beats are the test.
  ASSERT_TRUE(prefill.Start({Bin("pw-prefill"), "--insecure", "--model", model, "--router", endpoint, "--id",
                             "prefill-0", "--block-size", std::to_string(kBlockTokens),
                             "--heartbeat-ms", "50"},
                            log_dir + "/LongDecodeSteps.prefill.log"));
  auto logs = [&] { return "decode:\n" + decode.Log() + "\nprefill:\n" + prefill.Log(); };

  struct Seq {
    std::vector<int32_t> prompt, out;
    uint64_t lease = 0;
    std::vector<uint32_t> blocks;
    std::vector<uint32_t> pages;
    bool reserved = false, ready = false, finished = false;
    wire::FinishReason reason = wire::FinishReason::STOP;
    std::string error;
  };
  std::map<uint64_t, Seq> seqs;
  auto prompts = RandomPrompts(kSeqs, 2718, kPrompt, kPrompt);
  for (int i = 0; i < kSeqs; ++i) seqs[static_cast<uint64_t>(i + 1)].prompt = prompts[i];
  // Gaps between consecutive TokenChunk frames, and the decode worker's heartbeats within.
  std::chrono::steady_clock::time_point last_chunk;
  uint64_t last_chunk_beats = 0;
  bool any_chunk = false;
  double longest_gap_ms = 0;
  uint64_t beats_in_longest = 0;
  auto sampling = [&](wire::SamplingParams::Builder s) {
    s.setTemperature(0);
    s.setMaxTokens(kMax);
    s.setIgnoreEos(true);
  };
  auto handler = [&](const std::string& peer, const proto::InMessage& m) -> Status {
    switch (m.which()) {
      case proto::Body::KV_RESERVE_REPLY: {
        auto rep = m.body().getKvReserveReply();
        Seq& s = seqs.at(rep.getRequestId());
        if (!rep.getOk()) {
          s.finished = true;
          s.error = "reserve: " + proto::ToString(rep.getError());
          return Status::Ok();
        }
        s.reserved = true;
        s.lease = rep.getLeaseId();
        s.blocks = proto::ToVector<uint32_t>(rep.getBlockIds());
        s.pages = proto::ToVector<uint32_t>(rep.getPageIds());
        auto reg = server.FindPeer("decode-0")->registration->body().getRegister();
        proto::OutMessage out;
        auto pr = out.body().initPrefillRequest();
        pr.setRequestId(rep.getRequestId());
        auto toks = pr.initTokens(static_cast<unsigned>(s.prompt.size()));
        for (size_t i = 0; i < s.prompt.size(); ++i) toks.set(i, static_cast<uint32_t>(s.prompt[i]));
        sampling(pr.initSampling());
        pr.setDecodeWorkerId("decode-0");
        pr.setDecodeMemory(reg.getKvMemory());
        pr.setDecodeLayout(reg.getKvLayout());
        proto::FillU32([&](unsigned n) { return pr.initBlockIds(n); }, s.blocks);
        proto::FillU32([&](unsigned n) { return pr.initPageIds(n); }, s.pages);
        pr.setLeaseId(s.lease);
        return server.Send("prefill-0", out);
      }
      case proto::Body::KV_READY: {
        auto kr = m.body().getKvReady();
        Seq& s = seqs.at(kr.getRequestId());
        if (!kr.getOk()) {
          s.finished = true;
          s.error = "prefill: " + proto::ToString(kr.getError());
          return Status::Ok();
        }
        s.ready = true;
        s.out.push_back(static_cast<int32_t>(kr.getFirstToken()));
        return Status::Ok();
      }
      case proto::Body::TOKEN_CHUNK: {
        const auto now = std::chrono::steady_clock::now();
        const transport::PeerInfo* d = server.FindPeer(peer);
        const uint64_t beats = d ? d->heartbeats : 0;
        if (any_chunk) {
          const double gap = std::chrono::duration<double, std::milli>(now - last_chunk).count();
          if (gap > longest_gap_ms) {
            longest_gap_ms = gap;
            beats_in_longest = beats - last_chunk_beats;
          }
        }
        any_chunk = true;
        last_chunk = now;
        last_chunk_beats = beats;
        auto tc = m.body().getTokenChunk();
        Seq& s = seqs.at(tc.getRequestId());
        if (tc.getStartIndex() != s.out.size()) {
          s.error = "gap or repeat at " + std::to_string(tc.getStartIndex());
        }
        for (uint32_t t : tc.getTokens()) s.out.push_back(static_cast<int32_t>(t));
        return Status::Ok();
      }
      case proto::Body::FINISH: {
        auto f = m.body().getFinish();
        Seq& s = seqs.at(f.getRequestId());
        s.finished = true;
        s.reason = f.getReason();
        if (f.getReason() == wire::FinishReason::ERROR) s.error = proto::ToString(f.getError());
        return Status::Ok();
      }
      default:
        return Status::Ok();
    }
  };
  auto until = [&](auto done, int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!done() && std::chrono::steady_clock::now() < deadline) server.Poll(10, handler);
    return done();
  };
  ASSERT_TRUE(until([&] {
    return server.FindPeer("decode-0") != nullptr && server.FindPeer("prefill-0") != nullptr;
  }, 120000)) << logs();

  for (auto& [id, s] : seqs) {
    proto::OutMessage m;
    auto k = m.body().initKvReserve();
    k.setRequestId(id);
    k.setNumTokens(static_cast<uint32_t>(s.prompt.size()));
    k.setLeaseMs(120000);
    ASSERT_TRUE(server.Send("decode-0", m).ok());
  }
  // Every prompt's KV first, then all three start decoding at once (so they outgrow the pool
  // together).
  ASSERT_TRUE(until([&] {
    for (auto& [id, s] : seqs) {
      if (!s.ready && !s.finished) return false;
    }
    return true;
  }, 300000)) << logs();
  for (auto& [id, s] : seqs) {
    ASSERT_TRUE(s.ready) << "request " << id << ": " << s.error << "\n" << logs();
    proto::OutMessage out;
    auto sd = out.body().initStartDecode();
    sd.setRequestId(id);
    sd.setLeaseId(s.lease);
    auto toks = sd.initTokens(static_cast<unsigned>(s.prompt.size()));
    for (size_t i = 0; i < s.prompt.size(); ++i) toks.set(i, static_cast<uint32_t>(s.prompt[i]));
    sd.setFirstToken(static_cast<uint32_t>(s.out.at(0)));
    sampling(sd.initSampling());
    sd.setGeneratedSoFar(1);
    ASSERT_TRUE(server.Send("decode-0", out).ok());
  }
  // A worker declared dead drops its requests when it learns it: stop waiting then.
  until([&] {
    if (!dead.empty()) return true;
    for (auto& [id, s] : seqs) {
      if (!s.finished) return false;
    }
    return true;
  }, 300000);
  std::printf("longest gap between TokenChunks %.0f ms, %llu decode heartbeats heard in it\n",
              longest_gap_ms, static_cast<unsigned long long>(beats_in_longest));
  ASSERT_TRUE(dead.empty()) << dead.front() << " declared dead (longest gap between TokenChunks "
                            << longest_gap_ms << " ms, " << beats_in_longest
                            << " heartbeats in it)\n" << logs();
  for (auto& [id, s] : seqs) ASSERT_TRUE(s.finished) << "request " << id << "\n" << logs();
  EXPECT_NE(server.FindPeer("decode-0"), nullptr);
  EXPECT_NE(decode.Log().find("preempted"), std::string::npos) << logs();
  engine::EngineOptions eo;
  eo.kv_dtype = engine::KvDtype::kBf16;  // the workers' default
  eo.num_kv_blocks = 1024;
  eo.max_batch_tokens = 2048;
  auto e = engine::Engine::Create(model, eo);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  engine::SamplingParams p;
  p.max_tokens = kMax;
  p.ignore_eos = true;
  for (auto& [id, s] : seqs) ASSERT_TRUE((*e)->AddSequence(id, s.prompt, p).ok());
  std::map<uint64_t, std::vector<int32_t>> ref;
  while ((*e)->HasWork()) {
    auto step = (*e)->Step();
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    for (auto& u : step->updates) ref[u.id].insert(ref[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
  }
  for (auto& [id, s] : seqs) {
    EXPECT_TRUE(s.error.empty()) << "request " << id << ": " << s.error;
    EXPECT_EQ(s.reason, wire::FinishReason::LENGTH) << "request " << id;
    EXPECT_EQ(s.out, ref[id]) << "request " << id;
  }
  if (longest_gap_ms < 5 * kBeatMs) {
    GTEST_SKIP() << "the longest step took " << longest_gap_ms << " ms, too short to tell";
  }
  // A worker beating only between steps sends at most one heartbeat per gap; this one sends one
  // every interval: ask for at least one per 5 on average, and 2.
  EXPECT_GE(beats_in_longest, 2u) << "during a step of " << longest_gap_ms << " ms";
  EXPECT_GE(static_cast<double>(beats_in_longest), longest_gap_ms / (5.0 * kBeatMs))
      << "during a step of " << longest_gap_ms << " ms";
  // The keepalive stops with the worker: SIGTERM still drains and exits cleanly.
  decode.Kill(SIGTERM);
  prefill.Kill(SIGTERM);
  EXPECT_EQ(decode.Wait(30000), 0) << logs();
  EXPECT_EQ(prefill.Wait(30000), 0) << logs();
  EXPECT_NE(decode.Log().find("heartbeats sent during engine steps"), std::string::npos) << logs();
}

// A broker serving an .apw store registers the store's memory with UCX; on SIGTERM it must
// give the registration back before the UCX context goes (UCX aborts on a region still
// registered at cleanup), so the process exits 0 after logging that it stopped.
// Loading every expert block from the broker's store at 8 bits takes many heartbeat
// intervals before the decode worker's loop runs: it beats to the broker meanwhile, so the
// broker never declares it dead and it never has to register again.
TEST(Workers, ADecodeWorkerLoadingItsExpertsKeepsBeatingToTheBroker) {
  const std::string model = std::string(PW_SOURCE_DIR) + "/models/tiny-moe";
  const std::string store = std::string(PW_BINARY_DIR) + "/tiny-moe.apw";
  if (!std::filesystem::exists(model + "/model.safetensors")) GTEST_SKIP() << "no weights in " << model;
  if (!std::filesystem::exists(store)) GTEST_SKIP() << "no store " << store << " (built by the Release build)";
  const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
  mkdir(log_dir.c_str(), 0755);
  const std::string tag = log_dir + "/LoadingKeepsBeating";
  for (const char* who : {".broker.log", ".decode.log"}) unlink((tag + who).c_str());
  StepRouter r;
  const std::string beat = "100";  // dead after 300 ms of silence
  const std::string broker_ep = "tcp://127.0.0.1:" + std::to_string(FreePort());
  testing::ChildProcess broker, decode;
  ASSERT_TRUE(broker.Start({Bin("pw-broker"), "--insecure", "--model", model, "--store", store, "--bind",
                            broker_ep, "--heartbeat-ms", beat, "--initial-bits", "8"},
                           tag + ".broker.log"));
  ASSERT_TRUE(decode.Start({Bin("pw-decode"), "--insecure", "--model", model, "--router", r.endpoint, "--broker",
                            broker_ep, "--id", "decode-0", "--kv-blocks", "64", "--heartbeat-ms", beat},
                           tag + ".decode.log"));
  auto logs = [&] { return "broker:\n" + broker.Log() + "\ndecode:\n" + decode.Log(); };
  // The decode worker registers with the router once its experts are loaded.
  ASSERT_TRUE(r.Until([&] { return r.server->FindPeer("decode-0") != nullptr; }, 120000)) << logs();
  ASSERT_NE(decode.Log().find("expert blocks at 8 bits"), std::string::npos) << logs();
  EXPECT_EQ(broker.Log().find("declared dead"), std::string::npos) << logs();
  EXPECT_EQ(decode.Log().find("registering again"), std::string::npos) << logs();
  decode.Kill(SIGTERM);
  EXPECT_EQ(decode.Wait(30000), 0) << logs();
  broker.Kill(SIGTERM);
  EXPECT_EQ(broker.Wait(30000), 0) << logs();
}

// A decode worker's heartbeat says how many KV blocks its pool could hold (the router admits
// against it): with a 26 MiB pool of 4 KiB pages and every expert at 8 bits, 512 pages (128
// blocks of 4 layers) are free; told the planner's floors, it counts what lowering to them
// would free too, up to the engine's 1664 blocks.
TEST(Workers, ADecodeWorkerReportsTheKvItsPoolCouldHoldAfterALowering) {
  const std::string model = std::string(PW_SOURCE_DIR) + "/models/tiny-moe";
  const std::string store = std::string(PW_BINARY_DIR) + "/tiny-moe.apw";
  if (!std::filesystem::exists(model + "/model.safetensors")) GTEST_SKIP() << "no weights in " << model;
  if (!std::filesystem::exists(store)) GTEST_SKIP() << "no store " << store << " (built by the Release build)";
  const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
  mkdir(log_dir.c_str(), 0755);
  const std::string tag = log_dir + "/KvCapacity";
  for (const char* who : {".broker.log", ".fixed.log", ".lowering.log"}) unlink((tag + who).c_str());
  StepRouter r;
  const std::string broker_ep = "tcp://127.0.0.1:" + std::to_string(FreePort());
  testing::ChildProcess broker, fixed, lowering;
  ASSERT_TRUE(broker.Start({Bin("pw-broker"), "--insecure", "--model", model, "--store", store, "--bind",
                            broker_ep, "--initial-bits", "8"},
                           tag + ".broker.log"));
  const std::vector<std::string> decode = {Bin("pw-decode"), "--insecure", "--model", model, "--router",
                                           r.endpoint, "--broker", broker_ep, "--pool-bytes",
                                           std::to_string(26 << 20), "--page-bytes", "4096"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = decode;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  };
  ASSERT_TRUE(fixed.Start(with({"--id", "decode-fixed"}), tag + ".fixed.log"));
  ASSERT_TRUE(lowering.Start(with({"--id", "decode-lowering", "--planner-min-bits", "3"}), tag + ".lowering.log"));
  auto logs = [&] { return "fixed:\n" + fixed.Log() + "\nlowering:\n" + lowering.Log(); };
  auto capacity = [&](const char* id) -> int64_t {
    const auto* p = r.server->FindPeer(id);
    return p != nullptr && p->heartbeats > 0 ? static_cast<int64_t>(p->load.kv_capacity_blocks) : int64_t{-1};
  };
  ASSERT_TRUE(r.Until([&] { return capacity("decode-fixed") >= 0 && capacity("decode-lowering") >= 0; }, 120000))
      << logs();
  EXPECT_EQ(capacity("decode-fixed"), 128) << logs();
  EXPECT_GT(capacity("decode-lowering"), 128) << logs();
  EXPECT_LE(capacity("decode-lowering"), 1664) << logs();
  for (auto* p : {&fixed, &lowering, &broker}) p->Kill(SIGTERM);
}

TEST(Workers, BrokerServingAStoreStopsCleanlyOnSigterm) {
  const std::string model = std::string(PW_SOURCE_DIR) + "/models/tiny-moe";
  const std::string store = std::string(PW_BINARY_DIR) + "/tiny-moe.apw";
  if (!std::filesystem::exists(model + "/model.safetensors")) GTEST_SKIP() << "no weights in " << model;
  if (!std::filesystem::exists(store)) GTEST_SKIP() << "no store " << store << " (built by the Release build)";
  const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
  mkdir(log_dir.c_str(), 0755);
  const std::string log = log_dir + "/BrokerServingAStoreStopsCleanly.broker.log";
  unlink(log.c_str());
  testing::ChildProcess broker;
  ASSERT_TRUE(broker.Start({Bin("pw-broker"), "--insecure", "--model", model, "--store", store, "--bind",
                            "tcp://127.0.0.1:" + std::to_string(FreePort())},
                           log));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (broker.Log().find("broker: store") == std::string::npos && broker.running() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(broker.Log().find("broker: store"), std::string::npos) << broker.Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // into its serving loop
  broker.Kill(SIGTERM);
  EXPECT_EQ(broker.Wait(30000), 0) << broker.Log();
  EXPECT_NE(broker.Log().find("broker: stopped"), std::string::npos) << broker.Log();
  EXPECT_EQ(broker.Log().find("Assertion"), std::string::npos) << broker.Log();
}

// gpt_oss (sinks, sliding-window layers whose pages the decode worker gives back behind each
// sequence's window, expert biases from the model) served by real processes, its routed experts'
// matrices from the broker (read from the stacked checkpoint), prompts and generations longer
// than its window of 8: the in-process engine's tokens.
TEST(Workers, GptOssGreedyTokensEqualInProcessEngine) {
  UseModel model("gpt_oss");
  Cluster c;
  ASSERT_TRUE(c.Start()) << c.Logs();
  ExpectServedTokensEqualTheEngine(c, 6, 3131, 10, 40, 1000, 500, 40);  // vocabulary 1024
  ExpectCleanStop(c);
}

// gemma4 (sandwich norms, a dense MLP beside the experts, sliding layers with their own RoPE
// whose pages the decode worker gives back, attention_k_eq_v) served by real processes, its
// routed experts' matrices from the broker (read from the stacked checkpoint), prompts and
// generations longer than its window of 8: the in-process engine's tokens.
TEST(Workers, Gemma4GreedyTokensEqualInProcessEngine) {
  UseModel model("gemma4");
  Cluster c;
  ASSERT_TRUE(c.Start()) << c.Logs();
  ExpectServedTokensEqualTheEngine(c, 6, 4141, 10, 40, 1000, 600, 40);  // vocabulary 1024
  ExpectCleanStop(c);
}

// gemma4_global: full layers of their own KV shape (1 kv head x 32 against the sliding layers'
// 4 x 16, as Gemma-4-26B-A4B's 2 x 512 against 8 x 256: a full layer of a block half a sliding
// one's bytes) served by real processes, each layer's own bytes put from the prefill worker's
// pages into the decode worker's, which are twice as large (8192 bytes against the widest
// layer's 4096): the in-process engine's tokens, past the window of 8.
TEST(Workers, Gemma4LayersOfTheirOwnKvWidthGreedyTokensEqualInProcessEngine) {
  UseModel model("gemma4_global");
  Cluster c;
  c.decode_args = {"--page-bytes", "8192"};
  ASSERT_TRUE(c.Start()) << c.Logs();
  ExpectServedTokensEqualTheEngine(c, 6, 4343, 10, 40, 1000, 700, 40);  // vocabulary 1024
  ExpectCleanStop(c);
}

// A long gpt_oss stream through real processes: the decode worker's metrics show the KV pages
// of its sliding-window layers (0 and 2 of 3, window 8) staying bounded (at most window /
// block_size + 2 blocks each, block size 16) while its full-attention layer's grow with the
// stream, sampled while it runs; the tokens are the in-process engine's.
TEST(Workers, GptOssSlidingWindowPagesStayBoundedInALongStream) {
  UseModel model("gpt_oss");
  Cluster c;
  c.decode_metrics_port = FreePort();
  ASSERT_TRUE(c.Start(/*decode_kv_blocks=*/256, /*use_broker=*/false)) << c.Logs();
  const int kMax = 1500;
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 300, 41, 99, 7, 512, 3, 66, 1000}};
  auto ref = Reference(prompts, kMax);
  KvPagesSampler decode_pages(c.decode_metrics_port);
  Req req;
  req.id = 700;
  req.prompt = prompts[0];
  req.max_tokens = kMax;
  c.router.Submit(&req);
  const bool ran = c.router.Run(300000);
  decode_pages.Stop();
  ASSERT_TRUE(ran) << c.Logs();
  EXPECT_TRUE(req.error.empty()) << req.error;
  EXPECT_EQ(req.out, ref[0]);
  // Sampled during the stream: the full layer held many blocks' pages at some point.
  EXPECT_GE(decode_pages.most_full, 20) << c.Logs();
  EXPECT_GE(decode_pages.most_sliding, 0);
  EXPECT_LE(decode_pages.most_sliding, 2 * (8 / 16 + 2));
  c.decode.Kill(SIGTERM);
  c.prefill.Kill(SIGTERM);
  EXPECT_EQ(c.decode.Wait(20000), 0) << c.Logs();
  EXPECT_EQ(c.prefill.Wait(20000), 0) << c.Logs();
}

// A 4096-token stream through real processes, of a synthetic gpt_oss whose context holds it
// (make_synthetic_moe's layout at test size, written here: layers sliding / full, window 128,
// 8192 positions; the HF fixture's is 2048): the decode worker's KV pages of its sliding layer
// stay within the window (at most 128 / 16 + 2 blocks) while its full layer's grow with the
// stream (past half its 257 blocks), and the prefill worker's metric shows the prompt's 3 blocks
// on both layers (it keeps every layer's pages until the transfer has read them, then the last
// prompt's for a while), each sampled while the request runs; the tokens are the in-process
// engine's.
TEST(Workers, SlidingWindowPagesStayBoundedInA4096TokenStream) {
  SyntheticMoeSpec spec;
  spec.type = ModelType::kGptOss;
  spec.layers = 2;
  spec.hidden = 64;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.experts = 4;
  spec.top_k = 2;
  spec.expert_ffn = 32;
  spec.vocab = 512;
  spec.max_positions = 8192;
  spec.seed = 4096;
  spec.init_std = 0.2f;  // logits far enough apart that greedy picks are no near-ties
  const std::string dir = std::string(PW_BINARY_DIR) + "/test-models/gpt_oss_8k_positions";
  ASSERT_TRUE(WriteSyntheticMoe(spec, dir).ok());
  UseModel model(dir);
  Cluster c;
  c.decode_metrics_port = FreePort();
  c.prefill_metrics_port = FreePort();
  ASSERT_TRUE(c.Start(/*decode_kv_blocks=*/320, /*use_broker=*/false)) << c.Logs();
  const int kMax = 4096;
  std::vector<std::vector<int32_t>> prompts = RandomPrompts(1, 4096, 40, 40);
  for (auto& id : prompts[0]) id = 3 + id % 500;
  auto ref = Reference(prompts, kMax);
  ASSERT_EQ(ref[0].size(), static_cast<size_t>(kMax));
  KvPagesSampler decode_pages(c.decode_metrics_port), prefill_pages(c.prefill_metrics_port);
  Req req;
  req.id = 4096;
  req.prompt = prompts[0];
  req.max_tokens = kMax;
  c.router.Submit(&req);
  const bool ran = c.router.Run(600000);
  decode_pages.Stop();
  prefill_pages.Stop();
  ASSERT_TRUE(ran) << c.Logs();
  EXPECT_TRUE(req.error.empty()) << req.error;
  EXPECT_EQ(req.out, ref[0]);
  EXPECT_GE(decode_pages.most_full, (40 + kMax) / 16 / 2) << c.Logs();
  EXPECT_GE(decode_pages.most_sliding, 0);
  EXPECT_LE(decode_pages.most_sliding, 128 / 16 + 2);
  EXPECT_EQ(prefill_pages.most_full, 3) << c.Logs();
  EXPECT_EQ(prefill_pages.most_sliding, 3) << c.Logs();
  c.decode.Kill(SIGTERM);
  c.prefill.Kill(SIGTERM);
  EXPECT_EQ(c.decode.Wait(20000), 0) << c.Logs();
  EXPECT_EQ(c.prefill.Wait(20000), 0) << c.Logs();
}

// A hybrid (`model`: linear-attention layers keeping a recurrent state in the KV pool) served by
// real processes: prompts past the delta rule's chunk of 64 tokens, their state computed by the
// prefill worker and written with the attention KV into the decode worker's blocks, then
// decoded from there: the in-process engine's tokens. `decode_args`: more pw-decode options.
void HybridGreedyTokensEqualInProcessEngine(const std::string& model, uint32_t seed,
                                            const std::vector<std::string>& decode_args) {
  UseModel use(model);
  Cluster c;
  c.decode_args = decode_args;
  ASSERT_TRUE(c.Start()) << c.Logs();
  ExpectServedTokensEqualTheEngine(c, 6, seed, 65, 150, 1000, 800, 24);  // vocabulary 1024
  ExpectCleanStop(c);
}

// qwen3_next with the decode worker's pages twice the prefill worker's (4096 bytes against one
// bf16 layer of a block, 2048): a state of 3200 bytes takes two pages there, one here, so the
// transfer splits it at both pools' page boundaries.
TEST(Workers, Qwen3NextGreedyTokensEqualInProcessEngine) {
  HybridGreedyTokensEqualInProcessEngine("qwen3_next", 6464, {"--page-bytes", "4096"});
}

// Qwen3.5-MoE's text model from its multimodal checkpoint, pages of the same size on both sides.
TEST(Workers, Qwen3_5MoeGreedyTokensEqualInProcessEngine) {
  HybridGreedyTokensEqualInProcessEngine("qwen3_5_moe", 6565, {});
}

// qwen3_next under a small decode pool: 4 prompts of 65..80 tokens take 20 of its 24 blocks;
// growing by 100 tokens each they need 40, so the decode worker preempts and recomputes (the
// state from zero, over prompt and streamed tokens): the in-process engine's tokens.
TEST(Workers, Qwen3NextPreemptionUnderSmallKvPoolLosesNothing) {
  UseModel model("qwen3_next");
  Cluster c;
  ASSERT_TRUE(c.Start(/*decode_kv_blocks=*/24, /*use_broker=*/false)) << c.Logs();
  ExpectPreemptedTokensEqualTheEngine(c, 4, 7070, 65, 80, 1000, 900, 100);
}

}  // namespace
}  // namespace pw
