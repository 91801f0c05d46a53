// The whole node through pw-cluster: pw-broker, pw-router, pw-prefill, pw-decode as real
// processes on loopback, the OpenAI API over HTTP. Checks that greedy completions of 64
// prompts equal the in-process engine's tokens, that serving survives a SIGKILLed broker (and
// the restarted broker rebuilds its registry from the workers), that a decode worker killed
// mid-request is replaced without changing the output, that SIGTERM drains and exits, that
// `pw-cluster status` finds every process, that a forged registration is refused, and that a
// bad model directory stops pw-cluster within seconds naming the file and the problem.
// Skips when the embedded model's weights are absent.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <mutex>
#include <map>
#include <set>
#include <random>
#include <sstream>
#include <thread>

#include "common/formats/model_config.h"
#include "common/text/tokenizer.h"
#include "engine/engine.h"
#include "services/common/kv_layout_hash.h"
#include "services/proto/codec.h"
#include "services/transport/control_auth.h"
#include "services/transport/curve_keys.h"
#include "services/transport/zmq_transport.h"
#include "tests/support/batch_invariance.h"
#include "tests/support/http_util.h"
#include "tests/support/process_util.h"

namespace pw {
namespace {

using testing::FreePort;
using testing::Http;
using testing::PidsWithCmdline;
using testing::ReadFile;

using nlohmann::json;

std::string ModelDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }

class ClusterE2E : public ::testing::Test {
 protected:
  // The model served, its name, and the directory of its tokenizer: the embedded model here.
  virtual std::string model_dir() const { return ModelDir(); }
  virtual std::string model_name() const { return "tiny-moe"; }
  virtual std::string tokenizer_dir() const { return ModelDir(); }

  void SetUp() override {
    if (!std::filesystem::exists(model_dir() + "/model.safetensors")) {
      GTEST_SKIP() << "no weights in " << model_dir();
    }
    testing::UseBatchInvariantKernels();
    // A port picked free can be taken by another test's process before the node binds it
    // (ctest -j): a node that stops at start on "Address already in use" is started again on
    // new ports, at most three times.
    for (int attempt = 1;; ++attempt) {
      ASSERT_NO_FATAL_FAILURE(StartNode());
      const auto start = testing::WaitNodeStart(cluster_, http_port_, 120, model_name(), [&] { return Logs(); });
      if (start == testing::NodeStart::kServing) return;
      ASSERT_TRUE(start == testing::NodeStart::kPortTaken && attempt < 3) << Logs();
      KillStragglers();
    }
  }
  // Picks the ports, writes the node file and starts pw-cluster on it.
  void StartNode() {
    http_port_ = FreePort();
    ctl_port_ = FreePort();
    broker_port_ = FreePort();
    while (broker_port_ == ctl_port_ || broker_port_ == http_port_) broker_port_ = FreePort();
    std::set<int> used = {http_port_, ctl_port_, broker_port_};
    for (int* m : {&broker_metrics_port_, &prefill_metrics_port_, &decode_metrics_port_}) {
      do *m = FreePort(); while (!used.insert(*m).second);
    }
    run_dir_ = std::string(PW_BINARY_DIR) + "/test-tmp/e2e-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() + "-" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(run_dir_);
    std::filesystem::create_directories(run_dir_);
    const std::string yaml = run_dir_ + "/cluster.yaml";
    std::ofstream(yaml) << "model_dir: " << model_dir() << "\n"
                        << "model_name: " << model_name() << "\nrun_dir: " << run_dir_ << "\n"
                        << "bin_dir: " << PW_BINARY_DIR << "/bin\n"
                        << "heartbeat_ms: 300\ndrain_timeout_ms: 20000\n"
                        << "router: {port: " << http_port_ << ", control_port: " << ctl_port_
                        << ", lease_ms: 20000, tokenizer: " << tokenizer_dir() << "}\n"
                        << "broker: {control_port: " << broker_port_
                        << ", metrics_port: " << broker_metrics_port_ << "}\n"
                        << "prefill: [{id: prefill-0, kv_blocks: 256, metrics_port: "
                        << prefill_metrics_port_ << "}]\n"
                        << "decode: [{id: decode-0, kv_blocks: 1024, metrics_port: "
                        << decode_metrics_port_ << "}]\n"
                        << "restart: {initial_backoff_ms: 200, max_backoff_ms: 2000}\n";
    ASSERT_TRUE(cluster_.Start({std::string(PW_BINARY_DIR) + "/bin/pw-cluster", "up", "--config", yaml},
                               run_dir_ + "/pw-cluster.out"));
  }
  void TearDown() override { cluster_.Kill(SIGKILL); KillStragglers(); }

  // The cluster has serving capacity once a completion succeeds.
  bool WaitServing(int timeout_s) { return testing::WaitServing(http_port_, timeout_s, model_name()); }
  void KillStragglers() {
    testing::KillNodeProcesses({ctl_port_, broker_port_});
    testing::KillConfigProcesses(Yaml());
  }
  // The node file; pw-cluster starts each process with `--config <it> --section <name>`.
  std::string Yaml() const { return run_dir_ + "/cluster.yaml"; }
  std::string Logs() { return testing::RunLogs(run_dir_); }
  // Greedy completion of token-id prompt; returns the text (or "HTTP <status>: body").
  std::string Complete(const std::vector<int32_t>& prompt, int max_tokens) {
    json req = {{"model", model_name()}, {"prompt", prompt}, {"max_tokens", max_tokens},
                {"temperature", 0}};
    auto [status, body] = Http(http_port_, "POST", "/v1/completions", req.dump());
    if (status != 200) return "HTTP " + std::to_string(status) + ": " + body;
    auto j = json::parse(body, nullptr, false);
    if (j.is_discarded()) return "bad JSON: " + body;
    return j["choices"][0]["text"].get<std::string>();
  }
  // The in-process engine's greedy text for each prompt, stopping where the router's
  // completions stop: the model's eos ids and the tokenizer's (a fixture served with the
  // embedded model's tokenizer has another).
  std::vector<std::string> Reference(const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
    auto tok = Tokenizer::FromModelDir(tokenizer_dir());
    EXPECT_TRUE(tok.ok());
    engine::EngineOptions eo;
    eo.kv_dtype = engine::KvDtype::kBf16;  // the workers' default
    auto e = engine::Engine::Create(model_dir(), eo);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    engine::SamplingParams p;
    p.max_tokens = max_tokens;
    if (auto eos = (*tok)->eos_token_id()) p.stop_token_ids.push_back(*eos);
    std::vector<std::vector<int32_t>> toks(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_TRUE((*e)->AddSequence(i, prompts[i], p).ok());
    while ((*e)->HasWork()) {
      auto step = (*e)->Step();
      if (!step.ok()) { ADD_FAILURE() << step.status().ToString(); break; }
      for (auto& u : step->updates) for (int32_t t : u.new_tokens) toks[u.id].push_back(t);
    }
    std::vector<std::string> out;
    for (auto& t : toks) out.push_back((*tok)->Decode(t, /*skip_special_tokens=*/true).value());
    return out;
  }
  virtual std::vector<std::vector<int32_t>> Prompts(int n, uint32_t seed) {
    // Real text prompts of different lengths, tokenized as the router would.
    const char* texts[] = {"The sea", "Once upon a time there was", "int main(int argc, char** argv) {",
                           "Q: What is a fortune?\nA:", "In the beginning", "def parse(self, text):",
                           "#include <stdio.h>\n", "The manual page says"};
    auto tok = Tokenizer::FromModelDir(ModelDir());
    std::mt19937 rng(seed);
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < n; ++i) {
      std::string text = texts[i % 8];
      for (int r = static_cast<int>(rng() % 6); r > 0; --r) text += std::string(" ") + texts[rng() % 8];
      out.push_back((*tok)->Encode(text).value());
    }
    return out;
  }

  void KillUnderLoadLosesNoRequest(const std::string& binary, const std::string& name);
  // 8 requests of max_tokens each; decode-0 SIGKILLed while they run: each finishes with the
  // engine's text, and pw-cluster restarts decode-0.
  void DecodeKilledMidRequestIsReplacedWithIdenticalOutput(int max_tokens);

  testing::ChildProcess cluster_;
  int http_port_ = 0, ctl_port_ = 0, broker_port_ = 0;
  int broker_metrics_port_ = 0, prefill_metrics_port_ = 0, decode_metrics_port_ = 0;
  std::string run_dir_;
};

TEST_F(ClusterE2E, SixtyFourGreedyPromptsMatchTheEngineThenSigtermDrains) {
  const int kMax = 24;
  auto prompts = Prompts(64, 2026);
  auto ref = Reference(prompts, kMax);
  std::vector<std::future<std::string>> got;
  for (size_t i = 0; i < prompts.size(); ++i) {
    got.push_back(std::async(std::launch::async, [&, i] { return Complete(prompts[i], kMax); }));
    if (i % 8 == 7) for (size_t j = i - 7; j <= i; ++j) got[j].wait();  // 8 in flight
  }
  int mismatches = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::string text = got[i].get();
    if (text != ref[i]) ++mismatches;
    EXPECT_EQ(text, ref[i]) << "prompt " << i;
  }
  ASSERT_EQ(mismatches, 0) << Logs();
  cluster_.Kill(SIGTERM);
  EXPECT_EQ(cluster_.Wait(60000), 0) << Logs();
  EXPECT_TRUE(PidsWithCmdline("--config " + Yaml() + " ").empty());
}

TEST_F(ClusterE2E, DeadBrokerServingContinuesAndRestartedBrokerRebuilds) {
  auto prompts = Prompts(4, 7);
  auto ref = Reference(prompts, 16);
  auto brokers = PidsWithCmdline("pw-broker --config " + Yaml() + " ");
  ASSERT_EQ(brokers.size(), 1u) << Logs();
  kill(brokers[0], SIGKILL);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(Complete(prompts[i], 16), ref[i]) << Logs();
  // pw-cluster restarts the broker; both workers register with it again (3 silent beats, then
  // re-registration), which rebuilds its registry.
  bool rebuilt = false;
  for (int i = 0; i < 150 && !rebuilt; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::string log = ReadFile(run_dir_ + "/broker.log");
    size_t restart = log.rfind("expert blocks,");  // the restarted broker's first line
    rebuilt = restart != std::string::npos && log.find("worker 'decode-0' registered", restart) != std::string::npos &&
              log.find("worker 'prefill-0' registered", restart) != std::string::npos &&
              log.find("expert blocks,") < restart;
  }
  EXPECT_TRUE(rebuilt) << Logs();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(Complete(prompts[i], 16), ref[i]);
}

void ClusterE2E::DecodeKilledMidRequestIsReplacedWithIdenticalOutput(int max_tokens) {
  auto prompts = Prompts(8, 99);
  const int kMax = max_tokens;
  auto ref = Reference(prompts, kMax);
  std::vector<std::future<std::string>> got;
  for (auto& p : prompts) got.push_back(std::async(std::launch::async, [&, p] { return Complete(p, kMax); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  auto decodes = PidsWithCmdline("pw-decode --config " + Yaml() + " ");
  ASSERT_EQ(decodes.size(), 1u);
  kill(decodes[0], SIGKILL);
  int pending = 0;
  for (auto& f : got) pending += f.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  EXPECT_GT(pending, 0) << "every request finished before the kill; the test proves nothing";
  // pw-cluster restarts decode-0; the router places the requests on it again (the prompt's KV
  // from the prefill worker, the streamed tokens' KV computed by decode-0 itself).
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i].get(), ref[i]) << "prompt " << i << "\n" << Logs();
  bool restarted = false;
  for (int i = 0; i < 50 && !restarted; ++i) {
    restarted = ReadFile(run_dir_ + "/pw-cluster.out").find("decode-0 exited") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(restarted) << Logs();
}

TEST_F(ClusterE2E, DecodeWorkerKilledMidRequestIsReplacedWithIdenticalOutput) {
  DecodeKilledMidRequestIsReplacedWithIdenticalOutput(600);
}

// An HF-parity fixture (tests/fixtures/models/<fixture()>) through pw-cluster, with the embedded
// model's tokenizer: its first 1024 ids cover the fixtures' vocabularies of 1024, so the prompts'
// ids are folded into [3, 1003).
class FixtureClusterE2E : public ClusterE2E {
 protected:
  virtual const char* fixture() const = 0;
  std::string model_dir() const override {
    return std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/" + fixture();
  }
  std::string model_name() const override { return std::string(fixture()) + "-fixture"; }
  std::vector<std::vector<int32_t>> Prompts(int n, uint32_t seed) override {
    auto prompts = ClusterE2E::Prompts(n, seed);
    for (auto& p : prompts) {
      for (auto& id : p) id = 3 + id % 1000;
    }
    return prompts;
  }
};

// gpt_oss: sliding-window layers of window 8 whose pages the decode worker gives back behind
// each sequence, sinks, expert biases. The requests a killed decode worker held are placed
// again and recomputed past many windows with the engine's text.
class GptOssClusterE2E : public FixtureClusterE2E {
 protected:
  const char* fixture() const override { return "gpt_oss"; }
};

// gemma4: sliding (window 8) and full layers with their own RoPE, a dense MLP beside the
// experts, the router on its own normed input (context 512, so shorter streams).
class Gemma4ClusterE2E : public FixtureClusterE2E {
 protected:
  const char* fixture() const override { return "gemma4"; }
};

TEST_F(Gemma4ClusterE2E, DecodeWorkerKilledMidRequestIsReplacedWithIdenticalOutput) {
  DecodeKilledMidRequestIsReplacedWithIdenticalOutput(400);
}

// gemma4_global: full layers of their own KV shape (1 kv head x 32 beside 4 x 16, as
// Gemma-4-26B-A4B's 2 x 512 beside 8 x 256): the router checks the workers' layout of layers of
// their own width (control protocol 1.5) and the KV moves layer by layer at its own size.
class Gemma4GlobalClusterE2E : public FixtureClusterE2E {
 protected:
  const char* fixture() const override { return "gemma4_global"; }
};

TEST_F(Gemma4GlobalClusterE2E, DecodeWorkerKilledMidRequestIsReplacedWithIdenticalOutput) {
  DecodeKilledMidRequestIsReplacedWithIdenticalOutput(400);
}

TEST_F(GptOssClusterE2E, DecodeWorkerKilledMidRequestIsReplacedWithIdenticalOutput) {
  DecodeKilledMidRequestIsReplacedWithIdenticalOutput(1500);
}

// Steady load of 8 clients while a worker (`binary`, named `name` by pw-cluster) is SIGKILLed,
// and a burst of 8 more right after: the requests it held, and those placed on it before the
// router notices its death (their messages cannot be sent), wait for the restarted worker (or
// are placed again with prompt + streamed tokens); every request completes with the
// undisturbed greedy text.
void ClusterE2E::KillUnderLoadLosesNoRequest(const std::string& binary, const std::string& name) {
  const int kMax = 8;
  auto prompts = Prompts(16, 31);
  auto ref = Reference(prompts, kMax);
  std::atomic<bool> stop{false};
  std::atomic<int> served{0}, wrong{0};
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      for (size_t k = c; !stop.load(); k += 8) {
        const size_t i = k % prompts.size();
        std::string text = Complete(prompts[i], kMax);
        ++served;
        if (text != ref[i]) {
          ++wrong;
          std::lock_guard<std::mutex> lock(mu);
          if (failures.size() < 5) failures.push_back("prompt " + std::to_string(i) + ": " + text);
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto victims = PidsWithCmdline(binary + " --config " + Yaml() + " ");
  ASSERT_EQ(victims.size(), 1u) << Logs();
  const int before_kill = served.load();
  kill(victims[0], SIGKILL);
  // A burst that arrives while the worker is down (the steady clients may all be waiting on
  // requests it held): the router still lists it until it is declared dead or restarted.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<std::future<std::string>> burst;
  for (size_t i = 0; i < 8; ++i) {
    burst.push_back(std::async(std::launch::async, [&, i] { return Complete(prompts[i], kMax); }));
  }
  // Until the restarted worker registered, then a while of normal serving.
  bool back = false;
  for (int i = 0; i < 300 && !back; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::string log = ReadFile(run_dir_ + "/pw-cluster.out");
    back = log.find(name + " exited") != std::string::npos &&
           PidsWithCmdline(binary + " --config " + Yaml() + " ").size() == 1;
  }
  EXPECT_TRUE(back) << Logs();
  ASSERT_TRUE(WaitServing(60)) << Logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  stop = true;
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < burst.size(); ++i) EXPECT_EQ(burst[i].get(), ref[i]) << "burst " << i;
  EXPECT_GT(before_kill, 0);
  EXPECT_GT(served.load(), before_kill + 8) << "no request was served across the restart";
  EXPECT_EQ(wrong.load(), 0) << (failures.empty() ? "" : failures[0]) << "\n" << Logs();
}

TEST_F(ClusterE2E, PrefillWorkerKilledUnderLoadLosesNoRequest) {
  KillUnderLoadLosesNoRequest("pw-prefill", "prefill-0");
}

TEST_F(ClusterE2E, DecodeWorkerKilledUnderLoadLosesNoRequest) {
  KillUnderLoadLosesNoRequest("pw-decode", "decode-0");
}

// A process on the host opens a DEALER to the router's control port with routing id decode-0,
// holds it 0.8 s and closes it, sending nothing (`spoof_keys` null: plaintext, as any local
// process can; otherwise with the given CURVE keys).
void Spoof(int port, const transport::CurveKeys* spoof_keys) {
  zmq::socket_t spoof(transport::ZmqContext(), zmq::socket_type::dealer);
  spoof.set(zmq::sockopt::routing_id, "decode-0");
  spoof.set(zmq::sockopt::linger, 0);
  if (spoof_keys != nullptr) {
    spoof.set(zmq::sockopt::curve_serverkey, spoof_keys->server.public_z85);
    spoof.set(zmq::sockopt::curve_publickey, spoof_keys->client.public_z85);
    spoof.set(zmq::sockopt::curve_secretkey, spoof_keys->client.secret_z85);
  }
  spoof.connect("tcp://127.0.0.1:" + std::to_string(port));
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
}

// Without the cluster's credentials (plaintext, or CURVE with a key pair of its own) the
// impostor never completes a handshake: the live pw-decode is not disturbed at all (it never
// has to register again) and completions are served throughout.
TEST_F(ClusterE2E, SpoofedRoutingIdWithoutCredentialsLeavesTheDecodeWorkerAlone) {
  auto prompts = Prompts(2, 3);
  auto ref = Reference(prompts, 8);
  ASSERT_EQ(Complete(prompts[0], 8), ref[0]);
  auto real = transport::ReadCurveKeys(run_dir_ + "/control.keys");
  ASSERT_TRUE(real.ok()) << real.status().ToString();
  transport::CurveKeys forged = *real;
  forged.client = transport::GenerateCurveKeys()->client;
  for (const transport::CurveKeys* keys : {static_cast<const transport::CurveKeys*>(nullptr),
                                           static_cast<const transport::CurveKeys*>(&forged)}) {
    SCOPED_TRACE(keys ? "CURVE with another client key" : "plaintext");
    std::thread spoof([&] { Spoof(ctl_port_, keys); });
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(Complete(prompts[1], 8), ref[1]) << Logs();
    spoof.join();
    // Three heartbeats (300 ms each) after the impostor left, and more.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    EXPECT_EQ(Complete(prompts[0], 8), ref[0]) << Logs();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
    auto [status, body] = Http(http_port_, "GET", "/health");
    EXPECT_EQ(status, 200) << body;
  }
  const std::string decode_log = ReadFile(run_dir_ + "/decode-0.log");
  EXPECT_EQ(decode_log.find("registering again"), std::string::npos) << decode_log;
  EXPECT_NE(ReadFile(run_dir_ + "/router.log").find("refused a control-plane connection"),
            std::string::npos)
      << "the router's ZAP handler did not see the forged key";
}

// With the cluster's credentials (a process that can read the run directory is a member of
// the cluster) the impostor takes the routing id over; the real pw-decode, silenced, reconnects
// after 3 heartbeats and registers again: completions are served again within seconds.
TEST_F(ClusterE2E, SpoofedRoutingIdWithCredentialsDoesNotTakeTheDecodeWorkerOutForGood) {
  auto prompts = Prompts(2, 3);
  auto ref = Reference(prompts, 8);
  ASSERT_EQ(Complete(prompts[0], 8), ref[0]);
  auto keys = transport::ReadCurveKeys(run_dir_ + "/control.keys");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  Spoof(ctl_port_, &*keys);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Complete(prompts[1], 8), ref[1]) << Logs();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  ASSERT_TRUE(WaitServing(20)) << Logs();
  auto [status, body] = Http(http_port_, "GET", "/health");
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(Complete(prompts[0], 8), ref[0]);
}

// A member of the node (a process that can read the run directory) registers a decode worker
// of its own at `port` with the fields `forge` sets, over a DEALER with the node's client keys,
// as pw-decode would. The DEALER stays open, to see what the server sends it afterwards.
struct ForgedPeer {
  std::unique_ptr<transport::ZmqDealerTransport> dealer;
  bool acked = false;     // a RegisterAck came
  bool accepted = false;  // its accepted
  std::string reason;     // its reason
};
ForgedPeer RegisterForged(int port, const std::string& id, const transport::CurveKeys& keys,
                          const std::function<void(wire::Register::Builder)>& forge) {
  ForgedPeer p;
  transport::ControlAuth auth;
  auth.curve = keys;
  auto d = transport::ZmqDealerTransport::Connect("tcp://127.0.0.1:" + std::to_string(port), id, auth);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return p;
  p.dealer = std::move(*d);
  proto::OutMessage m;
  auto r = m.body().initRegister();
  r.setRole(wire::Role::DECODE);
  r.setWorkerId(id);
  r.setPid(static_cast<uint32_t>(getpid()));
  r.setModelName("tiny-moe");
  r.setHeartbeatIntervalMs(300);
  auto km = r.initKvMemory();
  km.setWorkerAddress(proto::AsData("not-a-ucx-address"));
  km.setRkey(proto::AsData("not-an-rkey"));
  km.setBaseAddr(0x7f0000000000);
  forge(r);
  EXPECT_TRUE(p.dealer->Send("", proto::Encode(m, 1, id, 0)).ok());
  for (int i = 0; i < 300 && !p.acked; ++i) {  // up to 30 s
    auto f = p.dealer->Recv(100);
    if (!f.ok() || !f->has_value()) continue;
    auto in = proto::InMessage::Parse((*f)->bytes);
    if (!in.ok() || (*in)->which() != proto::Body::REGISTER_ACK) continue;
    auto ack = (*in)->body().getRegisterAck();
    p.acked = true;
    p.accepted = ack.getAccepted();
    p.reason = proto::ToString(ack.getReason());
  }
  return p;
}

// A Register with the node's keys but forged fields is refused by the router and by the broker,
// with the reason in the RegisterAck and in their logs; the refused peer is sent nothing else
// (no work, no plan, not even a heartbeat), the real workers are not disturbed and serve
// throughout. Two forgeries: the decode worker of the field report (layout hash 0, 2^32-1 KV
// blocks of 2^60 bytes, maxBatch 2^32-1), and pw-decode's own layout with maxBatch 2^32-1.
TEST_F(ClusterE2E, ForgedRegisterIsRefusedByTheRouterAndTheBroker) {
  auto prompts = Prompts(3, 11);
  auto ref = Reference(prompts, 8);
  ASSERT_EQ(Complete(prompts[0], 8), ref[0]) << Logs();
  auto keys = transport::ReadCurveKeys(run_dir_ + "/control.keys");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  auto cfg = LoadModelConfig(ModelDir() + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  engine::KvLayout honest;  // pw-decode's: --block-size 16, --kv-dtype bf16 (the defaults)
  honest.num_layers = static_cast<int>(cfg->num_layers);
  honest.num_kv_heads = static_cast<int>(cfg->num_kv_heads);
  honest.head_dim = static_cast<int>(cfg->head_dim);
  honest.block_size = 16;
  honest.dtype = engine::KvDtype::kBf16;
  struct Forgery {
    const char* id;
    std::vector<std::string> named;  // fields the refusal must name
    std::function<void(wire::Register::Builder)> forge;
  };
  const Forgery forgeries[] = {
      {"decode-forged", {"layoutHash", "numBlocks", "blockBytes", "maxBatch"},
       [](wire::Register::Builder r) {
         auto kl = r.initKvLayout();
         kl.setLayoutHash(0);
         kl.setNumBlocks(0xffffffffu);
         kl.setBlockTokens(16);
         kl.setBlockBytes(uint64_t{1} << 60);
         r.getKvMemory().setBytes(uint64_t{1} << 62);
         r.setMaxBatch(0xffffffffu);
       }},
      {"decode-batch", {"maxBatch"},
       [&](wire::Register::Builder r) {
         auto kl = r.initKvLayout();
         kl.setLayoutHash(service::KvLayoutHash(honest, memory::ModelKvSpecs(*cfg), cfg->hidden_size, cfg->vocab_size, cfg->model_type));
         kl.setNumBlocks(1024);
         kl.setBlockTokens(16);
         kl.setBlockBytes(honest.bytes_per_block());
         kl.setLayerBytes(honest.bytes_per_layer());
         kl.setPageBytes(honest.min_page_bytes());
         kl.setNumLayers(static_cast<uint32_t>(honest.num_layers));
         r.getKvMemory().setBytes(uint64_t{1024} * honest.num_layers * honest.min_page_bytes());
         r.setMaxBatch(0xffffffffu);
       }},
  };
  std::vector<ForgedPeer> peers;
  for (const Forgery& f : forgeries) {
    for (auto [port, server] : {std::pair{ctl_port_, "router"}, std::pair{broker_port_, "broker"}}) {
      SCOPED_TRACE(std::string(f.id) + " at the " + server);
      ForgedPeer p = RegisterForged(port, f.id, *keys, f.forge);
      ASSERT_TRUE(p.acked) << "no RegisterAck\n" << Logs();
      EXPECT_FALSE(p.accepted) << "a forged registration was accepted";
      for (const std::string& field : f.named) {
        EXPECT_NE(p.reason.find(field), std::string::npos) << field << " not named: " << p.reason;
      }
      // The server says why in its log.
      const std::string log = run_dir_ + "/" + server + ".log";
      const std::string line = std::string("refused registration of '") + f.id + "': ";
      bool logged = false;
      for (int i = 0; i < 200 && !logged; ++i) {  // up to 20 s
        const std::string text = ReadFile(log);
        const size_t at = text.find(line);
        logged = at != std::string::npos && text.find(f.named[0], at) != std::string::npos;
        if (!logged) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      EXPECT_TRUE(logged) << line << "... not in " << log << "\n" << ReadFile(log);
      peers.push_back(std::move(p));
    }
  }
  // The real workers serve on, undisturbed; the router counts them only.
  EXPECT_EQ(Complete(prompts[1], 8), ref[1]) << Logs();
  EXPECT_EQ(Complete(prompts[2], 8), ref[2]) << Logs();
  auto [status, body] = Http(http_port_, "GET", "/health");
  EXPECT_EQ(status, 200) << body;
  auto health = json::parse(body, nullptr, false);
  ASSERT_FALSE(health.is_discarded()) << body;
  EXPECT_EQ(health["decode_workers"], 1) << body;
  EXPECT_EQ(ReadFile(run_dir_ + "/decode-0.log").find("registering again"), std::string::npos);
  // Nothing came to the refused peers after their RegisterAck: no KvReserve, no Plan, no
  // Heartbeat (a server beats to registered peers only).
  for (ForgedPeer& p : peers) {
    for (;;) {
      auto f = p.dealer->Recv(200);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      if (!f->has_value()) break;
      auto in = proto::InMessage::Parse((*f)->bytes);
      ASSERT_TRUE(in.ok()) << in.status().ToString();
      ADD_FAILURE() << "a refused peer got " << proto::BodyName((*in)->which());
    }
  }
}

// Every TCP listener of every process of the node (router HTTP and control, broker control and
// metrics, workers' metrics, UCX listeners) is on the configured host, 127.0.0.1, and nothing
// else: `ss -ltnp` over the node's processes.
TEST_F(ClusterE2E, EveryListenerBindsTheConfiguredHostOnly) {
  if (system("ss -V > /dev/null 2>&1") != 0) GTEST_SKIP() << "ss (iproute2) is not installed";
  // Every child of pw-cluster has the run's key file on its command line.
  auto pids = PidsWithCmdline("--control-keys " + run_dir_ + "/control.keys");
  ASSERT_GE(pids.size(), 4u) << Logs();  // broker, router, prefill-0, decode-0
  const std::string out_path = run_dir_ + "/ss.txt";
  ASSERT_EQ(system(("ss -H -ltnp > " + out_path + " 2>&1").c_str()), 0);
  const std::string ss = ReadFile(out_path);
  std::map<pid_t, int> listeners;
  std::istringstream in(ss);
  std::string line;
  while (std::getline(in, line)) {
    // State Recv-Q Send-Q Local:Port Peer:Port users:(("name",pid=N,fd=M),...)
    std::istringstream f(line);
    std::string state, rq, sq, local, peer;
    f >> state >> rq >> sq >> local >> peer;
    for (pid_t p : pids) {
      if (line.find("pid=" + std::to_string(p) + ",") == std::string::npos) continue;
      ++listeners[p];
      EXPECT_EQ(local.rfind("127.0.0.1:", 0), 0u) << "pid " << p << " listens on " << local
                                                   << "\n" << line;
    }
  }
  // The router (HTTP + control), the broker (control + metrics) and each worker (metrics +
  // UCX) listen: a process with no listener means the check did not see it.
  for (pid_t p : pids) EXPECT_GE(listeners[p], 1) << "pid " << p << "\n" << ss;
  int total = 0;
  for (auto& [p, n] : listeners) total += n;
  EXPECT_GE(total, 8) << ss;
}

// `pw-cluster status` on the node `pw-cluster up` runs: exit 0, every process up with the pid
// of the very child pw-cluster started (its parent is pw-cluster, its binary the expected one),
// and --prometheus-targets lists the four endpoints, each answering /metrics.
TEST_F(ClusterE2E, StatusReportsEveryProcessUpWithItsPid) {
  const std::string targets = run_dir_ + "/targets.json";
  const std::string cmd = std::string(PW_BINARY_DIR) + "/bin/pw-cluster status --config " +
                          run_dir_ + "/cluster.yaml --prometheus-targets " + targets + " 2>&1";
  std::string out;
  int code = -1;
  for (int i = 0; i < 300 && code != 0; ++i) {  // /metrics of every process: 30 s at most
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    FILE* f = popen(cmd.c_str(), "r");
    ASSERT_NE(f, nullptr);
    out.clear();
    char buf[512];
    while (fgets(buf, sizeof(buf), f)) out += buf;
    const int rc = pclose(f);
    code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }
  ASSERT_EQ(code, 0) << out << Logs();
  const std::map<std::string, std::string> binaries = {
      {"broker", "pw-broker"}, {"router", "pw-router"}, {"prefill-0", "pw-prefill"},
      {"decode-0", "pw-decode"}};
  std::istringstream table(out);
  std::string line;
  std::getline(table, line);  // the header
  std::set<std::string> seen;
  while (std::getline(table, line)) {
    std::istringstream f(line);
    std::string name, pid, state, metrics;
    ASSERT_TRUE(static_cast<bool>(f >> name >> pid >> state >> metrics)) << out;
    SCOPED_TRACE(line);
    ASSERT_TRUE(binaries.count(name)) << out;
    seen.insert(name);
    EXPECT_EQ(state, "up");
    const std::string stat = ReadFile("/proc/" + pid + "/stat");
    std::istringstream fields(stat.substr(stat.rfind(')') + 1));
    std::string proc_state, ppid;
    fields >> proc_state >> ppid;
    EXPECT_EQ(ppid, std::to_string(cluster_.pid())) << stat;
    const std::string argv = ReadFile("/proc/" + pid + "/cmdline");
    const std::string argv0 = argv.substr(0, argv.find('\0'));
    EXPECT_EQ(argv0, std::string(PW_BINARY_DIR) + "/bin/" + binaries.at(name));
  }
  EXPECT_EQ(seen.size(), 4u) << out;
  const auto j = json::parse(ReadFile(targets), nullptr, false);
  ASSERT_TRUE(j.is_array()) << ReadFile(targets);
  std::set<std::string> processes;
  for (const auto& t : j) {
    processes.insert(t["labels"]["pw_process"].get<std::string>());
    const std::string host_port = t["targets"][0].get<std::string>();
    ASSERT_EQ(host_port.rfind("127.0.0.1:", 0), 0u) << host_port;
    EXPECT_EQ(Http(std::stoi(host_port.substr(10)), "GET", "/metrics").first, 200) << host_port;
  }
  EXPECT_EQ(processes, (std::set<std::string>{"broker", "router", "prefill-0", "decode-0"}));
}

// A broken model directory: every process that reads it exits at start, so pw-cluster stops
// the node after 3 quick exits of one of them (backoff 200, 400 ms) with a non-zero code and
// that child's last log lines, which name the file and the problem; no process is left.
TEST(ClusterBadModel, LauncherExitsNamingTheFileAndTheProblem) {
  if (!std::filesystem::exists(ModelDir() + "/model.safetensors")) {
    GTEST_SKIP() << "no weights in " << ModelDir();
  }
  struct Case {
    const char* name;      // names the directory: must not contain `problem`
    const char* file;      // the file that is broken
    std::string content;   // its new content ("" = the real file, truncated)
    const char* problem;   // what the output must say besides the file's name
  } cases[] = {
      {"0", "model.safetensors", "", "exceed the data section"},
      {"1", "config.json", "{\"hidden_size\": 64, \"num_hidden_layers\": [", "not valid JSON"},
      {"2", "tokenizer.json", "\x89PNG\r\n\x1a\n not a tokenizer", "not valid JSON"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = std::string(PW_BINARY_DIR) + "/test-tmp/bad-model-" + c.name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir + "/model");
    for (const auto& e : std::filesystem::directory_iterator(ModelDir())) {
      const std::string base = e.path().filename().string();
      if (base == c.file) continue;
      std::filesystem::create_symlink(e.path(), dir + "/model/" + base);
    }
    std::ofstream out(dir + "/model/" + c.file, std::ios::binary);
    if (c.content.empty()) {
      const std::string full = ReadFile(ModelDir() + "/" + c.file);
      out << full.substr(0, full.size() / 3);
    } else {
      out << c.content;
    }
    out.close();
    const int http = FreePort(), ctl = FreePort(), broker = FreePort();
    std::ofstream(dir + "/cluster.yaml")
        << "model_dir: " << dir << "/model\nrun_dir: " << dir << "/run\n"
        << "bin_dir: " << PW_BINARY_DIR << "/bin\nheartbeat_ms: 200\ndrain_timeout_ms: 3000\n"
        << "router: {port: " << http << ", control_port: " << ctl << "}\n"
        << "broker: {control_port: " << broker << "}\n"
        << "prefill: [{id: prefill-0, kv_blocks: 64}]\ndecode: [{id: decode-0, kv_blocks: 64}]\n"
        << "restart: {initial_backoff_ms: 200, max_backoff_ms: 2000}\n";
    testing::ChildProcess cluster;
    ASSERT_TRUE(cluster.Start({std::string(PW_BINARY_DIR) + "/bin/pw-cluster", "up", "--config",
                               dir + "/cluster.yaml"},
                              dir + "/pw-cluster.out"));
    const auto t0 = std::chrono::steady_clock::now();
    const int code = cluster.Wait(10000);
    const auto took = std::chrono::steady_clock::now() - t0;
    const std::string out_text = cluster.Log();
    EXPECT_EQ(code, 3) << out_text;
    EXPECT_LT(took, std::chrono::seconds(10)) << out_text;
    EXPECT_NE(out_text.find("times within 5000 ms of starting"), std::string::npos) << out_text;
    EXPECT_NE(out_text.find("command: "), std::string::npos) << out_text;
    EXPECT_NE(out_text.find(std::string("  | ")), std::string::npos) << out_text;
    // The child's message, as printed by pw-cluster (its log lines are indented by "  | ").
    const size_t tail = out_text.find("last lines of ");
    ASSERT_NE(tail, std::string::npos) << out_text;
    EXPECT_NE(out_text.find(c.file, tail), std::string::npos) << out_text;
    EXPECT_NE(out_text.find(c.problem, tail), std::string::npos) << out_text;
    cluster.Kill(SIGKILL);
    EXPECT_TRUE(PidsWithCmdline("--config " + dir + "/cluster.yaml ").empty());
    testing::KillNodeProcesses({ctl, broker});
    testing::KillConfigProcesses(dir + "/cluster.yaml");
  }
}

}  // namespace
}  // namespace pw
