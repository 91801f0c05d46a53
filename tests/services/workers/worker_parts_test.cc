// Worker pieces without processes: KV leases (expiry on an injected clock, cancel, ownership),
// the validation of a broker's weight manifest against the worker's own layout, and the decode
// trace's bound against the model's smallest trace.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/formats/model_config.h"
#include "services/proto/weight_kind.h"
#include "services/workers/common/kv_lease.h"
#include "services/workers/decode/decode_trace.h"
#include "services/workers/weights/remote_experts.h"

namespace pw::workers {
namespace {

TEST(KvLeaseTable, ExpiresTakesAndCancels) {
  pw::ManualClock clock(1000);
  KvLeaseTable t(&clock);
  uint64_t a = t.Add(/*request=*/7, {1, 2, 3}, /*lease_ms=*/500);
  uint64_t b = t.Add(8, {4}, 2000);
  uint64_t c = t.Add(9, {5, 6}, 2000);
  EXPECT_NE(a, 0u);
  EXPECT_EQ(t.reserved_blocks(), 6u);
  EXPECT_FALSE(t.Take(a, /*request=*/8).has_value());  // a lease belongs to its request
  clock.Advance(499);
  EXPECT_TRUE(t.TakeExpired().empty());
  clock.Advance(1);
  auto expired = t.TakeExpired();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].lease_id, a);
  EXPECT_EQ(expired[0].blocks, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(t.Take(a, 7).has_value());  // expired leases cannot start decoding
  auto taken = t.Take(b, 8);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->blocks, (std::vector<int32_t>{4}));
  auto cancelled = t.TakeByRequest(9);
  ASSERT_EQ(cancelled.size(), 1u);
  EXPECT_EQ(cancelled[0].lease_id, c);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.reserved_blocks(), 0u);
}

TEST(KvLeaseTable, RenewMovesTheExpiryOfItsRequestsLiveLeaseOnly) {
  pw::ManualClock clock(1000);
  KvLeaseTable t(&clock);
  uint64_t a = t.Add(/*request=*/7, {1, 2}, /*lease_ms=*/300);
  uint64_t b = t.Add(8, {3}, 300);
  clock.Advance(200);
  EXPECT_TRUE(t.Renew(a, 7, 300));      // now expires at 1500
  EXPECT_FALSE(t.Renew(b, 7, 300));     // another request's lease
  EXPECT_FALSE(t.Renew(12345, 8, 300)); // no such lease
  EXPECT_TRUE(t.Renew(b, 8, 50));       // never earlier than it was
  clock.Advance(100);                   // 1300: b's own time is up, a's renewed one is not
  auto expired = t.TakeExpired();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].lease_id, b);
  EXPECT_FALSE(t.Renew(b, 8, 300));     // ended: nothing to renew
  clock.Advance(199);
  EXPECT_TRUE(t.TakeExpired().empty());
  clock.Advance(1);
  ASSERT_EQ(t.TakeExpired().size(), 1u);
  EXPECT_EQ(t.size(), 0u);
}

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.hidden_size = 8;
    cfg_.num_layers = 2;
    cfg_.num_experts = 2;
    cfg_.moe_intermediate_size = 4;
    layout_ = service::ExpertStoreLayout::For(cfg_);
    auto ctx = transport::ucx::Context::Create();
    ASSERT_TRUE(ctx.ok());
    ctx_ = std::move(ctx).value();
    auto w = transport::ucx::Worker::Create(*ctx_);
    ASSERT_TRUE(w.ok());
    worker_ = std::move(w).value();
  }
  // A manifest matching the layout; `mutate` spoils it.
  Status Load(const std::function<void(wire::WeightManifest::Builder)>& mutate) {
    ::capnp::MallocMessageBuilder b;
    auto m = b.initRoot<wire::WeightManifest>();
    m.setOk(true);
    m.initMemory().setBytes(layout_.total_bytes);
    auto regions = m.initRegions(static_cast<unsigned>(layout_.regions.size()));
    for (size_t i = 0; i < layout_.regions.size(); ++i) {
      const auto& r = layout_.regions[i];
      auto w = regions[static_cast<unsigned>(i)];
      w.setLayer(r.layer);
      w.setExpert(r.expert);
      w.setKind(proto::ToWire(r.proj));
      w.setOffset(r.offset);
      w.setBytes(r.bytes);
      w.setBits(16);
    }
    mutate(m);
    return RemoteExpertProvider::Load(*worker_, m.asReader(), cfg_).status();
  }
  ModelConfig cfg_;
  service::ExpertStoreLayout layout_;
  std::unique_ptr<transport::ucx::Context> ctx_;
  std::unique_ptr<transport::ucx::Worker> worker_;
};

TEST_F(ManifestTest, LayoutIsDenseAndAligned) {
  ASSERT_EQ(layout_.regions.size(), 8u);  // 2 layers x 2 experts x {gate_up, down}
  EXPECT_EQ(layout_.regions[0].bytes, 2u * 4 * 8 * 2);
  for (const auto& r : layout_.regions) EXPECT_EQ(r.offset % 64, 0u);
  EXPECT_EQ(layout_.Find(1, 1, ExpertProj::kDown), 7);
  EXPECT_EQ(layout_.Find(2, 0, ExpertProj::kGateUp), -1);
}

TEST_F(ManifestTest, BadManifestsAreRefusedBeforeAnyTransfer) {
  EXPECT_EQ(Load([](auto m) { m.getRegions()[3].setBytes(12); }).code(), StatusCode::kCorrupt);
  EXPECT_EQ(Load([](auto m) { m.getRegions()[3].setExpert(0); }).code(), StatusCode::kCorrupt);
  EXPECT_EQ(Load([](auto m) { m.getRegions()[1].setLayer(99); }).code(), StatusCode::kCorrupt);
  EXPECT_EQ(Load([](auto m) { m.getRegions()[1].setBits(4); }).code(), StatusCode::kUnsupported);
  EXPECT_EQ(Load([&](auto m) { m.getRegions()[7].setOffset(layout_.total_bytes); }).code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(Load([](auto m) { m.initRegions(3); }).code(), StatusCode::kCorrupt);
  EXPECT_EQ(Load([](auto m) { m.setOk(false); m.setError("no store"); }).code(),
            StatusCode::kUnavailable);
  // A well-formed manifest gets as far as connecting: with no worker address, that fails.
  EXPECT_EQ(Load([](auto) {}).code(), StatusCode::kInvalidArgument);
}

// A bound that passed the configuration's check (any model's smallest trace, 164 bytes) but
// cannot hold one record of the served model is refused at start, naming the key, and so is a
// file that cannot be created; the model's smallest trace with one record is accepted.
TEST(DecodeTraceBound, BelowTheModelsSmallestTraceIsRefused) {
  auto cfg = LoadModelConfig(std::string(PW_SOURCE_DIR) + "/models/tiny-moe/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const uint64_t min = misses::MinTraceBytes(static_cast<uint32_t>(cfg->num_experts),
                                             static_cast<uint32_t>(cfg->num_experts_per_tok));
  EXPECT_EQ(min, 64u + 16 + 16 + (12 + 2 * 32 + 6 * 4) + 16 + 32);  // 32 experts, top-4
  DecodeTraceOptions o;
  o.path = ::testing::TempDir() + "/pw_decode_trace_bound.trace";
  o.max_bytes = min - 1;
  auto refused = DecodeTrace::Create(o, *cfg, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  const std::string m = refused.status().ToString();
  EXPECT_NE(m.find("trace max_mb (--trace-max-mb)"), std::string::npos) << m;
  EXPECT_NE(m.find("holds no record"), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(min) + " bytes"), std::string::npos) << m;
  o.max_bytes = min;
  DecodeTraceOptions nowhere = o;  // a file that cannot be created: an error, not a crash
  nowhere.path = "/nonexistent-dir/d.trace";
  EXPECT_EQ(DecodeTrace::Create(nowhere, *cfg, nullptr).status().code(), StatusCode::kNotFound);
  auto t = DecodeTrace::Create(o, *cfg, nullptr);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE((*t)->Close().ok());
  std::filesystem::remove(o.path);
}

}  // namespace
}  // namespace pw::workers
