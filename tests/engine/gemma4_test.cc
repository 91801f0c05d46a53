// gemma4's pieces: the gelu-tanh activation against hand-computed values, its stacked experts
// as the broker reads them (CheckpointExperts) against the engine's, an any-precision store
// built from it (bf16 width: the checkpoint's logits bit for bit), and a missing tensor of its
// layer named at load. HF parity of the whole model: engine_test (fixtures gemma4, gemma4_mm).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/apw_store.h"
#include "common/formats/checkpoint_experts.h"
#include "common/formats/safetensors.h"
#include "common/formats/synthetic_moe.h"
#include "common/formats/width_map.h"
#include "engine/engine.h"
#include "engine/experts/apw_expert_provider.h"
#include "engine/experts/bf16_expert_provider.h"
#include "engine/experts/expert_activation.h"
#include "engine/layers/moe_layer.h"
#include "engine/models/model.h"
#include "quant/quantize_model.h"
#include "tests/common/test_util.h"
#include "tests/engine/miss_policy_check.h"
#include "tests/engine/test_util.h"

namespace pw::engine {
namespace {

TEST(Gemma4, GeluTanhMatchesHandComputedValues) {
  // 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up.
  const float gate[] = {1.f, -2.f, 0.f, 3.5f};
  const float up[] = {0.5f, 2.f, 7.f, -1.f};
  float out[4];
  GeluTanhMul(gate, up, 4, out);
  auto gelu = [](double g) {
    return 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
  };
  EXPECT_NEAR(out[0], gelu(1.0) * 0.5, 1e-6);
  EXPECT_NEAR(out[1], gelu(-2.0) * 2.0, 1e-6);
  EXPECT_EQ(out[2], 0.f);
  EXPECT_NEAR(out[3], gelu(3.5) * -1.0, 1e-5);
  auto op = ExpertActivationOp(ExpertActivation::kGeluTanh, cpu::Kernels());
  ASSERT_TRUE(op.ok());
  EXPECT_EQ(*op, &GeluTanhMul);
}

// The broker's reader (stacked [E, 2I, H] gate then up, [E, H, I]) gives the engine's matrices,
// in the text checkpoint and under model.language_model. in the multimodal one.
TEST(Gemma4, CheckpointExpertsGiveTheEnginesExpertMatrices) {
  for (const char* fixture : {"gemma4", "gemma4_mm"}) {
    SCOPED_TRACE(fixture);
    auto ck = CheckpointExperts::Open(testing::FixtureModelDir(fixture));
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    auto model = Model::Load(testing::FixtureModelDir(fixture));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    for (int64_t l : {0, 3}) {
      for (int64_t x : {0, 7, 15}) {
        auto e = (*ck)->Get(l, x);
        ASSERT_TRUE(e.ok()) << e.status().ToString();
        const MlpWeights& w =
            (*model)->layers()[static_cast<size_t>(l)].experts[static_cast<size_t>(x)];
        const size_t n = static_cast<size_t>(e->ffn * e->hidden) * 2;
        EXPECT_EQ(std::memcmp(e->gate, w.gate.data, n), 0);
        EXPECT_EQ(std::memcmp(e->up, w.up.data, n), 0);
        EXPECT_EQ(std::memcmp(e->down, w.down.data, n), 0);
      }
    }
  }
  auto a = ModelHash(testing::FixtureModelDir("gemma4"));
  auto b = ModelHash(testing::FixtureModelDir("gemma4_mm"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);  // config.json differs; both hash
}

// An any-precision store built from gemma4's checkpoint (pw-quantize's QuantizeModel): at bf16
// width the checkpoint's logits bit for bit (per-expert weight factors and the experts' own
// input norm applied around the provider), at 8 bits close.
TEST(Gemma4, AnyPrecisionStoreReproducesTheCheckpoint) {
  pw::testing::TempDir dir;
  anyprec::QuantizeModelOptions o;
  o.model_dir = testing::FixtureModelDir("gemma4");
  o.tokenizer_path = "/nonexistent/tokenizer.json";
  o.calib_random_tokens = 200;
  o.out_path = dir.File("gemma4.apw");
  o.threads = 2;
  o.ctx = 64;
  o.progress = false;
  auto r = anyprec::QuantizeModel(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_blocks, 4 * 16 * 2);
  auto opened = apw::ApwStore::Open(o.out_path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::shared_ptr<const apw::ApwStore> store = std::move(opened).value();
  auto eng = Engine::Create(testing::FixtureModelDir("gemma4"), {});
  ASSERT_TRUE(eng.ok()) << eng.status().ToString();
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back((i * 37 + 3) % 1000 + 3);  // past the window of 8
  auto ref = (*eng)->ForwardLogits(ids);
  ASSERT_TRUE(ref.ok());
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
  };
  for (int bits : {8, anyprec::kBf16Bits}) {
    auto provider = anyprec::ApwExpertProvider::Create(store, (*eng)->model(),
                                                       *anyprec::WidthMap::Uniform(bits, 4, 16));
    ASSERT_TRUE(provider.ok()) << provider.status().ToString();
    MoeHooks hooks;
    hooks.provider = provider->get();
    (*eng)->SetMoeHooks(hooks);
    auto got = (*eng)->ForwardLogits(ids);
    (*eng)->SetMoeHooks({});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    if (bits == anyprec::kBf16Bits) {
      EXPECT_EQ(rel(*got, *ref), 0.0);
    } else {
      EXPECT_LT(rel(*got, *ref), 0.06) << "8 bits";
    }
  }
}

// A checkpoint without one of the layer's sandwich tensors is refused at load, naming it.
TEST(Gemma4, MissingLayerTensorIsNamed) {
  pw::testing::TempDir dir;
  const std::string src = testing::FixtureModelDir("gemma4");
  std::filesystem::copy_file(src + "/config.json", dir.File("config.json"));
  auto file = SafetensorsFile::Open(src + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  SafetensorsWriter out;
  for (const std::string& name : (*file)->TensorNames()) {
    if (name == "model.layers.2.post_feedforward_layernorm_2.weight") continue;
    auto t = (*file)->Get(name);
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(out.Add(name, t->dtype, t->shape, t->data, t->nbytes).ok());
  }
  ASSERT_TRUE(out.Write(dir.File("model.safetensors")).ok());
  auto m = Model::Load(dir.path());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("model.layers.2.post_feedforward_layernorm_2.weight"),
            std::string::npos)
      << m.status().ToString();
}

// A hook that moves each token's whole weight (1) onto expert (first + shift) % E.
class MoveToOneExpert final : public RoutingHook {
 public:
  explicit MoveToOneExpert(int shift) : shift_(shift) {}
  Status Rewrite(const RoutingContext& ctx, std::vector<ExpertAssignment>* a) override {
    std::vector<ExpertAssignment> out;
    for (const ExpertAssignment& x : *a) {
      if (x.rank != 0) continue;
      out.push_back({x.token, (x.expert + shift_) % ctx.num_experts, 1.f, -1});
      experts_.push_back(out.back().expert);
    }
    *a = std::move(out);
    return Status::Ok();
  }
  std::vector<int32_t> experts_;

 private:
  int shift_;
};

// per_expert_scale weighs the expert that runs, after the routing hooks: a hook that moves a
// token onto another expert with weight 1 gets that expert's output times its own factor (the
// layer without factors gives the output alone).
TEST(Gemma4, ExpertScaleWeighsTheExpertAHookChose) {
  auto model = Model::Load(testing::FixtureModelDir("gemma4"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& c = (*model)->config();
  const LayerWeights& layer = (*model)->layers()[1];
  LayerWeights unscaled = layer;
  unscaled.expert_weight_scale.clear();
  const size_t T = 5, H = static_cast<size_t>(c.hidden_size);
  std::vector<float> x(T * H), router_x(T * H);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.37f * static_cast<float>(i));
    router_x[i] = std::cos(0.11f * static_cast<float>(i));
  }
  const std::vector<uint64_t> seqs(T, 1);
  std::vector<int32_t> positions(T);
  for (size_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>(t);
  AllResident resident;
  Bf16ExpertProvider provider(**model);
  cpu::ThreadPool pool(1);
  auto run = [&](const LayerWeights& w, MoveToOneExpert* hook, std::vector<float>* out) {
    RoutingContext ctx;
    ctx.layer = 1;
    ctx.num_tokens = static_cast<int>(T);
    ctx.seq_ids = seqs.data();
    ctx.positions = positions.data();
    ctx.residency = &resident;
    MoeHooks hooks;
    hooks.routing_hook = hook;
    MoeScratch scratch;
    out->assign(T * H, 0.f);
    return RunMoeLayer(c, w, ctx, x.data(), out->data(), hooks, &provider, &scratch, &pool,
                       cpu::Kernels(), router_x.data());
  };
  MoveToOneExpert scaled_hook(5), plain_hook(5);
  std::vector<float> scaled, plain;
  ASSERT_TRUE(run(layer, &scaled_hook, &scaled).ok());
  ASSERT_TRUE(run(unscaled, &plain_hook, &plain).ok());
  ASSERT_EQ(scaled_hook.experts_, plain_hook.experts_);
  ASSERT_EQ(scaled_hook.experts_.size(), T);
  for (size_t t = 0; t < T; ++t) {
    const float s = layer.expert_weight_scale[static_cast<size_t>(scaled_hook.experts_[t])];
    ASSERT_NE(s, 1.f);
    for (size_t j = 0; j < H; ++j) {
      EXPECT_NEAR(scaled[t * H + j], s * plain[t * H + j], 1e-5f * (1.f + std::fabs(plain[t * H + j])))
          << "token " << t << " dim " << j;
    }
  }
}

// Expert misses over gemma4, the policy sized from its config (4 layers, 16 experts, top-4):
// fetching every miss gives the all-resident logits bit for bit; substituting keeps k experts
// per token (each weighed by its own per_expert_scale, applied after the hook) and finite logits.
TEST(Gemma4, MissPoliciesUseKOfNFromTheConfig) {
  testing::ExpectMissPoliciesUseKOfNFromTheConfig("gemma4", 4, 4);
}

// make_synthetic_moe --type gemma4: Gemma4MoeSpec's layout at test size loads and runs (the
// layer types HF's default: every 6th and the last full; the full layers of their own shape,
// without v_proj), and the default's size.
TEST(Gemma4, SyntheticCheckpointLoadsAndRuns) {
  pw::testing::TempDir tmp;
  SyntheticMoeSpec spec = Gemma4MoeSpec();
  spec.layers = 7;
  spec.hidden = 64;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.experts = 8;
  spec.top_k = 2;
  spec.expert_ffn = 32;
  spec.dense_ffn = 48;
  spec.vocab = 300;
  spec.full_head_dim = 32;
  spec.full_kv_heads = 1;
  ASSERT_TRUE(WriteSyntheticMoe(spec, tmp.path()).ok());
  auto e = Engine::Create(tmp.path(), {});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const ModelConfig& c = (*e)->model().config();
  EXPECT_EQ(c.type, ModelType::kGemma4);
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{true, true, true, true, true, false, false}));
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ((*e)->model().layers()[3].mlp.gate.rows, 48);
  EXPECT_EQ(c.full_head_dim, 32);
  EXPECT_EQ(c.full_num_kv_heads, 1);
  EXPECT_TRUE(c.k_eq_v);
  EXPECT_EQ((*e)->model().layers()[4].k.rows, 2 * 16);
  EXPECT_EQ((*e)->model().layers()[5].k.rows, 1 * 32);
  EXPECT_EQ((*e)->model().layers()[5].v.data, nullptr);
  EXPECT_EQ((*e)->model().layers()[5].q.rows, 4 * 32);
  auto logits = (*e)->ForwardLogits(std::vector<int32_t>{1, 2, 3, 200, 5});
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
  const double gb = static_cast<double>(SyntheticMoeBytes(Gemma4MoeSpec())) / 1e9;
  // 2 layers of 128 experts x 3 x 512 x 2048 bf16 (1.6 GB), the tied embeddings (1.07 GB),
  // attention and dense MLPs (0.09 GB).
  EXPECT_GT(gb, 2.7);
  EXPECT_LT(gb, 2.85);
}

}  // namespace
}  // namespace pw::engine
