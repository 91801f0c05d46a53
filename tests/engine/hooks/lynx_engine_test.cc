// The LYNX routing hook in the engine on the tiny model (models/tiny-moe: N = 32, k = 4):
// LYNX off — no hook, a disabled hook, or a hook whose gate stays closed (prefill, a batch of
// one) — is bit-identical to the engine without it; LYNX on at batch 8 remaps decode steps
// and keeps them valid; on glm4_moe (sigmoid gate) it keeps exactly k experts per token with
// the gate's own weights (unbiased sigmoid, renormalised, times routed_scaling_factor); on a
// synthetic qwen3_next of 512 experts (the expert-miss paper's setting: k/N = 10/512 gives LYNX
// its bins) exactly 10 per token, weighted by the softmax renormalised over them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "policies/lynx/lynx_remap.h"
#include "policies/lynx/piggyback_remap.h"
#include "engine/engine.h"
#include "engine/hooks/lynx_routing_hook.h"
#include "engine/models/model.h"
#include "common/formats/synthetic_moe.h"
#include "engine/eval/perplexity.h"
#include "tests/engine/test_util.h"
#include "tools/lockstep_perplexity.h"

namespace pw::engine {
namespace {

// Lockstep scoring is compared with whole windows (tests/engine/test_util.h).
[[maybe_unused]] const bool kBatchInvariantKernels = testing::UseBatchInvariantKernels();

std::string TinyDir() { return std::string(PW_SOURCE_DIR) + "/models/tiny-moe"; }

#define SKIP_WITHOUT_TINY_MODEL()                                          \
  if (!std::filesystem::exists(TinyDir() + "/model.safetensors")) {        \
    GTEST_SKIP() << TinyDir() << "/model.safetensors is absent";           \
  }

// Decodes `batch` random prompts for `steps` greedy tokens; returns every step's logits.
std::vector<float> Decode(Engine& e, int batch, int steps, uint32_t seed) {
  std::mt19937 rng(seed);
  SamplingParams sp;
  sp.max_tokens = steps + 1;
  sp.ignore_eos = true;
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> prompt(12 + b);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(e.vocab_size()));
    EXPECT_TRUE(e.AddSequence(static_cast<SeqId>(b + 1), prompt, sp).ok());
  }
  std::vector<float> all;
  while (e.HasWork()) {
    auto step = e.Step();
    EXPECT_TRUE(step.ok()) << step.status().ToString();
    if (!step.ok()) break;
    for (const auto& u : step->updates) all.insert(all.end(), u.logits.begin(), u.logits.end());
  }
  return all;
}

std::unique_ptr<Engine> Make() {
  EngineOptions o;
  o.return_logits = true;
  auto e = Engine::Create(TinyDir(), o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(LynxEngine, OffIsBitIdenticalToNoHook) {
  SKIP_WITHOUT_TINY_MODEL();
  auto base = Make();
  const std::vector<float> ref8 = Decode(*base, 8, 6, 11);
  const std::vector<float> ref1 = Decode(*base, 1, 6, 12);
  std::vector<int32_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 5) % 4096);
  auto ref_fwd = base->ForwardLogits(ids);
  ASSERT_TRUE(ref_fwd.ok());

  lynx::LynxRemapper remapper({});
  LynxRoutingHook hook(&remapper);
  hook.Reserve(64, 32, 4);
  auto e = Make();
  MoeHooks h;
  h.routing_hook = &hook;
  e->SetMoeHooks(h);

  hook.set_enabled(false);  // disabled: batch 8 decode unchanged
  EXPECT_TRUE(BitIdentical(Decode(*e, 8, 6, 11), ref8));
  EXPECT_EQ(hook.stats().calls, 0);

  hook.set_enabled(true);
  // Prefill only (teacher-forced window): the phase gate stays closed.
  auto fwd = e->ForwardLogits(ids);
  ASSERT_TRUE(fwd.ok());
  EXPECT_TRUE(BitIdentical(*fwd, *ref_fwd));
  // A batch of one: the rule is the identity.
  EXPECT_TRUE(BitIdentical(Decode(*e, 1, 6, 12), ref1));
  EXPECT_GT(hook.stats().calls, 0);
  EXPECT_EQ(hook.stats().tokens_changed, 0);
  e->SetMoeHooks({});
}

TEST(LynxEngine, OnRemapsDecodeBatchesOnly) {
  SKIP_WITHOUT_TINY_MODEL();
  for (int rule = 0; rule < 2; ++rule) {
    lynx::LynxRemapper lynx_rule({});
    lynx::PiggybackRemapper pig_rule({});
    lynx::BatchRemapper* r = rule == 0 ? static_cast<lynx::BatchRemapper*>(&lynx_rule) : &pig_rule;
    LynxRoutingHook hook(r);
    auto e = Make();
    MoeHooks h;
    h.routing_hook = &hook;
    e->SetMoeHooks(h);
    const std::vector<float> logits = Decode(*e, 8, 6, 11);
    EXPECT_FALSE(logits.empty());
    const LynxHookStats& s = hook.stats();
    // Pure-decode steps of 8 tokens x 4 layers (the first step prefills, the gate stays shut).
    EXPECT_GT(s.applied_calls, 0) << rule;
    EXPECT_EQ(s.applied_calls % 4, 0) << rule;
    EXPECT_LT(s.applied_calls, s.calls) << rule;
    EXPECT_GT(s.tokens_changed, 0) << rule;
    EXPECT_LT(s.distinct_after, s.distinct_before) << rule;
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    e->SetMoeHooks({});
  }
}

// Runs the LYNX hook, then checks what it returned against the gate's context: exactly k
// distinct experts per token, token-major, each weight the token's gate probability (glm4_moe:
// its unbiased sigmoid score; a softmax gate: its softmax) renormalised over its k and times
// `scale` (the glm4_moe fixture has norm_topk_prob and a routed_scaling_factor of 2.5), whether
// or not the token was remapped.
class CheckedLynx final : public RoutingHook {
 public:
  CheckedLynx(LynxRoutingHook* inner, GateKind gate = GateKind::kSigmoidGroupedTopK, float scale = 2.5f)
      : inner_(inner), gate_(gate), scale_(scale) {}
  Status Rewrite(const RoutingContext& ctx, std::vector<ExpertAssignment>* a) override {
    const std::vector<ExpertAssignment> before = *a;
    PW_RETURN_IF_ERROR(inner_->Rewrite(ctx, a));
    const size_t T = static_cast<size_t>(ctx.num_tokens), k = static_cast<size_t>(ctx.top_k);
    const size_t E = static_cast<size_t>(ctx.num_experts);
    EXPECT_EQ(ctx.gate, gate_);
    EXPECT_EQ(ctx.weight_scale, scale_);
    if (gate_ == GateKind::kSigmoidGroupedTopK) EXPECT_NE(ctx.selection_scores, ctx.router_probs);
    if (a->size() != T * k) {
      ADD_FAILURE() << "layer " << ctx.layer << ": " << a->size() << " assignments for " << T
                    << " tokens of top-" << k;
      return Status::Ok();
    }
    for (size_t t = 0; t < T; ++t) {
      const ExpertAssignment* row = a->data() + t * k;
      const float* s = ctx.router_probs + t * E;
      float sum = 0.f;
      bool changed = false;
      for (size_t j = 0; j < k; ++j) {
        EXPECT_EQ(row[j].token, static_cast<int32_t>(t));
        sum += s[row[j].expert];
        for (size_t i = 0; i < j; ++i) EXPECT_NE(row[i].expert, row[j].expert);
        bool was = false;
        for (size_t i = 0; i < k; ++i) was = was || before[t * k + i].expert == row[j].expert;
        changed = changed || !was;
      }
      for (size_t j = 0; j < k; ++j) {
        EXPECT_NEAR(row[j].weight, s[row[j].expert] / sum * scale_, 1e-6f)
            << "layer " << ctx.layer << " token " << t << " expert " << row[j].expert;
      }
      if (gate_ == GateKind::kSigmoidGroupedTopK) CheckSelection(ctx, t, row);
      tokens_changed += changed ? 1 : 0;
      ++tokens;
    }
    return Status::Ok();
  }
  int64_t tokens_changed = 0;
  int64_t tokens = 0;        // token-layer rows checked
  int64_t masked_slots = 0;  // experts outside their token's kept groups

 private:
  // The selection scores are the unbiased sigmoid plus the correction bias (the bias selects,
  // it never weighs), -inf outside the token's kept groups; every expert kept (remapped or
  // not) is inside them.
  void CheckSelection(const RoutingContext& ctx, size_t t, const ExpertAssignment* row) {
    const size_t E = static_cast<size_t>(ctx.num_experts);
    const float* sel = ctx.selection_scores + t * E;
    const float* s = ctx.router_probs + t * E;
    ASSERT_NE(ctx.selection_bias, nullptr);
    for (size_t e = 0; e < E; ++e) {
      if (std::isinf(sel[e])) {
        EXPECT_LT(sel[e], 0.f);
        ++masked_slots;
      } else {
        EXPECT_EQ(sel[e], s[e] + ctx.selection_bias[e]) << "layer " << ctx.layer << " expert " << e;
      }
    }
    for (int j = 0; j < ctx.top_k; ++j) {
      EXPECT_TRUE(std::isfinite(sel[row[j].expert]))
          << "layer " << ctx.layer << " token " << t << ": expert " << row[j].expert
          << " is outside the token's kept groups";
    }
  }

  LynxRoutingHook* inner_;
  GateKind gate_;
  float scale_;
};

TEST(LynxEngine, SigmoidGateKeepsExactlyKWithTheGatesWeights) {
  EngineOptions o;
  o.return_logits = true;
  auto e = Engine::Create(std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/glm4_moe", o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  lynx::LynxRemapper remapper({});
  LynxRoutingHook hook(&remapper);
  CheckedLynx checked(&hook);
  MoeHooks h;
  h.routing_hook = &checked;
  (*e)->SetMoeHooks(h);
  const std::vector<float> logits = Decode(**e, 8, 6, 21);
  (*e)->SetMoeHooks({});
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  EXPECT_GT(hook.stats().applied_calls, 0);
  EXPECT_GT(hook.stats().tokens_changed, 0);
  EXPECT_EQ(checked.tokens_changed, hook.stats().tokens_changed);
  EXPECT_LT(hook.stats().distinct_after, hook.stats().distinct_before);
}

// deepseek_v3 (tests/fixtures/models/deepseek_v3: a dense first layer, 16 experts top-4 in 4
// groups of which each token keeps 2, a shared expert, routed_scaling_factor 2.5): LYNX and the
// piggyback rule remap decode batches by the biased, group-masked selection and keep exactly 4
// experts per token, all inside the token's kept groups (an expert the gate masked out is never
// brought in, however popular in the batch), weighted by the unbiased sigmoid; they run in the
// MoE layers only.
TEST(LynxEngine, DeepseekV3KeepsExactlyKInsideTheKeptGroups) {
  EngineOptions o;
  o.return_logits = true;
  auto e = Engine::Create(std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/deepseek_v3", o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const ModelConfig& c = (*e)->model().config();
  ASSERT_EQ(c.n_group, 4);
  ASSERT_EQ(c.topk_group, 2);
  for (int rule = 0; rule < 2; ++rule) {
    SCOPED_TRACE(rule == 0 ? "lynx" : "piggyback");
    lynx::LynxRemapper lynx_rule({});
    lynx::PiggybackRemapper pig_rule({});
    lynx::BatchRemapper* r = rule == 0 ? static_cast<lynx::BatchRemapper*>(&lynx_rule) : &pig_rule;
    LynxRoutingHook hook(r);
    CheckedLynx checked(&hook);
    MoeHooks h;
    h.routing_hook = &checked;
    (*e)->SetMoeHooks(h);
    const std::vector<float> logits = Decode(**e, 8, 6, 41);
    (*e)->SetMoeHooks({});
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    EXPECT_GT(checked.tokens, 0);
    // Half of each token's experts are in groups it did not keep.
    EXPECT_EQ(checked.masked_slots, checked.tokens * 8);
    EXPECT_GT(hook.stats().applied_calls, 0);
    EXPECT_EQ(hook.stats().applied_calls % 2, 0);  // two MoE layers per decode step
    EXPECT_GT(hook.stats().tokens_changed, 0);
    EXPECT_EQ(checked.tokens_changed, hook.stats().tokens_changed);
    EXPECT_LT(hook.stats().distinct_after, hook.stats().distinct_before);
  }
}

TEST(LynxEngine, Qwen3NextOf512ExpertsKeepsExactlyTenPerToken) {
  SyntheticMoeSpec spec = Qwen3NextQuarterSpec();  // 512 experts, top-10, a shared expert
  spec.hidden = 64;
  spec.expert_ffn = 16;
  spec.shared_ffn = 32;
  spec.vocab = 1024;
  spec.linear_key_heads = 2;
  spec.linear_value_heads = 4;
  spec.linear_head_dim = 16;
  const std::string dir = ::testing::TempDir() + "/lynx_qwen3_next_512";
  ASSERT_TRUE(WriteSyntheticMoe(spec, dir).ok());
  EngineOptions o;
  o.return_logits = true;
  auto e = Engine::Create(dir, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ((*e)->model().config().num_experts, 512);
  ASSERT_EQ((*e)->model().config().num_experts_per_tok, 10);
  lynx::LynxRemapper remapper({});
  LynxRoutingHook hook(&remapper);
  CheckedLynx checked(&hook, GateKind::kSoftmaxTopK, 1.f);
  MoeHooks h;
  h.routing_hook = &checked;
  (*e)->SetMoeHooks(h);
  const std::vector<float> logits = Decode(**e, 8, 6, 31);
  (*e)->SetMoeHooks({});
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  EXPECT_GT(checked.tokens, 0);
  EXPECT_GT(hook.stats().applied_calls, 0);
  EXPECT_GT(hook.stats().tokens_changed, 0);
  EXPECT_EQ(checked.tokens_changed, hook.stats().tokens_changed);
  EXPECT_LT(hook.stats().distinct_after, hook.stats().distinct_before);
}

// Lockstep scoring (pw-eval ppl --batch) scores the same predictions as whole windows, up to
// summation order; with LYNX on it runs and reports remapped decode batches.
TEST(LynxEngine, LockstepPerplexityMatchesWholeWindows) {
  SKIP_WITHOUT_TINY_MODEL();
  EngineOptions o;
  o.num_kv_blocks = 64;
  auto e = Engine::Create(TinyDir(), o);
  ASSERT_TRUE(e.ok());
  std::vector<int32_t> ids(150);
  std::mt19937 rng(3);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 4096);
  auto whole = Perplexity(**e, ids, 32);
  ASSERT_TRUE(whole.ok());
  eval::LockstepOptions lo;
  lo.ctx = 32;
  lo.batch = 3;  // 5 windows: a group of 3, then 2 (the last one 22 tokens)
  auto lock = eval::LockstepPerplexity(**e, ids, lo);
  ASSERT_TRUE(lock.ok()) << lock.status().ToString();
  EXPECT_EQ(lock->n_tokens, whole->n_tokens);
  EXPECT_EQ(lock->n_windows, whole->n_windows);
  ASSERT_EQ(lock->token_nll.size(), whole->token_nll.size());
  for (size_t i = 0; i < whole->token_nll.size(); ++i) {
    EXPECT_NEAR(lock->token_nll[i], whole->token_nll[i], 1e-3) << i;
    EXPECT_EQ(lock->token_window[i], whole->token_window[i]);
  }
  EXPECT_NEAR(lock->ppl(), whole->ppl(), 1e-4 * whole->ppl());

  lynx::LynxRemapper remapper({});
  LynxRoutingHook hook(&remapper);
  lo.hooks.routing_hook = &hook;
  auto on = eval::LockstepPerplexity(**e, ids, lo);
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_EQ(on->n_tokens, whole->n_tokens);
  // Every pass is pure decode; all but the last 10 steps (window 4 alone) hold 2 or 3 tokens.
  EXPECT_EQ(hook.stats().applied_calls, hook.stats().calls - 10 * 4);
  EXPECT_LE(hook.stats().distinct_after, hook.stats().distinct_before);
  EXPECT_TRUE(std::isfinite(on->ppl()));
  EXPECT_EQ((*e)->kv_pool().num_free(), 64);
}

}  // namespace
}  // namespace pw::engine
