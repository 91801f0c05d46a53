// PagedWeights in one process over real UCX: a broker-side ServedStore maps a small .apw store
// (random planes and LUTs at the shapes of the qwen3_moe fixture) and registers it; a second
// UCX worker reads it through PagedWeights (page table + plane mover) into a PagePool. Checks:
//   - every layer run from its pages (one provider call) gives the same bits as the fast-path
//     kernel block by block over the store's own memory, at the initial width and after random
//     raises and lowers;
//   - pool accounting balances to the page after every change;
//   - a part whose checksum fails on arrival leaves its block at its width, pages returned;
//   - a block that is not resident is fetched synchronously (and counted);
//   - manifests that do not match the model, and stores that are corrupt or made for another
//     model, are refused with errors naming the problem;
//   - the manifest's checksums are CRC-32C of the store's bytes; a protocol 1.0 broker's
//     manifest (FNV-1a 64, checksumKind unset) still loads, and an unknown kind is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "common/formats/apw_store.h"
#include "common/hash.h"
#include "common/formats/model_config.h"
#include "kernels/anyprec/q8.h"
#include "kernels/cpu/dense.h"
#include "memory/page_pool.h"
#include "services/broker/served_store.h"
#include "services/proto/part_checksum.h"
#include "engine/experts/expert_layer_call.h"
#include "engine/experts/expert_workspace.h"
#include "services/workers/weights/paged_weights.h"
#include "tests/anyprec/random_store.h"

namespace pw::workers {
namespace {

constexpr uint64_t kHash = 0x5eed5eedull;

class PagedWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cfg = LoadModelConfig(std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe/config.json");
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    config_ = *cfg;
    path_ = std::string(PW_BINARY_DIR) + "/test-tmp/paged_weights_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".apw";
    std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
    WriteStore(path_, kHash);
    ASSERT_FALSE(HasFatalFailure());
    ctx_ = transport::ucx::Context::Create().value();
    broker_ = transport::ucx::Worker::Create(*ctx_).value();
    client_ = transport::ucx::Worker::Create(*ctx_).value();
    broker_->StartProgressThread();
    client_->StartProgressThread();
    auto served = broker::ServedStore::Open(path_, kHash, *ctx_);
    ASSERT_TRUE(served.ok()) << served.status().ToString();
    served_ = std::move(served).value();
    pool_ = memory::PagePool::Create(1024, 4000).value();
  }
  void TearDown() override {
    weights_.reset();
    served_.reset();
    client_.reset();
    broker_.reset();
    ctx_.reset();
    std::filesystem::remove(path_);
  }

  void WriteStore(const std::string& path, uint64_t hash) {
    apw::StoreInfo info;
    info.num_layers = static_cast<uint32_t>(config_.num_layers);
    info.num_experts = static_cast<uint32_t>(config_.num_experts);
    info.hidden = static_cast<uint32_t>(config_.hidden_size);
    info.ffn = static_cast<uint32_t>(config_.moe_intermediate_size);
    info.model_hash = hash;
    anyprec::WriteRandomStore(path, info, 11, &blocks_);
  }

  // A manifest as the broker sends it; `edit` may spoil it.
  Result<std::unique_ptr<PagedWeights>> Create(
      const std::function<void(wire::WeightManifest::Builder)>& edit = nullptr) {
    auto wm = msg_.body().initWeightManifest();
    served_->FillManifest(wm, broker_->Address(), 4);
    if (edit) edit(wm);
    return PagedWeights::Create(pool_.get(), config_, *client_, wm.asReader(), {});
  }

  // The fast-path product of block i at `bits` over the block's own memory.
  std::vector<float> Reference(size_t i, int bits, const std::vector<float>& x, int tokens) {
    const anyprec::PackedBlock& b = blocks_[i].block;
    anyprec::PageLists pages = b.Pages(b.rows);
    std::vector<int8_t> values(anyprec::Q8LutValueBytes(b.rows, bits));
    std::vector<float> scales(static_cast<size_t>(b.rows));
    EXPECT_TRUE(anyprec::QuantizeLut(b.luts[bits].data(), b.rows, bits, values.data(), scales.data()).ok());
    anyprec::Q8Lut lut{values.data(), scales.data()};
    std::vector<float> y(static_cast<size_t>(tokens) * b.rows);
    anyprec::Q8ActsScratch acts;
    EXPECT_TRUE(anyprec::ApplyQ8Block(anyprec::BestQ8Backend(), pages.view(), bits, lut, x.data(),
                                      static_cast<size_t>(b.cols), static_cast<size_t>(tokens), y.data(),
                                      static_cast<size_t>(b.rows), nullptr, &acts).ok());
    return y;
  }

  // One layer call through the provider: every expert in `experts` computes all `tokens` rows
  // of x [tokens, H], expert g's output weighted 1 / (g + 1).
  std::vector<float> RunLayer(PagedWeights& w, int layer, const std::vector<int>& experts,
                              const std::vector<float>& x, int tokens) {
    std::vector<engine::ExpertGroup> groups;
    std::vector<engine::ExpertRow> rows;
    for (size_t g = 0; g < experts.size(); ++g) {
      groups.push_back({experts[g], static_cast<int32_t>(rows.size()), static_cast<int32_t>(rows.size()) + tokens});
      for (int t = 0; t < tokens; ++t) rows.push_back({t, 1.f / static_cast<float>(g + 1)});
    }
    const size_t H = static_cast<size_t>(config_.hidden_size);
    std::vector<float> out(static_cast<size_t>(tokens) * H, 0.f);
    engine::ExpertWorkspace ws;
    engine::ExpertLayerCall call;
    call.layer = layer;
    call.num_tokens = static_cast<size_t>(tokens);
    call.hidden = H;
    call.ffn = static_cast<size_t>(config_.moe_intermediate_size);
    call.x = x.data();
    call.groups = groups;
    call.rows = rows;
    call.out = out.data();
    call.workspace = &ws;
    EXPECT_TRUE(w.provider()->RunExperts(call).ok());
    return out;
  }

  // The same layer from Reference block by block, block i at bits_of(i).
  std::vector<float> ReferenceLayer(const memory::WeightPageTable& t, int layer, const std::vector<int>& experts,
                                    const std::function<int(size_t)>& bits_of, const std::vector<float>& x,
                                    int tokens) {
    const size_t H = static_cast<size_t>(config_.hidden_size), I = static_cast<size_t>(config_.moe_intermediate_size);
    const kernels::DenseKernels& k = cpu::Kernels();
    std::vector<float> out(static_cast<size_t>(tokens) * H, 0.f);
    for (size_t g = 0; g < experts.size(); ++g) {
      const size_t gu = t.Index(layer, experts[g], ExpertProj::kGateUp), dn = t.Index(layer, experts[g], ExpertProj::kDown);
      const auto y1 = Reference(gu, bits_of(gu), x, tokens);
      std::vector<float> act(static_cast<size_t>(tokens) * I);
      for (int r = 0; r < tokens; ++r) k.silu_mul(&y1[r * 2 * I], &y1[r * 2 * I + I], I, &act[r * I]);
      const auto y2 = Reference(dn, bits_of(dn), act, tokens);
      for (int r = 0; r < tokens; ++r) k.axpy(1.f / static_cast<float>(g + 1), &y2[r * H], H, &out[r * H]);
    }
    return out;
  }

  // Every layer through the provider (all its experts in one call) equals the reference at the
  // committed widths.
  void ExpectEveryBlockMatches(PagedWeights& w) {
    std::mt19937 rng(5);
    const auto& t = w.table();
    const int tokens = 3;
    for (int l = 0; l < t.num_layers(); ++l) {
      std::vector<int> experts;
      for (int e = 0; e < t.num_experts(); ++e) {
        experts.push_back(e);
        for (auto proj : {ExpertProj::kGateUp, ExpertProj::kDown}) {
          ASSERT_GT(t.entry(t.Index(l, e, proj)).committed, 0);
          EXPECT_EQ(w.provider()->Bits(l, e, proj), t.entry(t.Index(l, e, proj)).committed);
        }
      }
      auto x = anyprec::RandomX(tokens, static_cast<int>(config_.hidden_size), rng);
      const auto got = RunLayer(w, l, experts, x, tokens);
      const auto want = ReferenceLayer(t, l, experts, [&](size_t i) { return t.entry(i).committed; }, x, tokens);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "layer " << l;
    }
  }

  void ExpectBalanced(const PagedWeights& w) {
    EXPECT_TRUE(pool_->Balanced());
    EXPECT_EQ(w.table().pages_held(), pool_->Count(memory::Tenant::kWeights));
    int want = 0;
    for (int i = 0; i < w.table().num_blocks(); ++i) {
      want += w.table().PagesAt(static_cast<size_t>(i), w.table().entry(static_cast<size_t>(i)).committed);
    }
    EXPECT_EQ(want, pool_->Count(memory::Tenant::kWeights));
  }

  static void Settle(PagedWeights& w) {
    for (int k = 0; k < 20000 && (w.pending() > 0 || w.in_flight() > 0); ++k) {
      (void)w.Poll();
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
  proto::OutMessage msg_;
};

TEST_F(PagedWeightsTest, BlocksFromPagesEqualTheKernelOverTheStoreAtEveryWidth) {
  auto w = Create();
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  weights_ = std::move(w).value();
  ASSERT_TRUE(weights_->LoadAll(4, 30000).ok());
  ExpectEveryBlockMatches(*weights_);
  ExpectBalanced(*weights_);
  std::mt19937 rng(9);
  const int widths[] = {3, 4, 5, 6, 7, 8};
  for (int round = 0; round < 4; ++round) {
    std::vector<std::pair<size_t, int>> changes;
    for (int i = 0; i < weights_->table().num_blocks(); ++i) {
      if (rng() % 2) changes.emplace_back(static_cast<size_t>(i), widths[rng() % 6]);
    }
    ASSERT_TRUE(weights_->SetDesired(changes).ok());
    Settle(*weights_);
    ASSERT_EQ(weights_->pending(), 0);
    ExpectEveryBlockMatches(*weights_);
    ExpectBalanced(*weights_);
  }
  EXPECT_GT(weights_->stats().planes_raised, 0u);
  EXPECT_GT(weights_->stats().planes_lowered, 0u);
  EXPECT_EQ(weights_->stats().transitions_failed, 0u);
  // Everything dropped: no weight page left.
  std::vector<std::pair<size_t, int>> drop;
  for (int i = 0; i < weights_->table().num_blocks(); ++i) drop.emplace_back(static_cast<size_t>(i), 0);
  ASSERT_TRUE(weights_->SetDesired(drop).ok());
  Settle(*weights_);
  EXPECT_EQ(pool_->Count(memory::Tenant::kWeights), 0);
  EXPECT_TRUE(pool_->Balanced());
}

TEST_F(PagedWeightsTest, ALoweringStartsInsideTheKvReserveARaiseDoesNot) {
  auto w = Create();
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  weights_ = std::move(w).value();
  ASSERT_TRUE(weights_->LoadAll(6, 30000).ok());
  const size_t lo = weights_->table().Index(0, 1, ExpertProj::kGateUp);
  const size_t hi = weights_->table().Index(0, 2, ExpertProj::kGateUp);
  const int held = pool_->Count(memory::Tenant::kWeights);
  ASSERT_TRUE(weights_->SetDesired({{lo, 5}, {hi, 7}}).ok());
  // Every free page reserved for KV: the raise waits, the lowering (which frees pages at its
  // commit) goes on and commits.
  for (int k = 0; k < 20000 && weights_->table().entry(lo).committed != 5; ++k) {
    (void)weights_->Poll(pool_->num_free());
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(weights_->table().entry(lo).committed, 5);
  EXPECT_EQ(weights_->table().entry(hi).committed, 6);
  EXPECT_EQ(weights_->table().entry(hi).target, -1);  // not started
  EXPECT_LT(pool_->Count(memory::Tenant::kWeights), held);
  // Without the reserve the raise goes too.
  Settle(*weights_);
  EXPECT_EQ(weights_->table().entry(hi).committed, 7);
  ExpectEveryBlockMatches(*weights_);
  ExpectBalanced(*weights_);
}

TEST_F(PagedWeightsTest, ChecksumFailureOnArrivalLeavesTheBlockAsItWas) {
  // Plane 5 of block (layer 1, expert 2, down) carries a wrong checksum.
  auto w = Create([](wire::WeightManifest::Builder m) {
    for (auto p : m.getParts()) {
      if (p.getLayer() == 1 && p.getExpert() == 2 && p.getKind() == wire::WeightKind::DOWN && p.getPlane() == 5) {
        p.setChecksum(p.getChecksum() ^ 1);
      }
    }
  });
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  weights_ = std::move(w).value();
  ASSERT_TRUE(weights_->LoadAll(4, 30000).ok());  // planes 0..3 only: the bad plane is not read
  const size_t bad = weights_->table().Index(1, 2, ExpertProj::kDown);
  const int held = pool_->Count(memory::Tenant::kWeights);
  ASSERT_TRUE(weights_->SetDesired({{bad, 6}}).ok());
  for (int k = 0; k < 20000 && weights_->stats().transitions_failed == 0; ++k) {
    (void)weights_->Poll();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(weights_->stats().transitions_failed, 1u);
  // Still at 4 bits with its old pages, nothing else held, and still correct.
  EXPECT_EQ(weights_->table().entry(bad).committed, 4);
  EXPECT_EQ(weights_->table().entry(bad).target, -1);
  // (a failed block retries at the next boundaries; stop it before counting)
  ASSERT_TRUE(weights_->SetDesired({{bad, 4}}).ok());
  Settle(*weights_);
  EXPECT_EQ(pool_->Count(memory::Tenant::kWeights), held);
  ExpectEveryBlockMatches(*weights_);
  ExpectBalanced(*weights_);
}

TEST_F(PagedWeightsTest, ChecksumsAreCrc32cAndAnOldBrokersFnvManifestStillLoads) {
  auto store = apw::ApwStore::Open(path_).value();
  const uint8_t* base = store->map_data();
  {
    auto wm = msg_.body().initWeightManifest();
    served_->FillManifest(wm, broker_->Address(), 4);
    EXPECT_EQ(wm.getChecksumKind(), wire::ChecksumKind::CRC32C);
    for (auto p : wm.getParts()) {
      ASSERT_EQ(p.getChecksum(), Crc32c(base + p.getOffset(), p.getBytes()));
    }
  }
  // As a protocol 1.0 broker sent it: FNV-1a 64 checksums, checksumKind left at its default.
  auto old = Create([&](wire::WeightManifest::Builder m) {
    m.setChecksumKind(wire::ChecksumKind::FNV1A64);
    for (auto p : m.getParts()) p.setChecksum(Fnv1a64Of(base + p.getOffset(), p.getBytes()));
  });
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  weights_ = std::move(old).value();
  ASSERT_TRUE(weights_->LoadAll(5, 30000).ok());
  ExpectEveryBlockMatches(*weights_);
  EXPECT_EQ(weights_->stats().transitions_failed, 0u);
  weights_.reset();
  // A kind this build does not know.
  auto unknown = Create([](wire::WeightManifest::Builder m) {
    m.setChecksumKind(static_cast<wire::ChecksumKind>(7));
  });
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(unknown.status().message().find("unknown checksum kind 7"), std::string::npos)
      << unknown.status().ToString();
}

TEST_F(PagedWeightsTest, ANonResidentBlockIsFetchedSynchronously) {
  auto w = Create();
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  weights_ = std::move(w).value();
  ASSERT_TRUE(weights_->LoadAll(5, 30000).ok());
  const size_t i = weights_->table().Index(0, 7, ExpertProj::kGateUp);
  ASSERT_TRUE(weights_->SetDesired({{i, 0}}).ok());
  Settle(*weights_);
  ASSERT_EQ(weights_->table().entry(i).committed, 0);
  std::mt19937 rng(1);
  auto x = anyprec::RandomX(2, static_cast<int>(config_.hidden_size), rng);
  const auto got = RunLayer(*weights_, 0, {7}, x, 2);
  EXPECT_EQ(weights_->stats().sync_fetches, 1u);
  const auto& t = weights_->table();
  // desired 0: read at the lowest width; the expert's down block at its committed 5 bits.
  const auto want = ReferenceLayer(t, 0, {7}, [&](size_t b) { return b == i ? anyprec::kMinBits : t.entry(b).committed; }, x, 2);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  ExpectBalanced(*weights_);  // the fetch used scratch, not pool pages
}

TEST_F(PagedWeightsTest, ManifestsThatDoNotFitTheModelAreRefused) {
  auto twice = Create([](wire::WeightManifest::Builder m) {
    auto parts = m.getParts();
    parts.setWithCaveats(1, parts[0]);
  });
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("listed twice"), std::string::npos) << twice.status().ToString();
  auto size = Create([](wire::WeightManifest::Builder m) { m.getParts()[3].setBytes(m.getParts()[3].getBytes() + 1); });
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.status().message().find("bytes, this model needs"), std::string::npos) << size.status().ToString();
  auto outside = Create([](wire::WeightManifest::Builder m) { m.getParts()[2].setOffset(1ull << 40); });
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("outside the store region"), std::string::npos);
  auto layer = Create([](wire::WeightManifest::Builder m) { m.getParts()[0].setLayer(9); });
  ASSERT_FALSE(layer.ok());
  EXPECT_NE(layer.status().message().find("outside this model"), std::string::npos);
  EXPECT_EQ(pool_->Count(memory::Tenant::kWeights), 0);
}

TEST_F(PagedWeightsTest, CorruptOrForeignStoresAreRefusedByTheBroker) {
  auto foreign = broker::ServedStore::Open(path_, kHash + 1, *ctx_);
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.status().ToString().find(path_), std::string::npos) << foreign.status().ToString();
  // Truncated copy, and one byte of block data flipped.
  const std::string cut = path_ + ".cut", flip = path_ + ".flip";
  std::filesystem::copy_file(path_, cut, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(cut, std::filesystem::file_size(path_) / 2);
  auto truncated = broker::ServedStore::Open(cut, kHash, *ctx_);
  EXPECT_FALSE(truncated.ok());
  std::filesystem::copy_file(path_, flip, std::filesystem::copy_options::overwrite_existing);
  {
    // A byte inside plane 2 of the last block.
    auto store = apw::ApwStore::Open(path_).value();
    const apw::BlockData& b = store->block(store->num_blocks() - 1);
    const auto at = static_cast<std::streamoff>(b.planes[2] - store->map_data() + 7);
    std::fstream f(flip, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    f.seekp(at);
    c = static_cast<char>(c ^ 0x40);
    f.write(&c, 1);
  }
  auto flipped = broker::ServedStore::Open(flip, kHash, *ctx_);
  EXPECT_FALSE(flipped.ok());
  std::filesystem::remove(cut);
  std::filesystem::remove(flip);
}

}  // namespace
}  // namespace pw::workers
