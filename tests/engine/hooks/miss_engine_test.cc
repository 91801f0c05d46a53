// The miss policy in the engine on the tiny model (models/tiny-moe: 4 MoE layers, N = 32,
// k = 4): fetch-every-miss under a budget is bit-identical to every expert resident (bf16
// fetches are exact); a substituting policy computes only resident experts and changes the
// outputs; the fetcher seam sees every fetch, admission and eviction, and a failed fetch fails
// the step; LYNX then the miss policy run as one chain; the trace recorder writes what the
// router chose, and a replay of the trace of an emulated run reproduces its counts. With a
// sigmoid gate the policy substitutes by the biased selection scores.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#include "common/dtype.h"
#include "policies/lynx/lynx_remap.h"
#include "policies/misses/miss_policy.h"
#include "policies/misses/router_trace.h"
#include "policies/misses/trace_replay.h"
#include "engine/engine.h"
#include "engine/hooks/lynx_routing_hook.h"
#include "engine/hooks/miss_routing_hook.h"
#include "engine/models/model.h"
#include "engine/layers/moe_layer.h"
#include "engine/eval/perplexity.h"
#include "engine/hooks/routing_hook_chain.h"
#include "engine/hooks/trace_recorder.h"
#include "tests/engine/miss_policy_check.h"
#include "tools/lockstep_perplexity.h"
#include "engine/experts/bf16_expert_provider.h"

namespace pw::engine {
namespace {

std::string TinyDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }

#define SKIP_WITHOUT_TINY_MODEL()                                   \
  if (!std::filesystem::exists(TinyDir() + "/model.safetensors")) { \
    GTEST_SKIP() << TinyDir() << "/model.safetensors is absent";    \
  }

constexpr int kLayers = 4, kExperts = 32, kTopK = 4;

std::unique_ptr<Engine> Make(bool logits = false) {
  EngineOptions o;
  o.return_logits = logits;
  o.num_kv_blocks = 64;
  auto e = Engine::Create(TinyDir(), o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

std::vector<int32_t> Ids(size_t n, uint32_t seed) {
  // A repetitive random text: routing recurs, as in real text.
  std::mt19937 rng(seed);
  std::vector<int32_t> vocab(40);
  for (auto& v : vocab) v = static_cast<int32_t>(rng() % 4096);
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = vocab[rng() % vocab.size()];
  return ids;
}

std::unique_ptr<misses::MissPolicy> Policy(const std::string& preset, int capacity,
                                           misses::Eviction ev = misses::Eviction::kLfu) {
  auto c = misses::ParseMissPreset(preset);
  EXPECT_TRUE(c.ok());
  c->eviction = ev;
  auto p = misses::MissPolicy::Create(*c, kLayers, kExperts, kTopK, capacity);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

// A sigmoid gate (glm4_moe): a substitute is the resident expert of best selection score
// (score + e_score_correction_bias), not of best unbiased score. Layer 0 of 6 experts, top-2,
// first-choice rule: token 0 selects {0, 1} (both fetched: nothing to substitute), token 1
// selects {2, 3}: 2 is fetched, 3 is substituted by 0 or 1; unbiased 0 (.9) beats 1 (.5),
// biased 1 (.5 + .6) beats 0 (.9 - .3).
TEST(MissEngine, SigmoidGateSubstitutesByTheBiasedSelection) {
  auto c = misses::ParseMissPreset("first-choice");
  ASSERT_TRUE(c.ok());
  auto policy = misses::MissPolicy::Create(*c, 1, 6, 2, 4);
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  MissRoutingHook hook(policy->get());
  const std::vector<float> probs = {0.9f, 0.5f, 0.2f, 0.2f, 0.1f, 0.1f,   // token 0
                                    0.9f, 0.5f, 0.8f, 0.7f, 0.1f, 0.1f};  // token 1
  const std::vector<float> bias = {-0.3f, 0.6f, 0.f, 0.f, 0.f, 0.f};
  std::vector<float> selection(probs.size());
  for (size_t i = 0; i < probs.size(); ++i) selection[i] = probs[i] + bias[i % 6];
  RoutingContext ctx;
  ctx.layer = 0;
  ctx.num_tokens = 2;
  ctx.num_experts = 6;
  ctx.top_k = 2;
  ctx.router_probs = probs.data();
  ctx.selection_scores = selection.data();
  ctx.selection_bias = bias.data();
  ctx.gate = GateKind::kSigmoidGroupedTopK;
  std::vector<ExpertAssignment> a = {{0, 1, 0.55f, 0}, {0, 0, 0.45f, 1},
                                     {1, 2, 0.6f, 0},  {1, 3, 0.4f, 1}};
  ASSERT_TRUE(hook.Rewrite(ctx, &a).ok());
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a[2].expert, 2);
  EXPECT_EQ(a[3].expert, 1) << "the substitute must be ranked by the biased selection";
  EXPECT_EQ(a[3].weight, 0.4f);  // a substitute keeps the missed expert's weight
  EXPECT_EQ(hook.stats().substitutions, 1);
}

TEST(MissEngine, FetchEveryMissIsBitIdenticalToAllResident) {
  SKIP_WITHOUT_TINY_MODEL();
  auto e = Make();
  const std::vector<int32_t> ids = Ids(300, 1);
  auto ref = Perplexity(*e, ids, 64);
  ASSERT_TRUE(ref.ok());
  auto policy = Policy("fetch-every-miss", 8);
  MissRoutingHook hook(policy.get());
  MoeHooks h;
  h.routing_hook = &hook;
  h.residency = &hook;
  e->SetMoeHooks(h);
  auto got = Perplexity(*e, ids, 64);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->nll_sum, ref->nll_sum);
  const misses::MissStats& s = hook.stats();
  EXPECT_EQ(s.token_layers, 300 * kLayers);  // every forwarded token, every MoE layer
  EXPECT_EQ(s.slots, s.token_layers * kTopK);
  EXPECT_GT(s.fetches, 0);
  EXPECT_EQ(s.substitutions, 0);
  EXPECT_EQ(s.hits + s.fetches, s.slots);
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ(policy->cache().ResidentCount(l), 8);
  e->SetMoeHooks({});
}

// Fails the layer's call when it names an expert that is not resident.
class ResidentOnlyProvider final : public ExpertWeightProvider {
 public:
  ResidentOnlyProvider(const Model& m, const ExpertResidency* r) : inner_(m), residency_(r) {}
  Status RunExperts(const ExpertLayerCall& call) override {
    for (const ExpertGroup& g : call.groups) {
      ++calls_;  // experts computed
      if (!residency_->IsResident(call.layer, g.expert)) {
        return Internal("expert " + std::to_string(g.expert) + " of layer " +
                        std::to_string(call.layer) + " computed while not resident");
      }
    }
    return inner_.RunExperts(call);
  }
  int Bits(int, int, ExpertProj) const override { return 16; }
  int64_t calls_ = 0;

 private:
  Bf16ExpertProvider inner_;
  const ExpertResidency* residency_;
};

// The miss policy's hook as routing hook and residency, experts computed by `provider`.
MoeHooks ResidentOnlyHooks(MissRoutingHook* hook, ResidentOnlyProvider* provider) {
  MoeHooks h;
  h.routing_hook = hook;
  h.residency = hook;
  h.provider = provider;
  return h;
}

std::vector<float> Generate(Engine& e, int steps) {
  SamplingParams sp;
  sp.max_tokens = steps;
  sp.ignore_eos = true;
  // A one-token prompt: every forward pass holds one token, so what a layer computes is
  // exactly what the policy left resident.
  EXPECT_TRUE(e.AddSequence(1, std::vector<int32_t>{17}, sp).ok());
  std::vector<float> all;
  while (e.HasWork()) {
    auto step = e.Step();
    EXPECT_TRUE(step.ok()) << step.status().ToString();
    if (!step.ok()) break;
    for (const auto& u : step->updates) all.insert(all.end(), u.logits.begin(), u.logits.end());
  }
  return all;
}

TEST(MissEngine, SubstitutingPolicyComputesOnlyResidentExperts) {
  SKIP_WITHOUT_TINY_MODEL();
  auto base = Make(true);
  const std::vector<float> ref = Generate(*base, 40);
  for (auto ev : {misses::Eviction::kLfu, misses::Eviction::kLru, misses::Eviction::kScoreEma}) {
    auto e = Make(true);
    auto policy = Policy("first-choice", 8, ev);
    MissRoutingHook hook(policy.get());
    ResidentOnlyProvider provider(e->model(), &hook);
    e->SetMoeHooks(ResidentOnlyHooks(&hook, &provider));
    const std::vector<float> got = Generate(*e, 40);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_GT(provider.calls_, 0);
    EXPECT_GT(hook.stats().substitutions, 0);
    EXPECT_NE(got, ref);  // substitutes really ran
    for (float v : got) ASSERT_TRUE(std::isfinite(v));
    // The first choice is never substituted under the first-choice rule.
    EXPECT_EQ(hook.stats().first_choice_substitutions, 0);
    ASSERT_EQ(hook.last_masses().size(), 1u);
  }
}

// deepseek_v3 (tests/fixtures/models/deepseek_v3: a dense first layer, then MoE layers of 16
// experts top-4 in 4 groups, a shared expert, the selection bias): a substituting policy at
// half residency computes only resident routed experts (the shared expert is dense, never
// asked of the provider), every substitute is resident, and the dense layer never reaches the
// policy.
TEST(MissEngine, DeepseekV3SubstitutesOnlyResidentRoutedExperts) {
  EngineOptions o;
  o.return_logits = true;
  o.num_kv_blocks = 64;
  auto make = [&] {
    auto e = Engine::Create(std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/deepseek_v3", o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return std::move(e).value();
  };
  auto base = make();
  const ModelConfig& c = base->model().config();
  ASSERT_FALSE(base->model().layers()[0].is_moe);
  ASSERT_EQ(c.num_experts, 16);
  const std::vector<float> ref = Generate(*base, 24);
  auto e = make();
  auto policy = testing::PolicyFor(c, "first-choice", 8);
  ASSERT_NE(policy, nullptr);
  MissRoutingHook hook(policy.get());
  ResidentOnlyProvider provider(e->model(), &hook);
  e->SetMoeHooks(ResidentOnlyHooks(&hook, &provider));
  const std::vector<float> got = Generate(*e, 24);
  e->SetMoeHooks({});
  ASSERT_EQ(got.size(), ref.size());
  for (float v : got) ASSERT_TRUE(std::isfinite(v));
  EXPECT_GT(provider.calls_, 0);
  EXPECT_GT(hook.stats().substitutions, 0);
  EXPECT_NE(got, ref);
  int moe_layers = 0;
  for (const auto& l : e->model().layers()) moe_layers += l.is_moe ? 1 : 0;
  EXPECT_EQ(hook.stats().token_layers, 24 * moe_layers);  // the dense layer never asks
  EXPECT_EQ(policy->cache().ResidentCount(0), 0);
}

class CountingFetcher final : public ExpertFetcher {
 public:
  Status Fetch(int layer, int expert) override {
    ++fetches;
    if (fail_after >= 0 && fetches > fail_after) {
      return Unavailable("fetch of expert " + std::to_string(expert) + " in layer " + std::to_string(layer) + " failed");
    }
    return Status::Ok();
  }
  Status Admit(int, int) override {
    ++admits;
    return Status::Ok();
  }
  void Evict(int, int) override { ++evicts; }
  int64_t fetches = 0, admits = 0, evicts = 0;
  int64_t fail_after = -1;
};

TEST(MissEngine, FetcherSeesEveryMoveAndAFailedFetchFailsTheStep) {
  SKIP_WITHOUT_TINY_MODEL();
  auto e = Make();
  const std::vector<int32_t> ids = Ids(200, 2);
  auto policy = Policy("quality-first", 8);
  MissRoutingHook hook(policy.get());
  CountingFetcher fetcher;
  MoeHooks h;
  h.routing_hook = &hook;
  h.residency = &hook;
  h.fetcher = &fetcher;
  e->SetMoeHooks(h);
  auto r = Perplexity(*e, ids, 50);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const misses::MissStats& s = hook.stats();
  EXPECT_GT(s.fetches, 0);
  EXPECT_GT(s.admission_requests, 0);
  EXPECT_EQ(fetcher.fetches, s.fetches);
  EXPECT_EQ(fetcher.admits, s.admission_requests);
  EXPECT_EQ(fetcher.evicts, s.evictions);
  EXPECT_TRUE(policy->events().empty());  // drained every call

  fetcher.fail_after = fetcher.fetches;  // the next fetch fails
  auto again = Perplexity(*e, Ids(200, 3), 50);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable) << again.status().ToString();
  e->SetMoeHooks({});
}

TEST(MissEngine, LynxThenMissPolicyInOneChain) {
  SKIP_WITHOUT_TINY_MODEL();
  auto e = Make();
  const std::vector<int32_t> ids = Ids(160, 4);
  lynx::LynxRemapper remapper({});
  LynxRoutingHook lynx_hook(&remapper);
  auto policy = Policy("speed-first", 8);
  MissRoutingHook miss_hook(policy.get());
  std::unique_ptr<RoutingHookChain> chain;
  RoutingHook* hook = ComposeRouting(&lynx_hook, &miss_hook, &chain);
  ASSERT_EQ(hook, chain.get());
  EXPECT_EQ(ComposeRouting(nullptr, &miss_hook, &chain), &miss_hook);
  EXPECT_EQ(ComposeRouting(&lynx_hook, nullptr, &chain), &lynx_hook);
  eval::LockstepOptions lo;
  lo.ctx = 40;
  lo.batch = 4;
  lo.hooks.routing_hook = hook;
  lo.hooks.residency = &miss_hook;
  auto r = eval::LockstepPerplexity(*e, ids, lo);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::isfinite(r->ppl()));
  EXPECT_GT(lynx_hook.stats().tokens_changed, 0);  // LYNX ran...
  const misses::MissStats& s = miss_hook.stats();
  EXPECT_EQ(s.slots, s.token_layers * kTopK);  // ...and the miss policy saw its k per token
  EXPECT_GT(s.substitutions, 0);
  EXPECT_EQ(s.first_choice_substitutions, 0);
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("pw_miss_engine_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(MissEngine, TraceRecorderWritesTheRoutersChoice) {
  SKIP_WITHOUT_TINY_MODEL();
  auto e = Make();
  const std::string path = TempPath("rec");
  auto w = misses::RouterTraceWriter::Create(path, TraceHeaderFor(e->model().config()));
  ASSERT_TRUE(w.ok());
  TraceRecorder rec(w->get());
  MoeHooks h;
  h.recorder = &rec;
  e->SetMoeHooks(h);
  const std::vector<int32_t> ids = Ids(40, 5);
  ASSERT_TRUE(e->ForwardLogits(ids).ok());
  ASSERT_TRUE(e->ForwardLogits(std::vector<int32_t>(ids.begin(), ids.begin() + 10)).ok());
  e->SetMoeHooks({});
  ASSERT_TRUE(rec.status().ok());
  ASSERT_TRUE((*w)->Close().ok());
  auto tr = misses::RouterTrace::Read(path);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  EXPECT_EQ(tr->header.num_experts, static_cast<uint32_t>(kExperts));
  EXPECT_EQ(tr->header.top_k, static_cast<uint32_t>(kTopK));
  EXPECT_TRUE(tr->header.norm_topk_prob);
  ASSERT_EQ(tr->layers.size(), 2u * kLayers);
  for (size_t i = 0; i < tr->layers.size(); ++i) {
    const misses::TraceLayer& L = tr->layers[i];
    EXPECT_EQ(L.layer, i % kLayers);
    EXPECT_EQ(L.step, i / kLayers);
    ASSERT_EQ(L.num_tokens(), i < kLayers ? 40u : 10u);
    for (size_t t = 0; t < L.num_tokens(); ++t) {
      EXPECT_EQ(L.positions[t], static_cast<int32_t>(t));
      float sum = 0;
      for (int j = 0; j < kTopK; ++j) sum += L.weights[t * kTopK + j];
      EXPECT_NEAR(sum, 1.f, 1e-5);  // norm_topk_prob
      // The selection is the top-k of the (fp16) logits, up to fp16 ties.
      const float kth = F16ToF32(L.logits[t * kExperts + L.experts[t * kTopK + kTopK - 1]]);
      int above = 0;
      for (int x = 0; x < kExperts; ++x) above += F16ToF32(L.logits[t * kExperts + x]) > kth;
      EXPECT_LE(above, kTopK - 1);
    }
  }
  // Sampling every second pass keeps passes whole.
  const std::string path2 = TempPath("rec2");
  auto w2 = misses::RouterTraceWriter::Create(path2, TraceHeaderFor(e->model().config()));
  ASSERT_TRUE(w2.ok());
  TraceRecorder rec2(w2->get(), 2);
  h.recorder = &rec2;
  e->SetMoeHooks(h);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(e->ForwardLogits(std::vector<int32_t>(ids.begin(), ids.begin() + 5 + i)).ok());
  e->SetMoeHooks({});
  ASSERT_TRUE((*w2)->Close().ok());
  auto tr2 = misses::RouterTrace::Read(path2);
  ASSERT_TRUE(tr2.ok());
  EXPECT_EQ(tr2->layers.size(), 3u * kLayers);  // passes 0, 2, 4
  EXPECT_EQ(tr2->counts.dropped_records, 2u * kLayers);
  EXPECT_EQ(tr2->layers.back().num_tokens(), 9u);
  std::filesystem::remove(path);
  std::filesystem::remove(path2);
}

TEST(MissEngine, ReplayOfAnEmulatedRunReproducesItsCounts) {
  SKIP_WITHOUT_TINY_MODEL();
  auto e = Make();
  const std::string path = TempPath("emu");
  auto w = misses::RouterTraceWriter::Create(path, TraceHeaderFor(e->model().config()));
  ASSERT_TRUE(w.ok());
  TraceRecorder rec(w->get());
  auto policy = Policy("quality-first", 8);
  MissRoutingHook hook(policy.get());
  MoeHooks h;
  h.routing_hook = &hook;
  h.residency = &hook;
  h.recorder = &rec;
  e->SetMoeHooks(h);
  ASSERT_TRUE(Perplexity(*e, Ids(600, 6), 100).ok());
  e->SetMoeHooks({});
  ASSERT_TRUE((*w)->Close().ok());
  auto tr = misses::RouterTrace::Read(path);
  ASSERT_TRUE(tr.ok());
  const misses::ReplayInput in = misses::ReplayInput::From(*tr);
  auto r = misses::Replay(in, policy->config(), 8, misses::CostModel{});
  ASSERT_TRUE(r.ok());
  const misses::MissStats& a = hook.stats();
  const misses::MissStats& b = r->stats;
  EXPECT_EQ(b.token_layers, a.token_layers);
  EXPECT_EQ(b.slots, a.slots);
  // Same selections and weights; substitutes scored from fp16 logits instead of fp32
  // probabilities may break a near tie differently, so counts agree closely, not exactly.
  EXPECT_NEAR(static_cast<double>(b.fetches), static_cast<double>(a.fetches), 0.01 * a.fetches + 2);
  EXPECT_NEAR(static_cast<double>(b.substitutions), static_cast<double>(a.substitutions), 0.01 * a.substitutions + 2);
  EXPECT_NEAR(b.mass_sum, a.mass_sum, 0.01 * a.mass_sum + 1e-3);
  EXPECT_GT(a.substitutions, 0);
  std::filesystem::remove(path);
}

// A sigmoid-gated family's trace (deepseek_v3: 16 experts top-4 in 4 groups keeping 2, a dense
// first layer) is version 2: the header names the gate and its groups and each MoE layer's
// selection bias is stored once; pw-sim's replay ranks substitutes as the engine's hook does
// (sigmoid score plus the bias), so a replay of an emulated run reproduces its counts and its
// substituted mass (ranked by a softmax of the logits, the replay measured 136 fetches, 380
// substitutions and a mass of 90.6 against the engine's 144, 361 and 85.8).
TEST(MissEngine, DeepseekV3ReplayRanksByTheSigmoidGateAndItsBias) {
  EngineOptions o;
  o.num_kv_blocks = 64;
  auto e = Engine::Create(std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/deepseek_v3", o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const ModelConfig& c = (*e)->model().config();
  const std::string path = TempPath("deepseek_v3");
  auto w = misses::RouterTraceWriter::Create(path, TraceHeaderFor(c));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  TraceRecorder rec(w->get());
  auto policy = testing::PolicyFor(c, "first-choice", 8);
  ASSERT_NE(policy, nullptr);
  MissRoutingHook hook(policy.get());
  MoeHooks h;
  h.routing_hook = &hook;
  h.residency = &hook;
  h.recorder = &rec;
  (*e)->SetMoeHooks(h);
  std::vector<int32_t> ids = Ids(400, 7);
  for (int32_t& t : ids) t %= 2048;  // the fixture's vocabulary
  ASSERT_TRUE(Perplexity(**e, ids, 100).ok());
  (*e)->SetMoeHooks({});
  ASSERT_TRUE(rec.status().ok()) << rec.status().ToString();
  ASSERT_TRUE((*w)->Close().ok());
  auto tr = misses::RouterTrace::Read(path);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  EXPECT_EQ(tr->header.gate, misses::TraceGate::kSigmoid);
  EXPECT_EQ(tr->header.n_group, 4u);
  EXPECT_EQ(tr->header.topk_group, 2u);
  ASSERT_EQ(tr->selection_bias.size(), 3u);
  EXPECT_TRUE(tr->selection_bias[0].empty());  // the dense layer
  for (int l = 1; l < 3; ++l) EXPECT_EQ(tr->selection_bias[l], (*e)->model().layers()[l].router_bias);
  {
    std::ifstream f(path, std::ios::binary);
    char head[12];
    f.read(head, 12);
    uint32_t version;
    std::memcpy(&version, head + 8, 4);
    EXPECT_EQ(version, 2u);
  }
  const misses::ReplayInput in = misses::ReplayInput::From(*tr);
  EXPECT_EQ(in.num_moe_layers, 2);
  auto r = misses::Replay(in, policy->config(), 8, misses::CostModel{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const misses::MissStats& a = hook.stats();
  const misses::MissStats& b = r->stats;
  EXPECT_EQ(b.token_layers, a.token_layers);
  EXPECT_EQ(a.token_layers, 400 * 2);
  EXPECT_EQ(b.slots, a.slots);
  EXPECT_GT(a.substitutions, 0);
  EXPECT_NEAR(static_cast<double>(b.fetches), static_cast<double>(a.fetches), 0.01 * a.fetches + 2);
  EXPECT_NEAR(static_cast<double>(b.substitutions), static_cast<double>(a.substitutions), 0.01 * a.substitutions + 2);
  EXPECT_NEAR(b.mass_sum, a.mass_sum, 0.01 * a.mass_sum + 1e-3);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pw::engine
