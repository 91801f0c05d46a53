// The per-layer expert seam's runners against computing the same experts one block at a time:
//   - RunQ8Experts (x quantized once per layer, one dispatch per projection) gives the same
//     bits as ApplyQ8Block per block (each expert's rows quantized on their own), on every
//     fast-path backend, at mixed widths, for T = 1, 3, 37 and 70 tokens (an expert with more
//     than kMaxTokens rows), with experts that get no token, on 1, 2 and 3 threads;
//   - RunBf16Experts gives the same bits as the bf16 Linear per block;
//   - both add into `out` (never overwrite it);
//   - CutExpertTiles cuts the tiles into contiguous runs of about equal cost, and RunExpertTiles
//     runs every tile once;
//   - non-finite activations are a clear error naming the layer;
//   - an activation kind without a CPU op is refused by every runner, nothing computed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "kernels/anyprec/pack.h"
#include "kernels/anyprec/q8.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/thread_pool.h"
#include "engine/experts/apw_expert_provider.h"
#include "engine/experts/expert_activation.h"
#include "engine/experts/q8_experts.h"
#include "engine/experts/bf16_experts.h"
#include "engine/experts/expert_tiles.h"
#include "engine/experts/expert_workspace.h"
#include "engine/ops/linear.h"
#include "engine/experts/run_experts_by_block.h"
#include "tests/anyprec/random_block.h"
#include "engine/experts/q8_block.h"

namespace pw::anyprec {
namespace {

using kernels::Backend;

using engine::ExpertGroup;
using engine::ExpertLayerCall;
using engine::ExpertProj;
using engine::ExpertRow;

// Awkward shapes: H not a multiple of 256 (a half group pair), I not a multiple of 64.
constexpr int kHidden = 300;
constexpr int kFfn = 88;
constexpr int kExperts = 9;
constexpr int kTopK = 3;

// A routed layer: tokens pick kTopK distinct experts among those allowed; expert 4 is picked by
// every token (so it gets more than kMaxTokens rows at T = 70), experts 0 and 6 by none.
struct Routing {
  std::vector<ExpertGroup> groups;
  std::vector<ExpertRow> rows;
};

Routing Route(int tokens, std::mt19937& rng) {
  std::vector<std::vector<ExpertRow>> per(kExperts);
  std::uniform_real_distribution<float> w(0.05f, 1.f);
  const std::vector<int> others = {1, 2, 3, 5, 7, 8};
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> pick = others;
    std::shuffle(pick.begin(), pick.end(), rng);
    pick.resize(kTopK - 1);
    pick.push_back(4);
    for (int e : pick) per[e].push_back({t, w(rng)});
  }
  Routing r;
  for (int e = 0; e < kExperts; ++e) {
    if (per[e].empty()) continue;
    r.groups.push_back({e, static_cast<int32_t>(r.rows.size()), static_cast<int32_t>(r.rows.size() + per[e].size())});
    r.rows.insert(r.rows.end(), per[e].begin(), per[e].end());
  }
  return r;
}

ExpertLayerCall MakeCall(const Routing& r, const std::vector<float>& x, int tokens, std::vector<float>* out,
                         engine::ExpertWorkspace* ws, cpu::ThreadPool* pool) {
  ExpertLayerCall c;
  c.layer = 3;
  c.num_tokens = static_cast<size_t>(tokens);
  c.hidden = kHidden;
  c.ffn = kFfn;
  c.x = x.data();
  c.groups = r.groups;
  c.rows = r.rows;
  c.out = out->data();
  c.workspace = ws;
  c.pool = pool;
  return c;
}

// Expert blocks at random widths, their int8 LUTs and page lists (tiles of 32 rows).
struct Q8Layer {
  std::vector<RandomBlock> blocks;  // [expert][proj]
  std::vector<std::unique_ptr<PageLists>> pages;
  std::vector<std::vector<int8_t>> lut_values;
  std::vector<std::vector<float>> lut_scales;
  std::vector<int> bits;

  explicit Q8Layer(std::mt19937& rng) {
    std::uniform_int_distribution<int> width(kMinBits, kMaxBits);
    for (int e = 0; e < kExperts; ++e) {
      for (int proj = 0; proj < 2; ++proj) {
        const int rows = proj == 0 ? 2 * kFfn : kHidden, cols = proj == 0 ? kHidden : kFfn;
        blocks.push_back(MakeRandomBlock(rows, cols, rng));
        const PackedBlock& b = blocks.back().block;
        const uint8_t* planes[kNumPlanes];
        for (int p = 0; p < kNumPlanes; ++p) planes[p] = b.Plane(p);
        const uint16_t* luts[kMaxBits + 1] = {};
        for (int w = kMinBits; w <= kMaxBits; ++w) luts[w] = b.luts[w].data();
        pages.push_back(std::make_unique<PageLists>(planes, luts, rows, cols, 32));
        const int w = width(rng);
        bits.push_back(w);
        lut_values.emplace_back(Q8LutValueBytes(rows, w));
        lut_scales.emplace_back(static_cast<size_t>(rows));
        EXPECT_TRUE(QuantizeLut(b.luts[w].data(), rows, w, lut_values.back().data(), lut_scales.back().data()).ok());
      }
    }
  }
  Q8ExpertBlock Block(int expert, int proj) const {
    const size_t i = static_cast<size_t>(expert) * 2 + static_cast<size_t>(proj);
    return {pages[i]->view(), Q8Lut{lut_values[i].data(), lut_scales[i].data()}, bits[i]};
  }
};

std::vector<Backend> FastBackends() {
  std::vector<Backend> v;
  for (Backend b : {Backend::kScalar, Backend::kAvx2, Backend::kAvx512, Backend::kAmx}) {
    if (Q8BackendAvailable(b)) v.push_back(b);
  }
  return v;
}

TEST(ExpertLayer, Q8LayerMatchesPerBlockQuantization) {
  std::mt19937 rng(21);
  const Q8Layer layer(rng);
  const kernels::DenseKernels& k = cpu::Kernels();
  for (Backend backend : FastBackends()) {
    for (int tokens : {1, 3, 37, 70}) {
      const Routing r = Route(tokens, rng);
      const auto x = RandomX(tokens, kHidden, rng);
      std::vector<Q8ExpertBlock> gu, dn;
      for (const ExpertGroup& g : r.groups) {
        gu.push_back(layer.Block(g.expert, 0));
        dn.push_back(layer.Block(g.expert, 1));
      }
      // Reference: each expert's rows quantized on their own, block by block.
      std::vector<float> want(static_cast<size_t>(tokens) * kHidden, 0.25f);
      engine::ExpertWorkspace ref_ws;
      Q8ActsScratch acts;
      ASSERT_TRUE(engine::RunExpertsByBlock(
                      MakeCall(r, x, tokens, &want, &ref_ws, nullptr), k,
                      [&](int expert, ExpertProj proj, const float* in, size_t ldx, size_t n, float* y, size_t ldy) {
                        const Q8ExpertBlock b = layer.Block(expert, proj == ExpertProj::kGateUp ? 0 : 1);
                        return ApplyQ8Block(backend, b.view, b.bits, b.lut, in, ldx, n, y, ldy, nullptr, &acts);
                      })
                      .ok());
      for (int threads : {1, 2, 3}) {
        cpu::ThreadPool pool(threads);
        std::vector<float> got(static_cast<size_t>(tokens) * kHidden, 0.25f);
        engine::ExpertWorkspace ws;
        Status s = RunQ8Experts(backend, MakeCall(r, x, tokens, &got, &ws, &pool), gu.data(), dn.data(), k);
        ASSERT_TRUE(s.ok()) << s.ToString();
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
            << BackendName(backend) << ", " << tokens << " tokens, " << threads << " threads";
        // Untouched tokens would still read 0.25: every token got its experts' sum.
        for (int t = 0; t < tokens; ++t) EXPECT_NE(got[static_cast<size_t>(t) * kHidden], 0.25f);
      }
    }
  }
}

TEST(ExpertLayer, Bf16LayerMatchesPerBlockLinear) {
  std::mt19937 rng(22);
  std::normal_distribution<float> d(0.f, 0.05f);
  std::vector<std::vector<uint16_t>> gate(kExperts), up(kExperts), down(kExperts);
  for (int e = 0; e < kExperts; ++e) {
    for (auto* m : {&gate[e], &up[e]}) {
      m->resize(static_cast<size_t>(kFfn) * kHidden);
      for (auto& v : *m) v = cpu::ToBf16Bits(d(rng));
    }
    down[e].resize(static_cast<size_t>(kHidden) * kFfn);
    for (auto& v : down[e]) v = cpu::ToBf16Bits(d(rng));
  }
  const kernels::DenseKernels& k = cpu::Kernels();
  for (int tokens : {1, 3, 37, 70}) {
    const Routing r = Route(tokens, rng);
    const auto x = RandomX(tokens, kHidden, rng);
    std::vector<engine::Bf16Expert> experts;
    for (const ExpertGroup& g : r.groups) experts.push_back({gate[g.expert].data(), up[g.expert].data(), down[g.expert].data()});
    cpu::ThreadPool ref_pool(2);
    std::vector<float> want(static_cast<size_t>(tokens) * kHidden, -1.f);
    engine::ExpertWorkspace ref_ws;
    ASSERT_TRUE(engine::RunExpertsByBlock(
                    MakeCall(r, x, tokens, &want, &ref_ws, &ref_pool), k,
                    [&](int e, ExpertProj proj, const float* in, size_t ldx, size_t n, float* y, size_t ldy) {
                      if (proj == ExpertProj::kGateUp) {
                        engine::Linear(&ref_pool, k, in, ldx, n, gate[e].data(), kFfn, kHidden, y, ldy);
                        engine::Linear(&ref_pool, k, in, ldx, n, up[e].data(), kFfn, kHidden, y + kFfn, ldy);
                      } else {
                        engine::Linear(&ref_pool, k, in, ldx, n, down[e].data(), kHidden, kFfn, y, ldy);
                      }
                      return Status::Ok();
                    })
                    .ok());
    for (int threads : {1, 2, 3}) {
      cpu::ThreadPool pool(threads);
      std::vector<float> got(static_cast<size_t>(tokens) * kHidden, -1.f);
      engine::ExpertWorkspace ws;
      ASSERT_TRUE(engine::RunBf16Experts(MakeCall(r, x, tokens, &got, &ws, &pool), experts.data(), k).ok());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << tokens << " tokens, " << threads << " threads";
    }
  }
}

TEST(ExpertLayer, NonFiniteActivationsAreAnErrorNamingTheLayer) {
  std::mt19937 rng(23);
  const Q8Layer layer(rng);
  const Routing r = Route(3, rng);
  auto x = RandomX(3, kHidden, rng);
  x[kHidden + 7] = std::nanf("");
  std::vector<Q8ExpertBlock> gu, dn;
  for (const ExpertGroup& g : r.groups) {
    gu.push_back(layer.Block(g.expert, 0));
    dn.push_back(layer.Block(g.expert, 1));
  }
  std::vector<float> out(3 * kHidden, 0.f);
  engine::ExpertWorkspace ws;
  Status s = RunQ8Experts(BestQ8Backend(), MakeCall(r, x, 3, &out, &ws, nullptr), gu.data(), dn.data(), cpu::Kernels());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer 3"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("non-finite"), std::string::npos) << s.ToString();
}

TEST(ExpertLayer, SwiGluIsTheKernelTablesSiluMul) {
  const kernels::DenseKernels& k = cpu::Kernels();
  auto op = engine::ExpertActivationOp(engine::ExpertActivation::kSwiGlu, k);
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  EXPECT_EQ(*op, k.silu_mul);
}

TEST(ExpertLayer, AnActivationWithoutACpuOpIsRefusedByEveryRunner) {
  std::mt19937 rng(24);
  const Q8Layer layer(rng);
  const Routing r = Route(3, rng);
  const auto x = RandomX(3, kHidden, rng);
  std::vector<Q8ExpertBlock> gu, dn;
  std::vector<uint16_t> zeros(static_cast<size_t>(2 * kFfn) * kHidden, 0);
  std::vector<engine::Bf16Expert> bf16;
  for (const ExpertGroup& g : r.groups) {
    gu.push_back(layer.Block(g.expert, 0));
    dn.push_back(layer.Block(g.expert, 1));
    bf16.push_back({zeros.data(), zeros.data(), zeros.data()});
  }
  const auto unknown = static_cast<engine::ExpertActivation>(9);
  auto expect_refused = [&](const Status& s, const std::vector<float>& out, const char* runner) {
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << runner << ": " << s.ToString();
    EXPECT_NE(s.message().find("kind 9"), std::string::npos) << runner << ": " << s.ToString();
    for (float v : out) ASSERT_EQ(v, 0.5f) << runner << " wrote into out";
  };
  engine::ExpertWorkspace ws;
  std::vector<float> out(3 * kHidden, 0.5f);
  ExpertLayerCall call = MakeCall(r, x, 3, &out, &ws, nullptr);
  call.activation = unknown;
  expect_refused(RunQ8Experts(BestQ8Backend(), call, gu.data(), dn.data(), cpu::Kernels()), out,
                 "q8");
  expect_refused(engine::RunBf16Experts(call, bf16.data(), cpu::Kernels()), out, "bf16");
  int blocks = 0;
  expect_refused(
      engine::RunExpertsByBlock(call, cpu::Kernels(),
                                [&](int, ExpertProj, const float*, size_t, size_t, float*, size_t) {
                                  ++blocks;
                                  return Status::Ok();
                                }),
      out, "by block");
  EXPECT_EQ(blocks, 0);
}

TEST(ExpertTiles, EveryTileOnceInContiguousRunsOfAboutEqualCost) {
  std::vector<engine::ExpertTile> tiles;
  // Uneven experts: 1, 30, 2 and 64 tokens; a gate_up block of 2 * 100 rows split at 100.
  int32_t row = 0, g = 0;
  for (int32_t n : {1, 30, 2, 64}) {
    engine::AppendExpertTiles(g++, row, n, 200, 100, &tiles);
    row += n;
  }
  for (const auto& t : tiles) {
    EXPECT_LE(t.r1 - t.r0, engine::kExpertTileRows);
    EXPECT_TRUE(t.r1 <= 100 || t.r0 >= 100) << "a tile crosses the split";
  }
  ASSERT_EQ(tiles.size(), 4u * 4u);  // [0,64) [64,100) [100,164) [164,200) per expert
  // Runs of about equal cost: within one tile of an equal share, for any number of runs.
  uint64_t total = 0, most_tile = 0;
  for (const auto& t : tiles) {
    const uint64_t c = static_cast<uint64_t>(t.r1 - t.r0) * t.tokens;
    total += c;
    most_tile = std::max(most_tile, c);
  }
  for (int pieces : {1, 2, 3, 7, 16}) {
    size_t cut[17];
    engine::CutExpertTiles(tiles, pieces, cut);
    EXPECT_EQ(cut[0], 0u);
    EXPECT_EQ(cut[pieces], tiles.size());
    for (int p = 0; p < pieces; ++p) {
      ASSERT_LE(cut[p], cut[p + 1]) << pieces << " runs";
      uint64_t c = 0;
      for (size_t i = cut[p]; i < cut[p + 1]; ++i) c += static_cast<uint64_t>(tiles[i].r1 - tiles[i].r0) * tiles[i].tokens;
      EXPECT_LE(std::llabs(static_cast<long long>(pieces * c) - static_cast<long long>(total)),
                static_cast<long long>(pieces * most_tile))
          << pieces << " runs, run " << p;
    }
  }
  cpu::ThreadPool pool(3);
  std::mutex mu;
  std::vector<size_t> ran;
  ASSERT_TRUE(engine::RunExpertTiles(&pool, tiles, 4096, 0, [&](const engine::ExpertTile& t) {
                std::lock_guard<std::mutex> l(mu);
                ran.push_back(static_cast<size_t>(&t - tiles.data()));
                return Status::Ok();
              }).ok());
  ASSERT_EQ(ran.size(), tiles.size());
  std::sort(ran.begin(), ran.end());
  for (size_t i = 0; i < ran.size(); ++i) EXPECT_EQ(ran[i], i);
  // A failing tile's error comes back; small work runs inline.
  Status s = engine::RunExpertTiles(&pool, tiles, 1, 1u << 30, [&](const engine::ExpertTile& t) {
    return t.group == 2 ? Internal("tile of group 2") : Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kInternal);
}

TEST(ExpertTiles, CoalescedCallsCoverEveryRowOnceAndNeverCrossTheSplit) {
  std::vector<engine::ExpertTile> tiles;
  int32_t row = 0, g = 0;
  for (int32_t n : {1, 30, 2, 64}) {
    engine::AppendExpertTiles(g++, row, n, 200, 100, &tiles);
    row += n;
  }
  auto run = [&](cpu::ThreadPool* pool, size_t min_macs) {
    std::mutex mu;
    std::vector<engine::ExpertTile> calls;
    EXPECT_TRUE(engine::RunExpertTiles(pool, tiles, 4096, min_macs, [&](const engine::ExpertTile& t) {
                  std::lock_guard<std::mutex> l(mu);
                  calls.push_back(t);
                  return Status::Ok();
                }, engine::TileCalls::kCoalesce).ok());
    // Every (group, block row) once; each call one part of one group's block.
    std::vector<int> seen(4 * 200, 0);
    for (const auto& t : calls) {
      EXPECT_TRUE(t.r1 <= 100 || t.r0 >= 100) << "a call crosses the split";
      EXPECT_EQ(t.part, t.r0 >= 100 ? 1 : 0);
      EXPECT_LT(t.r0, t.r1);
      for (int32_t r = t.r0; r < t.r1; ++r) ++seen[static_cast<size_t>(t.group) * 200 + r];
    }
    for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "group " << i / 200 << " row " << i % 200;
    return calls;
  };
  // Inline (one thread): each group's two parts as one call each.
  const auto inline_calls = run(nullptr, 0);
  ASSERT_EQ(inline_calls.size(), 8u);
  for (const auto& t : inline_calls) EXPECT_EQ(t.r1 - t.r0, 100);
  // On 3 threads: at most one extra call per cut between runs (kChunksPerThread runs per thread).
  cpu::ThreadPool pool(3);
  const auto pooled = run(&pool, 0);
  const size_t runs = std::min<size_t>(cpu::ThreadPool::kChunksPerThread * 3, tiles.size());
  EXPECT_GE(pooled.size(), 8u);
  EXPECT_LE(pooled.size(), 8u + (runs - 1));
}

}  // namespace
}  // namespace pw::anyprec
