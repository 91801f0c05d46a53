// PagedResidency on the real page pool and weight page table, reading a small .apw store
// (random planes at the qwen3_moe fixture's shapes: 2 layers, 8 experts, top-2) from a
// broker-side ServedStore over real UCX in one process. The miss policy runs through its
// routing hook exactly as inside the engine (tokens decided one by one, events to the fetcher).
// Checks that
//   - a fetch during a step lands both blocks of the expert in pool pages at the plan width,
//     committed before the step goes on; an eviction leaves the blocks readable until the
//     boundary, which drops them to 0 and returns their pages;
//   - a background admission commits through the page table's raise path and only then
//     becomes resident for the policy (its victim dropped at the same boundary);
//   - with no pages above the KV reserve (or a pool too small) a fetch leaves the block at 0
//     for the provider's scratch path and says so;
//   - plan widths apply to resident experts only; bad widths are refused;
//   - the table agrees with the policy (Check) at every boundary, and the pool balances.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "common/formats/apw_store.h"
#include "common/formats/model_config.h"
#include "memory/page_pool.h"
#include "policies/misses/miss_options.h"
#include "services/broker/served_store.h"
#include "services/workers/weights/paged_residency.h"
#include "services/workers/weights/paged_weights.h"
#include "tests/anyprec/random_store.h"

namespace pw::workers {
namespace {

constexpr uint64_t kHash = 0x5eed1111ull;
constexpr int kE = 8;

class PagedResidencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cfg = LoadModelConfig(std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/" + Fixture() + "/config.json");
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    config_ = *cfg;
    path_ = std::string(PW_BINARY_DIR) + "/test-tmp/paged_residency_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".apw";
    std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
    WriteStore();
    ASSERT_FALSE(HasFatalFailure());
    ctx_ = transport::ucx::Context::Create().value();
    broker_ = transport::ucx::Worker::Create(*ctx_).value();
    client_ = transport::ucx::Worker::Create(*ctx_).value();
    broker_->StartProgressThread();
    client_->StartProgressThread();
    auto served = broker::ServedStore::Open(path_, kHash, *ctx_);
    ASSERT_TRUE(served.ok()) << served.status().ToString();
    served_ = std::move(served).value();
  }
  // The fixture model whose shapes the store has.
  virtual std::string Fixture() const { return "qwen3_moe"; }

  void TearDown() override {
    residency_.reset();
    weights_.reset();
    served_.reset();
    client_.reset();
    broker_.reset();
    ctx_.reset();
    std::filesystem::remove(path_);
  }

  void WriteStore() {
    apw::StoreInfo info;
    info.num_layers = static_cast<uint32_t>(config_.num_layers);
    info.num_experts = static_cast<uint32_t>(config_.num_experts);
    info.hidden = static_cast<uint32_t>(config_.hidden_size);
    info.ffn = static_cast<uint32_t>(config_.moe_intermediate_size);
    info.model_hash = kHash;
    for (int64_t l = 0; l < config_.num_layers; ++l) {
      if (config_.IsMoeLayer(l)) info.layers.push_back(static_cast<uint32_t>(l));
    }
    if (info.layers.size() == info.num_layers) info.layers.clear();  // every layer MoE
    anyprec::WriteRandomStore(path_, info, 13, &blocks_);
  }

  // Paged weights over a pool of `pages` pages (nothing resident) and a residency budget;
  // `edit` may spoil the manifest.
  void Start(int pages, const std::string& yaml, int initial_bits = 4,
             const std::function<void(wire::WeightManifest::Builder)>& edit = nullptr,
             PagedWeightsOptions options = {}) {
    pool_ = memory::PagePool::Create(1024, pages).value();
    auto wm = msg_.body().initWeightManifest();
    served_->FillManifest(wm, broker_->Address(), static_cast<uint8_t>(initial_bits));
    if (edit) edit(wm);
    auto w = PagedWeights::Create(pool_.get(), config_, *client_, wm.asReader(), options);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    weights_ = std::move(w).value();
    auto s = misses::ParseMissSettingsYaml(yaml, "test");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto r = PagedResidency::Create(*s, config_, weights_.get(), pool_.get(), initial_bits);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    residency_ = std::move(r).value();
    residency_->Install(nullptr, &hooks_);
    ASSERT_EQ(hooks_.fetcher, residency_.get());
    ASSERT_NE(hooks_.routing_hook, nullptr);
  }

  // The committed planes of block i, read back from its pages, equal the store's (and its LUT
  // scales are set).
  void ExpectPagesHoldTheStore(size_t i) {
    const auto& t = weights_->table();
    const auto& e = t.entry(i);
    ASSERT_GT(e.committed, 0);
    const anyprec::PackedBlock& want = blocks_[i].block;
    const size_t row = anyprec::PlaneRowBytes(e.cols);
    const int tile = t.PlaneTileRows(e.cols);
    for (int p = 0; p < e.committed; ++p) {
      std::vector<uint8_t> got;
      for (size_t k = 0; k < e.planes[p].addrs.size(); ++k) {
        const int n = std::min(tile, e.rows - static_cast<int>(k) * tile);
        got.insert(got.end(), e.planes[p].addrs[k], e.planes[p].addrs[k] + static_cast<size_t>(n) * row);
      }
      ASSERT_EQ(got.size(), anyprec::PlaneBytes(e.rows, e.cols));
      EXPECT_EQ(0, std::memcmp(got.data(), want.Plane(p), got.size())) << "block " << i << " plane " << p;
    }
    ASSERT_EQ(e.lut_scales.size(), static_cast<size_t>(e.rows));
    for (float sc : e.lut_scales) ASSERT_GT(sc, 0.f);
  }

  // One token of `layer` selecting `experts` with `weights` (router probabilities: the given
  // weights, the rest spread by `rest`), decided inside a step as the engine does.
  std::vector<int32_t> Token(int layer, const std::vector<int32_t>& experts, const std::vector<float>& weights,
                             const std::vector<float>& rest = {}) {
    std::vector<float> probs(kE, 0.001f);
    for (size_t j = 0; j < rest.size(); ++j) probs[j] = rest[j];
    for (size_t j = 0; j < experts.size(); ++j) probs[static_cast<size_t>(experts[j])] = weights[j];
    std::vector<engine::ExpertAssignment> a;
    for (size_t j = 0; j < experts.size(); ++j) a.push_back({0, experts[j], weights[j], static_cast<int16_t>(j)});
    engine::RoutingContext ctx;
    ctx.layer = layer;
    ctx.num_tokens = 1;
    ctx.num_experts = kE;
    ctx.top_k = 2;
    ctx.router_probs = probs.data();
    ctx.residency = hooks_.residency;
    ctx.fetcher = hooks_.fetcher;
    weights_->BeginStep();
    Status st = hooks_.routing_hook->Rewrite(ctx, &a);
    weights_->EndStep();
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::vector<int32_t> out;
    for (const auto& x : a) out.push_back(x.expert);
    return out;
  }

  int Committed(int layer, int expert, ExpertProj p = ExpertProj::kGateUp) const {
    const auto& t = weights_->table();
    return t.entry(t.Index(layer, expert, p)).committed;
  }
  bool BothAt(int layer, int expert, int bits) const {
    return Committed(layer, expert, ExpertProj::kGateUp) == bits && Committed(layer, expert, ExpertProj::kDown) == bits;
  }
  void ExpectBalanced() {
    EXPECT_TRUE(pool_->Balanced());
    EXPECT_EQ(weights_->table().pages_held(), pool_->Count(memory::Tenant::kWeights));
    int want = 0;
    const auto& t = weights_->table();
    for (int i = 0; i < t.num_blocks(); ++i) want += t.PagesAt(static_cast<size_t>(i), t.entry(static_cast<size_t>(i)).committed);
    EXPECT_EQ(want, pool_->Count(memory::Tenant::kWeights));
  }
  // Boundaries until nothing is in flight.
  void Settle() {
    for (int k = 0; k < 20000; ++k) {
      (void)residency_->Boundary(0);
      if (weights_->in_flight() == 0 && weights_->pending() == 0) return;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  ModelConfig config_;
  std::string path_;
  std::vector<anyprec::RandomBlock> blocks_;  // ExpertBlockIndex order
  std::unique_ptr<transport::ucx::Context> ctx_;
  std::unique_ptr<transport::ucx::Worker> broker_, client_;
  std::unique_ptr<broker::ServedStore> served_;
  std::unique_ptr<memory::PagePool> pool_;
  std::unique_ptr<PagedWeights> weights_;
  std::unique_ptr<PagedResidency> residency_;
  engine::MoeHooks hooks_;
  proto::OutMessage msg_;
};

TEST_F(PagedResidencyTest, FetchesIntoPagesDuringTheStepAndEvictsAtTheBoundary) {
  Start(4000, "policy: fetch-every-miss\neviction: lru\nresidency: 0.25\n");
  ASSERT_EQ(residency_->capacity(), 2);
  EXPECT_EQ(pool_->Count(memory::Tenant::kWeights), 0);  // cold start: nothing resident
  ASSERT_TRUE(residency_->Check(true).ok());

  // Two misses: both fetched into pages, committed at the initial width within the step.
  EXPECT_EQ(Token(0, {0, 1}, {0.6f, 0.4f}), (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(BothAt(0, 0, 4) && BothAt(0, 1, 4));
  EXPECT_EQ(residency_->stats().fetches, 2u);
  EXPECT_EQ(residency_->stats().scratch_fetches, 0u);
  const auto& t = weights_->table();
  const int one_expert = t.PagesAt(t.Index(0, 0, ExpertProj::kGateUp), 4) + t.PagesAt(t.Index(0, 0, ExpertProj::kDown), 4);
  EXPECT_EQ(pool_->Count(memory::Tenant::kWeights), 2 * one_expert);
  EXPECT_GT(residency_->stats().fetch_bytes, 0u);
  const std::vector<double> took = residency_->TakeFetchSeconds();
  ASSERT_EQ(took.size(), 2u);
  // Where each fetch went: UCX gets, checks (checksums, LUTs), page table; within its time.
  const std::vector<FetchTimes> phases = residency_->TakeFetchPhases();
  ASSERT_EQ(phases.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_GT(phases[k].get_s, 0.0);
    EXPECT_GT(phases[k].check_s, 0.0);
    EXPECT_GE(phases[k].table_s, 0.0);
    EXPECT_LE(phases[k].get_s + phases[k].check_s + phases[k].table_s, took[k] + 1e-9);
  }
  EXPECT_TRUE(residency_->TakeStepWaits().empty());  // the step's wait is known at its boundary
  for (int e : {0, 1}) {
    for (auto p : {ExpertProj::kGateUp, ExpertProj::kDown}) ExpectPagesHoldTheStore(t.Index(0, e, p));
  }
  ASSERT_TRUE(residency_->Check(true).ok());
  EXPECT_TRUE(residency_->Boundary(0).empty());  // nothing to change
  const std::vector<double> waits = residency_->TakeStepWaits();
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_DOUBLE_EQ(waits[0], took[0] + took[1]);

  // Two more: 0 and 1 leave residency at once, but their pages stay until the boundary.
  EXPECT_EQ(Token(0, {2, 3}, {0.7f, 0.3f}), (std::vector<int32_t>{2, 3}));
  EXPECT_FALSE(residency_->policy().IsResident(0, 0));
  EXPECT_FALSE(residency_->policy().IsResident(0, 1));
  EXPECT_TRUE(BothAt(0, 0, 4) && BothAt(0, 1, 4) && BothAt(0, 2, 4) && BothAt(0, 3, 4));
  EXPECT_EQ(pool_->Count(memory::Tenant::kWeights), 4 * one_expert);
  EXPECT_FALSE(residency_->Check(false).ok());  // the table follows at the boundary
  auto changes = residency_->Boundary(0);
  EXPECT_EQ(changes.size(), 4u);  // 2 experts x 2 blocks lowered to 0
  for (const auto& c : changes) EXPECT_EQ(c.to, 0);
  EXPECT_TRUE(BothAt(0, 0, 0) && BothAt(0, 1, 0));
  EXPECT_EQ(pool_->Count(memory::Tenant::kWeights), 2 * one_expert);
  EXPECT_TRUE(residency_->Check(true).ok()) << residency_->Check(true).ToString();
  EXPECT_EQ(residency_->policy().stats().evictions, 2);
  EXPECT_EQ(residency_->resident_experts(), 2);
  ExpectBalanced();

  // A later token of the same step re-fetching an expert evicted earlier in it reuses its pages.
  Token(1, {5, 6}, {0.5f, 0.5f});
  Token(1, {4, 7}, {0.5f, 0.5f});  // evicts 5 and 6
  const uint64_t before = residency_->stats().fetches, bytes = residency_->stats().fetch_bytes;
  Token(1, {5, 6}, {0.5f, 0.5f});  // back, pages still there: no transfer
  EXPECT_EQ(residency_->stats().fetches, before + 2);
  EXPECT_EQ(residency_->stats().fetch_bytes, bytes);
  EXPECT_TRUE(BothAt(1, 5, 4) && BothAt(1, 6, 4));
  (void)residency_->Boundary(0);
  EXPECT_TRUE(BothAt(1, 4, 0) && BothAt(1, 7, 0) && BothAt(1, 5, 4));
  EXPECT_TRUE(residency_->Check(true).ok());
  ExpectBalanced();
}

TEST_F(PagedResidencyTest, AdmissionCommitsThroughTheRaisePathBeforeItIsResident) {
  // First choice fetched, the rest substituted; admission at beta 0.5.
  Start(4000, "policy: first-choice\neviction: lru\nadmission_beta: 0.5\nresidency: 0.25\n");
  Token(0, {0, 1}, {0.6f, 0.4f});  // 0 fetched; 1 has no substitute: fetched too
  ASSERT_TRUE(BothAt(0, 0, 4) && BothAt(0, 1, 4));
  Token(0, {1}, {1.f});  // 1 used last: 0 is the LRU victim
  // 2 fetched (evicts LRU 0), 3 substituted by 1: lost 0.45.
  EXPECT_EQ(Token(0, {2, 3}, {0.55f, 0.45f}), (std::vector<int32_t>{2, 1}));
  (void)residency_->Boundary(0);
  // Substituted again: lost 0.9 >= 0.5, admission of 3 starts.
  EXPECT_EQ(Token(0, {2, 3}, {0.5f, 0.5f}, {0, 0.3f}), (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(residency_->stats().admissions_started, 1u);
  EXPECT_FALSE(residency_->policy().IsResident(0, 3));
  EXPECT_TRUE(residency_->Check(false).ok());
  // The raise runs in the background; 3 is resident once both blocks committed.
  bool resident = false;
  for (int k = 0; k < 20000 && !resident; ++k) {
    (void)residency_->Boundary(0);
    resident = residency_->policy().IsResident(0, 3);
    if (!resident) {
      EXPECT_EQ(Committed(0, 3, ExpertProj::kGateUp) > 0 && Committed(0, 3, ExpertProj::kDown) > 0 &&
                    weights_->table().entry(weights_->table().Index(0, 3, ExpertProj::kGateUp)).target < 0 &&
                    weights_->table().entry(weights_->table().Index(0, 3, ExpertProj::kDown)).target < 0,
                false);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  ASSERT_TRUE(resident);
  EXPECT_TRUE(BothAt(0, 3, 4));
  EXPECT_EQ(residency_->stats().admissions_committed, 1u);
  EXPECT_EQ(residency_->policy().stats().admissions, 1);
  Settle();
  EXPECT_EQ(residency_->resident_experts(), 2);  // the victim left
  EXPECT_TRUE(residency_->Check(true).ok()) << residency_->Check(true).ToString();
  ExpectBalanced();
  // Now a hit.
  const int64_t hits = residency_->policy().stats().hits;
  EXPECT_EQ(Token(0, {3}, {1.f}), (std::vector<int32_t>{3}));
  EXPECT_EQ(residency_->policy().stats().hits, hits + 1);
}

TEST_F(PagedResidencyTest, WithoutPagesAboveTheReserveAFetchIsLeftToScratch) {
  Start(4000, "policy: fetch-every-miss\nresidency: 0.5\n");
  // A boundary that keeps every page for KV: the next fetch may take none.
  (void)residency_->Boundary(pool_->num_pages());
  Token(0, {0, 1}, {0.5f, 0.5f});
  EXPECT_EQ(residency_->stats().fetches, 0u);
  EXPECT_EQ(residency_->stats().scratch_fetches, 2u);
  EXPECT_TRUE(BothAt(0, 0, 0));
  // Desired at the plan width: the provider reads it from scratch at that width.
  const auto& t = weights_->table();
  EXPECT_EQ(t.entry(t.Index(0, 0, ExpertProj::kGateUp)).desired, 4);
  EXPECT_TRUE(residency_->Check(false).ok());
  EXPECT_FALSE(residency_->Check(true).ok());
  // Pages allowed again: the boundary raises what the policy holds.
  Settle();
  EXPECT_TRUE(BothAt(0, 0, 4) && BothAt(0, 1, 4));
  EXPECT_TRUE(residency_->Check(true).ok());
  ExpectBalanced();
}

TEST_F(PagedResidencyTest, APoolTooSmallLeavesFetchesToScratch) {
  Start(3, "policy: fetch-every-miss\nresidency: 0.25\n");
  Token(1, {2, 3}, {0.5f, 0.5f});
  EXPECT_EQ(residency_->stats().scratch_fetches, 2u);
  EXPECT_EQ(pool_->Count(memory::Tenant::kWeights), 0);
  EXPECT_TRUE(residency_->Check(false).ok());
  ExpectBalanced();
}

TEST_F(PagedResidencyTest, PlanWidthsApplyToResidentExpertsOnly) {
  Start(4000, "policy: fetch-every-miss\nresidency: 0.25\n");
  Token(0, {0, 1}, {0.5f, 0.5f});
  const auto& t = weights_->table();
  std::vector<std::pair<size_t, int>> plan;
  for (int e = 0; e < kE; ++e) {
    plan.emplace_back(t.Index(0, e, ExpertProj::kGateUp), 6);
    plan.emplace_back(t.Index(0, e, ExpertProj::kDown), 3);
  }
  ASSERT_TRUE(residency_->SetPlanWidths(plan).ok());
  Settle();
  EXPECT_EQ(Committed(0, 0, ExpertProj::kGateUp), 6);
  EXPECT_EQ(Committed(0, 0, ExpertProj::kDown), 3);
  EXPECT_TRUE(BothAt(0, 5, 0));
  Token(0, {5}, {1.f});  // fetched at the new plan widths
  EXPECT_EQ(Committed(0, 5, ExpertProj::kGateUp), 6);
  EXPECT_EQ(Committed(0, 5, ExpertProj::kDown), 3);
  EXPECT_FALSE(residency_->SetPlanWidths({{t.Index(0, 0, ExpertProj::kGateUp), 2}}).ok());
  EXPECT_FALSE(residency_->SetPlanWidths({{99999, 4}}).ok());
  EXPECT_EQ(Committed(0, 0, ExpertProj::kGateUp), 6);  // refused: nothing changed
  Settle();
  EXPECT_TRUE(residency_->Check(true).ok()) << residency_->Check(true).ToString();
  ExpectBalanced();
}

TEST_F(PagedResidencyTest, RandomTokensKeepTheTableFollowingThePolicy) {
  Start(4000, "policy: quality-first\nresidency: 0.5\n");
  std::mt19937 rng(21);
  for (int it = 0; it < 300; ++it) {
    const int layer = static_cast<int>(rng() % 2);
    const int32_t a = static_cast<int32_t>(rng() % kE);
    int32_t b = static_cast<int32_t>(rng() % (kE - 1));
    if (b >= a) ++b;
    const float w = 0.5f + static_cast<float>(rng() % 50) / 100.f;
    std::vector<float> rest(kE);
    for (float& r : rest) r = static_cast<float>(rng() % 100) / 1000.f;
    Token(layer, {a, b}, {w, 1.f - w}, rest);
    (void)residency_->Boundary(0);
    ASSERT_TRUE(residency_->Check(false).ok()) << it << ": " << residency_->Check(false).ToString();
    for (int l = 0; l < 2; ++l) ASSERT_LE(residency_->policy().cache().ResidentCount(l), 4);
  }
  Settle();
  EXPECT_TRUE(residency_->Check(true).ok()) << residency_->Check(true).ToString();
  EXPECT_GT(residency_->policy().stats().substitutions, 0);
  EXPECT_GT(residency_->stats().fetches, 0u);
  ExpectBalanced();
}

TEST_F(PagedResidencyTest, AFetchWhoseChecksumFailsFailsTheStepAndHoldsNoPage) {
  // Plane 2 of block (layer 0, expert 3, gate_up) carries a wrong checksum.
  Start(4000, "policy: fetch-every-miss\nresidency: 0.25\n", 4, [](wire::WeightManifest::Builder m) {
    for (auto p : m.getParts()) {
      if (p.getLayer() == 0 && p.getExpert() == 3 && p.getKind() == wire::WeightKind::GATE_UP && p.getPlane() == 2) {
        p.setChecksum(p.getChecksum() ^ 1);
      }
    }
  });
  std::vector<float> probs(kE, 0.01f);
  std::vector<engine::ExpertAssignment> a = {{0, 3, 0.5f, 0}, {0, 4, 0.5f, 1}};
  engine::RoutingContext ctx;
  ctx.layer = 0;
  ctx.num_tokens = 1;
  ctx.num_experts = kE;
  ctx.top_k = 2;
  ctx.router_probs = probs.data();
  ctx.residency = hooks_.residency;
  ctx.fetcher = hooks_.fetcher;
  weights_->BeginStep();
  Status st = hooks_.routing_hook->Rewrite(ctx, &a);
  weights_->EndStep();
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
  EXPECT_NE(st.message().find("checksum"), std::string::npos) << st.ToString();
  EXPECT_TRUE(BothAt(0, 3, 0));
  EXPECT_EQ(pool_->Count(memory::Tenant::kWeights), 0);
  ExpectBalanced();
}

TEST_F(PagedResidencyTest, RefusesBadSettings) {
  pool_ = memory::PagePool::Create(1024, 100).value();
  auto wm = msg_.body().initWeightManifest();
  served_->FillManifest(wm, broker_->Address(), 4);
  weights_ = PagedWeights::Create(pool_.get(), config_, *client_, wm.asReader(), {}).value();
  misses::MissSettings none;
  EXPECT_FALSE(PagedResidency::Enabled(none));
  EXPECT_EQ(PagedResidency::Create(none, config_, weights_.get(), pool_.get(), 4).status().code(),
            StatusCode::kInvalidArgument);
  misses::MissSettings s;
  s.residency = 0.1;  // 1 of 8 experts per layer, below top-2
  EXPECT_FALSE(PagedResidency::Create(s, config_, weights_.get(), pool_.get(), 4).ok());
  s.residency = 0.5;
  s.policy = "no-such-policy";
  EXPECT_FALSE(PagedResidency::Create(s, config_, weights_.get(), pool_.get(), 4).ok());
  s.policy = "rule-0.15";
  EXPECT_FALSE(PagedResidency::Create(s, config_, weights_.get(), pool_.get(), 2).ok());
  EXPECT_TRUE(PagedResidency::Create(s, config_, weights_.get(), pool_.get(), 4).ok());
}

// MoverPacing::kSteps: an admission's transfers do not run while a step is under way (the
// mover waits before its next get), and finish after it; kFree lets them run through it.
TEST_F(PagedResidencyTest, UnderStepPacingAdmissionsMoveBetweenSteps) {
  for (MoverPacing pacing : {MoverPacing::kSteps, MoverPacing::kFree}) {
    SCOPED_TRACE(MoverPacingName(pacing));
    PagedWeightsOptions o;
    o.pacing = pacing;
    // As in AdmissionCommitsThroughTheRaisePathBeforeItIsResident: 3's admission starts.
    Start(4000, "policy: first-choice\neviction: lru\nadmission_beta: 0.5\nresidency: 0.25\n", 8, nullptr, o);
    Token(0, {0, 1}, {0.6f, 0.4f});
    Token(0, {1}, {1.f});
    Token(0, {2, 3}, {0.55f, 0.45f});
    (void)residency_->Boundary(0);
    Token(0, {2, 3}, {0.5f, 0.5f}, {0, 0.3f});
    ASSERT_EQ(residency_->stats().admissions_started, 1u);
    (void)residency_->Boundary(0);  // both blocks' raises start (0 -> 8 bits: 8 planes, a LUT)
    ASSERT_EQ(weights_->in_flight(), 2);
    weights_->BeginStep();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    weights_->EndStep();
    if (pacing == MoverPacing::kSteps) {
      EXPECT_GE(weights_->pacing().waits, 1u);
      EXPECT_GE(weights_->pacing().wait_us, 1000u);
    } else {
      EXPECT_EQ(weights_->pacing().waits, 0u);
    }
    Settle();
    EXPECT_EQ(weights_->stats().transitions_failed, 0u);
    EXPECT_TRUE(residency_->policy().IsResident(0, 3));
    EXPECT_TRUE(BothAt(0, 3, 8));
    ExpectPagesHoldTheStore(weights_->table().Index(0, 3, ExpertProj::kGateUp));
    ASSERT_TRUE(residency_->Check(true).ok()) << residency_->Check(true).ToString();
    ExpectBalanced();
    residency_.reset();
    weights_.reset();
  }
}

}  // namespace
}  // namespace pw::workers

namespace pw::workers {
namespace {

// glm4_moe (tests/fixtures/models/glm4_moe: a dense first layer, then 2 MoE layers of 16
// experts, top-4): the budget is over the MoE layers only. A byte budget of 4 experts in each
// of the 2 MoE layers gives capacity 4 (counting the dense layer it gave 2, below top-4, and
// the worker refused it); a fetch in an MoE layer lands in pages; the dense layer's blocks are
// never asked for.
class PagedResidencyDenseLayerTest : public PagedResidencyTest {
 protected:
  std::string Fixture() const override { return "glm4_moe"; }
};

TEST_F(PagedResidencyDenseLayerTest, BudgetsTheMoeLayersOnly) {
  ASSERT_FALSE(config_.IsMoeLayer(0));
  ASSERT_EQ(config_.num_layers, 3);
  ASSERT_EQ(config_.num_experts, 16);
  const double expert_bytes = 3.0 * config_.hidden_size * config_.moe_intermediate_size * 2.0;
  const auto bytes = static_cast<long long>(2 * 4 * expert_bytes);
  Start(4000, "policy: fetch-every-miss\neviction: lru\nresidency_bytes: " + std::to_string(bytes) + "\n");
  EXPECT_EQ(residency_->capacity(), 4);
  EXPECT_EQ(residency_->num_moe_layers(), 2);
  ASSERT_TRUE(residency_->Check(true).ok());

  std::vector<float> probs(16, 0.01f);
  probs[3] = 0.5f;
  probs[5] = 0.3f;
  probs[7] = 0.1f;
  probs[9] = 0.05f;
  std::vector<engine::ExpertAssignment> a = {{0, 3, 0.5f, 0}, {0, 5, 0.3f, 1}, {0, 7, 0.1f, 2}, {0, 9, 0.05f, 3}};
  engine::RoutingContext ctx;
  ctx.layer = 1;
  ctx.num_tokens = 1;
  ctx.num_experts = 16;
  ctx.top_k = 4;
  ctx.router_probs = probs.data();
  ctx.residency = hooks_.residency;
  ctx.fetcher = hooks_.fetcher;
  weights_->BeginStep();
  const Status st = hooks_.routing_hook->Rewrite(ctx, &a);
  weights_->EndStep();
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (int e : {3, 5, 7, 9}) EXPECT_TRUE(BothAt(1, e, 4)) << "expert " << e;
  EXPECT_EQ(residency_->stats().fetches, 4u);
  Settle();
  ASSERT_TRUE(residency_->Check(true).ok());
  for (int e = 0; e < 16; ++e) EXPECT_EQ(residency_->policy().cache().IsResident(0, e), false);
  ExpectBalanced();
}

}  // namespace
}  // namespace pw::workers
