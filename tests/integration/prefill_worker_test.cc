// A real pw-prefill process, driven by this test acting as the router (control protocol over
// ZeroMQ) and as the decode worker (a UCX-registered KV region the prefill worker puts into).
// Checks that prompts submitted together (batched into shared forward passes) give the same
// first tokens and KV as the in-process engine prefilling each alone, that a re-prefilled
// request's first token is the seeded draw number generatedSoFar, and that heartbeats keep
// flowing while one long forward pass runs. A decode worker killed while the prefill worker
// waits on a transfer to it neither hangs nor crashes the prefill worker: the router's cancel
// (or the put deadline) ends the wait and the worker goes on serving.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <tuple>

#include "common/formats/width_map.h"
#include "engine/engine.h"
#include "engine/experts/apw_expert_provider.h"
#include "services/transport/control.h"
#include "services/transport/ucx.h"
#include "services/transport/pipe_io.h"
#include "services/transport/zmq_transport.h"
#include "tests/common/run_command.h"
#include "tests/integration/paged_node.h"
#include "tests/support/batch_invariance.h"
#include "tests/support/process_util.h"

namespace pw {
namespace {

using transport::ReadAll;
using transport::ReadBlob;
using transport::WriteAll;
using transport::WriteBlob;

using transport::ControlServer;

std::string Bin(const std::string& name) { return std::string(PW_BINARY_DIR) + "/bin/" + name; }
std::string FixtureModel() {
  return std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/qwen2_moe";
}
std::string TinyModel() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }

struct Result1 {
  bool done = false;
  bool ok = false;
  std::string error;
  wire::ErrorKind error_kind = wire::ErrorKind::WORKER;
  std::string error_param;
  int32_t first_token = -1;
  uint32_t num_tokens = 0;
  // KvReady's log-probabilities: (token, logprob, number of alternatives).
  std::tuple<int32_t, float, size_t> first_logprob{-1, 0.f, 0};
  std::vector<std::tuple<int32_t, float, size_t>> prompt_logprobs;
};

// Router + decode side of one prefill worker.
class Harness {
 public:
  Harness(const std::string& model_dir, int dst_blocks, uint32_t server_heartbeat_ms = 100,
          uint32_t dead_after_beats = 3)
      : model_dir_(model_dir), dst_blocks_(dst_blocks) {
    auto t = transport::ZmqRouterTransport::Bind("tcp://127.0.0.1:0");
    EXPECT_TRUE(t.ok());
    endpoint_ = (*t)->endpoint();
    ControlServer::Options o;
    o.id = "router";
    o.heartbeat_ms = server_heartbeat_ms;
    o.dead_after_beats = dead_after_beats;
    server_ =
        std::make_unique<ControlServer>(std::move(t).value(), pw::SteadyClock::Get(), o);
    server_->on_peer_dead = [this](const std::string& peer, const transport::PeerInfo&) {
      dead_peers.push_back(peer);
    };
  }
  ~Harness() {
    prefill.Kill(SIGKILL);
    region_.reset();
    worker_.reset();
    ctx_.reset();
  }

  // Starts pw-prefill with `extra` flags and waits for its registration; then registers the
  // decode-side region, sized from the prefill's KV layout (same model, same layout).
  bool Start(const std::vector<std::string>& extra) {
    testing::UseBatchInvariantKernels();
    const std::string log_dir = std::string(PW_BINARY_DIR) + "/test-logs";
    mkdir(log_dir.c_str(), 0755);
    const std::string tag = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::vector<std::string> argv = {Bin("pw-prefill"), "--insecure", "--model", model_dir_,
                                     "--router", endpoint_, "--id", "prefill-0", "--kv-dtype",
                                     "fp32"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    if (!prefill.Start(argv, log_dir + "/PrefillWorker." + tag + ".prefill.log")) return false;
    bool up = false;
    for (int waited = 0; waited < 120000 && !up; waited += 20) {
      up = server_->FindPeer("prefill-0") != nullptr;
      server_->Poll(20, nullptr);
    }
    if (!up) return false;
    auto reg = server_->FindPeer("prefill-0")->registration->body().getRegister();
    auto kl = reg.getKvLayout();
    layout_hash_ = kl.getLayoutHash();
    block_tokens_ = kl.getBlockTokens();
    block_bytes_ = kl.getBlockBytes();
    layer_bytes_ = kl.getLayerBytes();
    num_layers_ = kl.getNumLayers();
    mem_.assign(static_cast<size_t>(dst_blocks_) * block_bytes_, 0);
    auto ctx = transport::ucx::Context::Create();
    if (!ctx.ok()) return false;
    ctx_ = std::move(*ctx);
    auto w = transport::ucx::Worker::Create(*ctx_);
    if (!w.ok()) return false;
    worker_ = std::move(*w);
    auto r = transport::ucx::MemoryRegion::Register(*ctx_, mem_.data(), mem_.size());
    if (!r.ok()) return false;
    region_ = std::move(*r);
    worker_->StartProgressThread();
    return true;
  }

  // A decode-side region somewhere else (another process).
  struct Remote {
    std::string decode_id, address, rkey;
    uint64_t base = 0, bytes = 0;
  };
  // Sends a PrefillRequest whose KV goes to `blocks` of the decode-side region (this
  // process's, or `remote`).
  void Submit(uint64_t id, const std::vector<int32_t>& tokens, const std::vector<uint32_t>& blocks,
              const engine::SamplingParams& sp, uint32_t generated_so_far = 0,
              const Remote* remote = nullptr, int32_t prompt_logprobs = -1) {
    results[id] = {};
    proto::OutMessage out;
    auto pr = out.body().initPrefillRequest();
    pr.setRequestId(id);
    auto toks = pr.initTokens(static_cast<unsigned>(tokens.size()));
    for (size_t i = 0; i < tokens.size(); ++i) toks.set(i, static_cast<uint32_t>(tokens[i]));
    auto s = pr.initSampling();
    s.setTemperature(sp.temperature);
    s.setTopP(sp.top_p);
    s.setTopK(static_cast<uint32_t>(sp.top_k));
    s.setSeed(sp.seed);
    s.setMaxTokens(static_cast<uint32_t>(sp.max_tokens));
    s.setIgnoreEos(sp.ignore_eos);
    s.setLogprobs(sp.logprobs);
    pr.setPromptLogprobs(prompt_logprobs);
    pr.setDecodeWorkerId(remote ? remote->decode_id : "decode-test");
    auto mem = pr.initDecodeMemory();
    mem.setWorkerAddress(proto::AsData(remote ? remote->address : worker_->Address()));
    mem.setRkey(proto::AsData(remote ? remote->rkey : region_->PackedRkey()));
    mem.setBaseAddr(remote ? remote->base : region_->base());
    mem.setBytes(remote ? remote->bytes : region_->size());
    auto dl = pr.initDecodeLayout();
    dl.setNumBlocks(static_cast<uint32_t>(dst_blocks_));
    dl.setBlockTokens(block_tokens_);
    dl.setBlockBytes(block_bytes_);
    dl.setLayoutHash(layout_hash_);
    // Pages as a decode pool would hand them out, here laid out block after block: page
    // b * L + l holds layer l of block b, so block(b) below reads a whole block.
    dl.setPageBytes(layer_bytes_);
    dl.setLayerBytes(layer_bytes_);
    dl.setNumLayers(num_layers_);
    auto bl = pr.initBlockIds(static_cast<unsigned>(blocks.size()));
    for (size_t i = 0; i < blocks.size(); ++i) bl.set(i, blocks[i]);
    auto pl = pr.initPageIds(static_cast<unsigned>(blocks.size() * num_layers_));
    for (size_t i = 0; i < blocks.size(); ++i) {
      for (uint32_t l = 0; l < num_layers_; ++l) pl.set(static_cast<unsigned>(i * num_layers_ + l), blocks[i] * num_layers_ + l);
    }
    pr.setLeaseId(id + 1000);
    pr.setGeneratedSoFar(generated_so_far);
    ASSERT_TRUE(server_->Send("prefill-0", out).ok());
  }

  void Cancel(uint64_t id) {
    proto::OutMessage out;
    auto c = out.body().initCancel();
    c.setRequestId(id);
    c.setLeaseId(id + 1000);
    ASSERT_TRUE(server_->Send("prefill-0", out).ok());
  }

  // Polls for `ms` (KvReady frames are recorded).
  void PollFor(int ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < deadline) WaitAll(10, /*any=*/true);
  }

  // Polls until every submitted request has its KvReady, or timeout.
  bool WaitAll(int timeout_ms, bool any = false) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      server_->Poll(10, [this](const std::string&, const proto::InMessage& m) {
        if (m.which() == proto::Body::KV_READY) {
          auto kr = m.body().getKvReady();
          auto& r = results[kr.getRequestId()];
          r.done = true;
          r.ok = kr.getOk();
          r.error = proto::ToString(kr.getError());
          r.error_kind = kr.getErrorKind();
          r.error_param = proto::ToString(kr.getErrorParam());
          r.first_token = static_cast<int32_t>(kr.getFirstToken());
          r.num_tokens = kr.getNumTokens();
          auto fl = kr.getFirstLogprob();
          r.first_logprob = {static_cast<int32_t>(fl.getToken()), fl.getLogprob(),
                             fl.getTopTokens().size()};
          r.prompt_logprobs.clear();
          for (auto lp : kr.getPromptLogprobs()) {
            r.prompt_logprobs.emplace_back(static_cast<int32_t>(lp.getToken()), lp.getLogprob(),
                                           lp.getTopTokens().size());
          }
        }
        return Status::Ok();
      });
      if (any) continue;
      bool all = true;
      for (auto& [id, r] : results) all = all && r.done;
      if (all) return true;
    }
    return false;
  }

  const uint8_t* block(uint32_t b) const {
    return mem_.data() + static_cast<size_t>(b) * block_bytes_;
  }
  uint64_t block_bytes() const { return block_bytes_; }
  uint32_t block_tokens() const { return block_tokens_; }
  ControlServer& server() { return *server_; }

  testing::ChildProcess prefill;
  std::map<uint64_t, Result1> results;
  std::vector<std::string> dead_peers;

 private:
  std::string model_dir_;
  int dst_blocks_;
  std::string endpoint_;
  std::unique_ptr<ControlServer> server_;
  uint64_t layout_hash_ = 0;
  uint32_t block_tokens_ = 0;
  uint64_t block_bytes_ = 0;
  uint64_t layer_bytes_ = 0;
  uint32_t num_layers_ = 0;
  std::vector<uint8_t> mem_;
  std::unique_ptr<transport::ucx::Context> ctx_;
  std::unique_ptr<transport::ucx::Worker> worker_;
  std::unique_ptr<transport::ucx::MemoryRegion> region_;
};

std::vector<std::vector<int32_t>> RandomPrompts(int n, uint32_t seed, int min_len, int max_len,
                                                int vocab) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n));
  for (auto& p : prompts) {
    int len = min_len + static_cast<int>(rng() % static_cast<uint32_t>(max_len - min_len + 1));
    for (int i = 0; i < len; ++i)
      p.push_back(1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab - 1)));
  }
  return prompts;
}

std::unique_ptr<engine::Engine> Reference(const std::string& model_dir, int block_size) {
  engine::EngineOptions eo;
  eo.num_kv_blocks = 512;
  eo.block_size = block_size;
  eo.max_batch_tokens = 256;
  auto e = engine::Engine::Create(model_dir, eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

// Blob transfer over a pipe, for the owner process below.

// Forks a stand-in for a decode worker that has stopped: it registers `bytes` of KV memory
// with UCX and publishes them, but never progresses its UCX worker, so a transfer into it
// cannot complete (UCX 1.13 emulates RMA on shared memory with active messages). Must run
// before this process creates any UCX state (UCX does not survive fork).
pid_t StartStuckDecode(size_t bytes, Harness::Remote* remote) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(fds[0]);
    static std::vector<uint8_t> mem;
    mem.assign(bytes, 0);
    auto ctx = transport::ucx::Context::Create();
    if (!ctx.ok()) _exit(1);
    auto worker = transport::ucx::Worker::Create(**ctx);
    if (!worker.ok()) _exit(2);
    auto region = transport::ucx::MemoryRegion::Register(**ctx, mem.data(), mem.size());
    if (!region.ok()) _exit(3);
    uint64_t base = (*region)->base(), n = (*region)->size();
    if (!WriteBlob(fds[1], (*worker)->Address()) || !WriteBlob(fds[1], (*region)->PackedRkey()) ||
        !WriteAll(fds[1], &base, 8) || !WriteAll(fds[1], &n, 8)) {
      _exit(4);
    }
    while (true) pause();  // until killed
  }
  close(fds[1]);
  constexpr uint64_t kMaxBlob = uint64_t{1} << 20;
  constexpr int kWaitMs = 60000;
  const bool ok = ReadBlob(fds[0], &remote->address, kMaxBlob, kWaitMs) &&
                  ReadBlob(fds[0], &remote->rkey, kMaxBlob, kWaitMs) &&
                  ReadAll(fds[0], &remote->base, 8, kWaitMs) && ReadAll(fds[0], &remote->bytes, 8, kWaitMs);
  close(fds[0]);
  if (!ok) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

// Largest batch the worker reports when it stops (its log's last line).
int LargestBatch(const std::string& log) {
  const std::string key = "largest batch ";
  size_t at = log.rfind(key);
  if (at == std::string::npos) return -1;
  return std::atoi(log.c_str() + at + key.size());
}

// Largest difference between the KV the worker put into the harness's blocks `dst` and the
// reference engine's blocks `own` (same layout, fp32), over the prompt's `tokens` positions.
double WorstKvDiff(const Harness& h, const std::vector<uint32_t>& dst, const engine::Engine& ref,
                   const std::vector<int32_t>& own, size_t tokens) {
  const auto& layout = ref.kv_pool().layout();
  double worst = 0;
  for (size_t b = 0; b < dst.size(); ++b) {
    const int valid = std::min<int>(layout.block_size, static_cast<int>(tokens - b * layout.block_size));
    for (int l = 0; l < layout.num_layers; ++l) {
      const float* got = reinterpret_cast<const float*>(h.block(dst[b]) + l * layout.bytes_per_layer());
      const float* want = reinterpret_cast<const float*>(ref.kv_pool().LayerPage(own[b], l));
      for (int slab = 0; slab < 2 * layout.num_kv_heads; ++slab) {
        const size_t base = static_cast<size_t>(slab) * layout.block_size * layout.head_dim;
        for (size_t e = 0; e < static_cast<size_t>(valid * layout.head_dim); ++e) {
          worst = std::max(worst, static_cast<double>(std::fabs(got[base + e] - want[base + e])));
        }
      }
    }
  }
  return worst;
}

TEST(PrefillWorker, PromptsSubmittedTogetherEqualEachAlone) {
  Harness h(FixtureModel(), 512);
  // 64-token passes: long prompts take several, short ones share them.
  ASSERT_TRUE(h.Start({"--max-batch-tokens", "64", "--heartbeat-ms", "100"})) << h.prefill.Log();
  auto ref = Reference(FixtureModel(), static_cast<int>(h.block_tokens()));
  ASSERT_TRUE(ref);
  auto prompts = RandomPrompts(12, 777, 1, 150, ref->vocab_size());
  std::vector<engine::SamplingParams> params(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    params[i].max_tokens = 16;
    if (i % 2 == 1) {  // half greedy, half seeded
      params[i].temperature = 0.8f;
      params[i].top_k = 50;
      params[i].seed = 100 + i;
    }
  }
  // Destination blocks: scattered, one gap between prompts, so some runs are contiguous and
  // some are not.
  std::vector<std::vector<uint32_t>> dst(prompts.size());
  uint32_t next = 3;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int nb = engine::BlocksForTokens(static_cast<int>(prompts[i].size()),
                                           static_cast<int>(h.block_tokens()));
    for (int b = 0; b < nb; ++b) dst[i].push_back(next++);
    if (nb > 2) std::swap(dst[i][0], dst[i][1]);
    next += 1;
  }
  ASSERT_LT(next, 512u);
  for (size_t i = 0; i < prompts.size(); ++i) h.Submit(i + 1, prompts[i], dst[i], params[i]);
  ASSERT_TRUE(h.WaitAll(120000)) << h.prefill.Log();

  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i) + " of " + std::to_string(prompts[i].size()) +
                 " tokens");
    const Result1& r = h.results[i + 1];
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.num_tokens, prompts[i].size());
    auto own = ref->LeaseKvBlocks(static_cast<int>(dst[i].size()));
    ASSERT_TRUE(own.ok());
    auto alone = ref->Prefill(prompts[i], *own, params[i]);
    ASSERT_TRUE(alone.ok()) << alone.status().ToString();
    EXPECT_EQ(r.first_token, alone->first_token);
    // KV of every prompt position, block by block, within 1e-5 of the engine alone.
    const double worst = WorstKvDiff(h, dst[i], *ref, *own, prompts[i].size());
    EXPECT_LE(worst, 1e-5);
    ASSERT_TRUE(ref->ReturnKvBlocks(*own).ok());
  }
  h.prefill.Kill(SIGTERM);
  EXPECT_EQ(h.prefill.Wait(30000), 0) << h.prefill.Log();
  // The worker did batch: some forward pass carried more than one prompt.
  EXPECT_GE(LargestBatch(h.prefill.Log()), 2) << h.prefill.Log();
}

// The prompt's log-probabilities (promptLogprobs) and the first token's (sampling.logprobs)
// come back in KvReady and equal the engine's teacher-forced log-softmax.
TEST(PrefillWorker, PromptAndFirstTokenLogprobsEqualTheEngine) {
  Harness h(FixtureModel(), 256);
  ASSERT_TRUE(h.Start({"--max-batch-tokens", "32", "--heartbeat-ms", "100"})) << h.prefill.Log();
  auto ref = Reference(FixtureModel(), static_cast<int>(h.block_tokens()));
  ASSERT_TRUE(ref);
  auto prompts = RandomPrompts(2, 4242, 70, 90, ref->vocab_size());  // several passes each
  engine::SamplingParams sp;
  sp.max_tokens = 4;
  sp.logprobs = 2;
  std::vector<uint32_t> dst0, dst1;
  const int nb0 = engine::BlocksForTokens(static_cast<int>(prompts[0].size()),
                                          static_cast<int>(h.block_tokens()));
  for (int b = 0; b < nb0; ++b) dst0.push_back(static_cast<uint32_t>(b));
  for (int b = 0; b < 40; ++b) dst1.push_back(static_cast<uint32_t>(100 + b));
  h.Submit(1, prompts[0], dst0, sp, 0, nullptr, /*prompt_logprobs=*/3);
  engine::SamplingParams plain = sp;
  plain.logprobs = -1;
  h.Submit(2, prompts[1], dst1, plain);  // shares the passes, asks for nothing
  ASSERT_TRUE(h.WaitAll(120000)) << h.prefill.Log();
  const Result1& r = h.results[1];
  ASSERT_TRUE(r.ok) << r.error;
  auto logits = ref->ForwardLogits(prompts[0]);
  ASSERT_TRUE(logits.ok());
  const int V = ref->vocab_size();
  ASSERT_EQ(r.prompt_logprobs.size(), prompts[0].size() - 1);
  for (size_t p = 0; p + 1 < prompts[0].size(); ++p) {
    auto want = engine::ComputeLogprobs(logits->data() + p * V, V, prompts[0][p + 1], 3);
    EXPECT_EQ(std::get<0>(r.prompt_logprobs[p]), prompts[0][p + 1]);
    EXPECT_NEAR(std::get<1>(r.prompt_logprobs[p]), want.logprob, 1e-4) << "position " << p + 1;
    EXPECT_EQ(std::get<2>(r.prompt_logprobs[p]), 3u);
  }
  auto last = engine::ComputeLogprobs(logits->data() + (prompts[0].size() - 1) * V, V,
                                      r.first_token, 2);
  EXPECT_EQ(std::get<0>(r.first_logprob), r.first_token);
  EXPECT_NEAR(std::get<1>(r.first_logprob), last.logprob, 1e-4);
  EXPECT_EQ(std::get<2>(r.first_logprob), 2u);
  ASSERT_TRUE(h.results[2].ok);
  EXPECT_TRUE(h.results[2].prompt_logprobs.empty());
  EXPECT_EQ(std::get<2>(h.results[2].first_logprob), 0u);
}

// Requests with the same prompt (the candidates of an `n` request) share one prefill: each
// gets the KV in its own blocks and its own first token (its own seed), and the worker counts
// the ones it served from another's forward passes.
TEST(PrefillWorker, EqualPromptsShareOnePrefill) {
  Harness h(FixtureModel(), 512);
  ASSERT_TRUE(h.Start({"--max-batch-tokens", "32", "--heartbeat-ms", "100"})) << h.prefill.Log();
  auto ref = Reference(FixtureModel(), static_cast<int>(h.block_tokens()));
  ASSERT_TRUE(ref);
  auto prompt = RandomPrompts(1, 99, 100, 100, ref->vocab_size())[0];
  const int nb =
      engine::BlocksForTokens(static_cast<int>(prompt.size()), static_cast<int>(h.block_tokens()));
  std::vector<engine::SamplingParams> params(4);
  std::vector<std::vector<uint32_t>> dst(4);
  for (size_t i = 0; i < 4; ++i) {
    params[i].max_tokens = 8;
    params[i].temperature = 1.0f;
    params[i].seed = 500 + i;
    for (int b = 0; b < nb; ++b) dst[i].push_back(static_cast<uint32_t>(i * 64 + b));
  }
  for (size_t i = 0; i < 3; ++i) h.Submit(i + 1, prompt, dst[i], params[i]);
  ASSERT_TRUE(h.WaitAll(120000)) << h.prefill.Log();
  // One more, right after: served from the prompt just prefilled.
  h.Submit(4, prompt, dst[3], params[3]);
  ASSERT_TRUE(h.WaitAll(120000)) << h.prefill.Log();
  auto own = ref->LeaseKvBlocks(nb);
  ASSERT_TRUE(own.ok());
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE("request " + std::to_string(i + 1));
    const Result1& r = h.results[i + 1];
    ASSERT_TRUE(r.ok) << r.error;
    auto alone = ref->Prefill(prompt, *own, params[i]);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(r.first_token, alone->first_token);
    const double worst = WorstKvDiff(h, dst[i], *ref, *own, prompt.size());
    EXPECT_LE(worst, 1e-5);
  }
  ASSERT_TRUE(ref->ReturnKvBlocks(*own).ok());
  h.prefill.Kill(SIGTERM);
  EXPECT_EQ(h.prefill.Wait(30000), 0) << h.prefill.Log();
  EXPECT_NE(h.prefill.Log().find(": stopped; 3 prompts served from another's prefill"),
            std::string::npos)
      << h.prefill.Log();
}

// Failover re-prefill with seeded sampling: tokens = prompt + the k tokens already sent and
// generatedSoFar = k; the sampled token must be the in-process engine's token number k.
TEST(PrefillWorker, SeededFirstTokenAfterFailoverIsDrawNumberGeneratedSoFar) {
  Harness h(FixtureModel(), 256);
  ASSERT_TRUE(h.Start({"--heartbeat-ms", "100"})) << h.prefill.Log();
  auto ref = Reference(FixtureModel(), static_cast<int>(h.block_tokens()));
  ASSERT_TRUE(ref);
  auto prompts = RandomPrompts(3, 99, 5, 40, ref->vocab_size());
  constexpr int kMax = 8;
  std::vector<engine::SamplingParams> params(prompts.size());
  std::vector<std::vector<int32_t>> gen(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    params[i].temperature = 1.0f;  // flat enough that draws at different indices differ
    params[i].seed = 4242 + i;
    params[i].max_tokens = kMax;
    params[i].ignore_eos = true;
    ASSERT_TRUE(ref->AddSequence(i, prompts[i], params[i]).ok());
  }
  while (ref->HasWork()) {
    auto step = ref->Step();
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    for (auto& u : step->updates)
      gen[u.id].insert(gen[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
  }
  uint64_t id = 1;
  std::map<uint64_t, std::pair<size_t, int>> what;
  uint32_t next_block = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(gen[i].size(), static_cast<size_t>(kMax));
    for (int k = 0; k < kMax; ++k) {
      std::vector<int32_t> tokens = prompts[i];
      tokens.insert(tokens.end(), gen[i].begin(), gen[i].begin() + k);
      std::vector<uint32_t> blocks;
      const int nb = engine::BlocksForTokens(static_cast<int>(tokens.size()),
                                             static_cast<int>(h.block_tokens()));
      for (int b = 0; b < nb; ++b) blocks.push_back(next_block++);
      ASSERT_LT(next_block, 256u);
      what[id] = {i, k};
      h.Submit(id++, tokens, blocks, params[i], static_cast<uint32_t>(k));
    }
  }
  ASSERT_TRUE(h.WaitAll(120000)) << h.prefill.Log();
  int differs_from_draw0 = 0;
  for (auto& [rid, ik] : what) {
    const auto [i, k] = ik;
    const Result1& r = h.results[rid];
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.first_token, gen[i][static_cast<size_t>(k)])
        << "prompt " << i << ", generatedSoFar " << k;
    // What the token would be if drawn as index 0 from the same logits.
    std::vector<int32_t> tokens = prompts[i];
    tokens.insert(tokens.end(), gen[i].begin(), gen[i].begin() + k);
    auto own = ref->LeaseKvBlocks(engine::BlocksForTokens(static_cast<int>(tokens.size()),
                                                               static_cast<int>(h.block_tokens())));
    ASSERT_TRUE(own.ok());
    auto as0 = ref->Prefill(tokens, *own, params[i], 0);
    ASSERT_TRUE(as0.ok());
    ASSERT_TRUE(ref->ReturnKvBlocks(*own).ok());
    if (as0->first_token != r.first_token) ++differs_from_draw0;
  }
  // The draw index matters for these requests (so the check above can tell the two apart).
  EXPECT_GT(differs_from_draw0, 0);
}

// Long forward passes (four 2000-token prompts of the embedded model, passes of up to 8192
// tokens, each well over the heartbeat interval) must not stop heartbeats: the control thread
// keeps sending them while the compute thread runs, so the router-side server hears many
// during the passes and never declares the worker dead.
TEST(PrefillWorker, LongForwardPassDoesNotStopHeartbeats) {
  constexpr uint32_t kBeatMs = 20;
  // Dead after 25 silent beats (500 ms): generous for a loaded machine, far below the pass.
  Harness h(TinyModel(), 1024, kBeatMs, 25);
  ASSERT_TRUE(h.Start({"--max-batch-tokens", "8192", "--heartbeat-ms", std::to_string(kBeatMs),
                       "--threads", "1", "--kv-blocks", "1024"}))
      << h.prefill.Log();
  const int vocab = 4096;
  auto prompts = RandomPrompts(4, 5, 2000, 2000, vocab);
  std::vector<std::vector<uint32_t>> dst(prompts.size());
  uint32_t next = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int nb = engine::BlocksForTokens(2000, static_cast<int>(h.block_tokens()));
    for (int b = 0; b < nb; ++b) dst[i].push_back(next++);
  }
  // Let registration settle, then count frames (heartbeats) that arrive during the pass.
  for (int i = 0; i < 10; ++i) h.server().Poll(kBeatMs, nullptr);
  engine::SamplingParams sp;
  sp.max_tokens = 4;
  const uint64_t frames_before = h.server().counters().received;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) h.Submit(i + 1, prompts[i], dst[i], sp);
  // WaitAll's handler sees the KvReady frames; everything else received is a heartbeat.
  ASSERT_TRUE(h.WaitAll(300000)) << h.prefill.Log();
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t frames = h.server().counters().received - frames_before;
  const uint64_t heartbeats = frames - prompts.size();
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_TRUE(h.results[i + 1].ok) << h.results[i + 1].error;
  std::printf("pass of %.0f ms, %llu heartbeats heard meanwhile\n", elapsed_ms,
              static_cast<unsigned long long>(heartbeats));
  if (elapsed_ms < 10 * kBeatMs) {
    GTEST_SKIP() << "the pass took " << elapsed_ms << " ms, too short to tell";
  }
  // At least one per 10 intervals on average (a worker computing on its control thread sends
  // one per pass, here one per ~0.5-1 s).
  EXPECT_GE(static_cast<double>(heartbeats), elapsed_ms / (10.0 * kBeatMs))
      << "during passes of " << elapsed_ms << " ms";
  EXPECT_TRUE(h.dead_peers.empty()) << "declared dead during a pass of " << elapsed_ms << " ms";
  h.prefill.Kill(SIGTERM);
  EXPECT_EQ(h.prefill.Wait(30000), 0) << h.prefill.Log();
  // At least the prompts that arrived while the first ran shared a pass.
  EXPECT_GE(LargestBatch(h.prefill.Log()), 2) << h.prefill.Log();
}

// The decode worker dies while the prefill worker waits on a transfer to it. With a put deadline
// far beyond the test, only the router's cancel (what the router sends when its heartbeats
// declare a decode worker dead) can end the wait: the cancelled request gets no KvReady, and
// the next request, to a live decode region, is served.
TEST(PrefillWorker, DecodeKilledMidTransferIsCancelledAndServingGoesOn) {
  Harness::Remote dead;
  dead.decode_id = "decode-dead";
  pid_t owner = StartStuckDecode(4u << 20, &dead);
  ASSERT_GT(owner, 0);
  Harness h(FixtureModel(), 256);
  ASSERT_TRUE(h.Start({"--heartbeat-ms", "100", "--put-timeout-ms", "3600000"})) << h.prefill.Log();
  engine::SamplingParams sp;
  sp.max_tokens = 4;
  auto prompts = RandomPrompts(2, 8, 40, 60, 4096 / 2);
  const int nb = engine::BlocksForTokens(60, static_cast<int>(h.block_tokens()));
  std::vector<uint32_t> blocks;
  for (int b = 0; b < nb; ++b) blocks.push_back(static_cast<uint32_t>(b));
  h.Submit(1, prompts[0], blocks, sp, 0, &dead);
  h.PollFor(1000);
  ASSERT_FALSE(h.results[1].done)
      << "the transfer into a decode worker that never progresses completed: "
      << h.results[1].error;
  kill(owner, SIGKILL);
  // Reap it while the stand-in router keeps serving heartbeats: on a loaded machine the exit
  // of a process with registered UCX memory can outlast three heartbeats of the worker.
  pid_t reaped = 0;
  while ((reaped = waitpid(owner, nullptr, WNOHANG)) == 0) h.PollFor(10);
  ASSERT_EQ(reaped, owner);
  h.Cancel(1);
  h.Submit(2, prompts[1], blocks, sp);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!h.results[2].done && std::chrono::steady_clock::now() < deadline) h.PollFor(50);
  ASSERT_TRUE(h.results[2].done) << "the worker did not serve after the cancel\n"
                                 << h.prefill.Log();
  EXPECT_TRUE(h.results[2].ok) << h.results[2].error;
  EXPECT_FALSE(h.results[1].done) << "a cancelled request got a KvReady";
  EXPECT_TRUE(h.prefill.running()) << h.prefill.Log();
  EXPECT_TRUE(h.dead_peers.empty());
  h.prefill.Kill(SIGTERM);
  EXPECT_EQ(h.prefill.Wait(30000), 0) << h.prefill.Log();
}

// A request's own sampling values the worker cannot compute with (top_p 0: what 1e-320 is as a
// float) are refused as an invalid request naming the field; a bad reservation is the
// worker's kind of failure; either way the worker goes on serving.
TEST(PrefillWorker, RequestsOwnSamplingValuesAreRefusedAsAnInvalidRequest) {
  Harness h(FixtureModel(), 64);
  ASSERT_TRUE(h.Start({})) << h.prefill.Log();
  const std::vector<int32_t> prompt = {3, 5, 7, 11};
  engine::SamplingParams bad;
  bad.temperature = 1.f;
  bad.top_p = static_cast<float>(1e-320);
  bad.max_tokens = 4;
  h.Submit(1, prompt, {0}, bad);
  engine::SamplingParams cold;
  cold.temperature = 1e-40f;  // subnormal: 1 / temperature overflows
  cold.max_tokens = 4;
  h.Submit(2, prompt, {1}, cold);
  engine::SamplingParams ok;
  ok.max_tokens = 4;
  h.Submit(3, prompt, {1000}, ok);  // a block outside the decode pool
  h.Submit(4, prompt, {2}, ok);
  ASSERT_TRUE(h.WaitAll(120000)) << h.prefill.Log();
  EXPECT_FALSE(h.results[1].ok);
  EXPECT_EQ(h.results[1].error_kind, wire::ErrorKind::INVALID_REQUEST) << h.results[1].error;
  EXPECT_EQ(h.results[1].error_param, "top_p");
  EXPECT_FALSE(h.results[2].ok);
  EXPECT_EQ(h.results[2].error_kind, wire::ErrorKind::INVALID_REQUEST) << h.results[2].error;
  EXPECT_EQ(h.results[2].error_param, "temperature");
  EXPECT_FALSE(h.results[3].ok);
  EXPECT_EQ(h.results[3].error_kind, wire::ErrorKind::WORKER) << h.results[3].error;
  EXPECT_EQ(h.results[3].error_param, "");
  EXPECT_TRUE(h.results[4].ok) << h.results[4].error;
  h.prefill.Kill(SIGTERM);
  EXPECT_EQ(h.prefill.Wait(30000), 0) << h.prefill.Log();
}

// Same, with no cancel: the put deadline ends the wait, the request gets KvReady{ok = false},
// and the next request is served.
TEST(PrefillWorker, DecodeKilledMidTransferHitsThePutDeadline) {
  Harness::Remote dead;
  dead.decode_id = "decode-dead";
  pid_t owner = StartStuckDecode(4u << 20, &dead);
  ASSERT_GT(owner, 0);
  Harness h(FixtureModel(), 256);
  ASSERT_TRUE(h.Start({"--heartbeat-ms", "100", "--put-timeout-ms", "1500"})) << h.prefill.Log();
  engine::SamplingParams sp;
  sp.max_tokens = 4;
  auto prompts = RandomPrompts(2, 9, 40, 60, 4096 / 2);
  const int nb = engine::BlocksForTokens(60, static_cast<int>(h.block_tokens()));
  std::vector<uint32_t> blocks;
  for (int b = 0; b < nb; ++b) blocks.push_back(static_cast<uint32_t>(b));
  h.Submit(1, prompts[0], blocks, sp, 0, &dead);
  h.PollFor(200);
  kill(owner, SIGKILL);
  // Reap it while the stand-in router keeps serving heartbeats: on a loaded machine the exit
  // of a process with registered UCX memory can outlast three heartbeats of the worker.
  pid_t reaped = 0;
  while ((reaped = waitpid(owner, nullptr, WNOHANG)) == 0) h.PollFor(10);
  ASSERT_EQ(reaped, owner);
  h.Submit(2, prompts[1], blocks, sp);
  ASSERT_TRUE(h.WaitAll(120000)) << h.prefill.Log();
  EXPECT_FALSE(h.results[1].ok);
  EXPECT_NE(h.results[1].error.find("decode-dead"), std::string::npos) << h.results[1].error;
  EXPECT_TRUE(h.results[2].ok) << h.results[2].error;
  EXPECT_TRUE(h.prefill.running()) << h.prefill.Log();
  h.prefill.Kill(SIGTERM);
  EXPECT_EQ(h.prefill.Wait(30000), 0) << h.prefill.Log();
}

// --store/--expert-bits: the prompts run every expert block from the node's store at that
// width (as the decode worker at the same uniform width), so the KV and the first token equal
// the in-process engine with the store's provider at that width, and differ from the
// checkpoint's bf16 experts. A width without a store, a store without a width and a store made
// for another checkpoint are refused at start, naming the option or the file.
TEST(PrefillWorker, ExpertsFromTheStoreAtOneWidthEqualTheEngineAtThatWidth) {
  if (const std::string why = testing::PagedNodeMissing(); !why.empty()) GTEST_SKIP() << why;
  Harness h(TinyModel(), 256);
  ASSERT_TRUE(h.Start({"--store", testing::TinyStorePath(), "--expert-bits", "4", "--heartbeat-ms", "100"}))
      << h.prefill.Log();
  EXPECT_NE(h.prefill.Log().find("experts 4-bit from " + testing::TinyStorePath()), std::string::npos)
      << h.prefill.Log();
  auto ref = Reference(TinyModel(), static_cast<int>(h.block_tokens()));
  auto bf16 = Reference(TinyModel(), static_cast<int>(h.block_tokens()));
  ASSERT_TRUE(ref && bf16);
  std::shared_ptr<const apw::ApwStore> store(apw::ApwStore::Open(testing::TinyStorePath()).value().release());
  const int layers = static_cast<int>(store->info().num_layers), experts = static_cast<int>(store->info().num_experts);
  auto provider = anyprec::ApwExpertProvider::Create(store, ref->model(),
                                                     anyprec::WidthMap::Uniform(4, layers, experts).value());
  ASSERT_TRUE(provider.ok()) << provider.status().ToString();
  engine::MoeHooks hooks;
  hooks.provider = provider->get();
  ref->SetMoeHooks(hooks);

  auto prompts = RandomPrompts(6, 31, 20, 120, ref->vocab_size());
  engine::SamplingParams sp;
  sp.max_tokens = 4;
  std::vector<std::vector<uint32_t>> dst(prompts.size());
  uint32_t next = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int nb = engine::BlocksForTokens(static_cast<int>(prompts[i].size()), static_cast<int>(h.block_tokens()));
    for (int b = 0; b < nb; ++b) dst[i].push_back(next++);
  }
  ASSERT_LT(next, 256u);
  for (size_t i = 0; i < prompts.size(); ++i) h.Submit(i + 1, prompts[i], dst[i], sp);
  ASSERT_TRUE(h.WaitAll(120000)) << h.prefill.Log();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    const Result1& r = h.results[i + 1];
    ASSERT_TRUE(r.ok) << r.error;
    for (engine::Engine* e : {ref.get(), bf16.get()}) {
      auto own = e->LeaseKvBlocks(static_cast<int>(dst[i].size()));
      ASSERT_TRUE(own.ok());
      auto alone = e->Prefill(prompts[i], *own, sp);
      ASSERT_TRUE(alone.ok()) << alone.status().ToString();
      const double worst = WorstKvDiff(h, dst[i], *e, *own, prompts[i].size());
      if (e == ref.get()) {
        EXPECT_EQ(r.first_token, alone->first_token);
        EXPECT_LE(worst, 1e-5);
      } else {
        EXPECT_GT(worst, 1e-3);  // the 4-bit experts are not the checkpoint's
      }
      ASSERT_TRUE(e->ReturnKvBlocks(*own).ok());
    }
  }
  h.prefill.Kill(SIGTERM);
  EXPECT_EQ(h.prefill.Wait(30000), 0) << h.prefill.Log();

  const std::string base = Bin("pw-prefill") + " --insecure --router tcp://127.0.0.1:1 --id prefill-x ";
  struct Bad {
    std::string args, says;
  };
  for (const Bad& b : {Bad{"--model " + TinyModel() + " --expert-bits 4", "expert_bits 4 needs a store"},
                       Bad{"--model " + TinyModel() + " --store " + testing::TinyStorePath(), "with store"},
                       Bad{"--model " + TinyModel() + " --store /nonexistent.apw --expert-bits 4", "/nonexistent.apw"},
                       Bad{"--model " + FixtureModel() + " --store " + testing::TinyStorePath() + " --expert-bits 4",
                           "store was made for another model"}}) {
    const testing::CommandResult r = testing::RunCommand(base + b.args + " 2>&1");
    EXPECT_NE(r.status, 0) << b.args;
    EXPECT_NE(r.output.find(b.says), std::string::npos) << b.args << ": " << r.output;
  }
}

}  // namespace
}  // namespace pw
