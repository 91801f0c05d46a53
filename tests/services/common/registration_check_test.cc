// CheckRegistration (services/common/registration_check.h): a worker's Register filled as
// pw-decode and pw-prefill fill theirs, from a real KV pool of the embedded model, is accepted;
// each field changed on its own is refused with a reason naming it; the forged decode worker of
// the field report (layout hash 0, 2^32-1 blocks of 2^60 bytes, maxBatch 2^32-1) is refused; a
// hybrid's workers (qwen3_next: a recurrent state in the KV) are accepted from protocol 1.3 on
// with their pages per block, refused from an earlier peer naming both versions; an MLA
// model's (deepseek_v3, kimi_k2: latent KV) from protocol 1.4 on with their latent rows as
// layerBytes, refused from an earlier peer; a gemma4 model's with full layers of their own KV
// width (gemma4_global) from protocol 1.5 on, layerBytes the widest layer and blockBytes the sum.
#include "services/common/registration_check.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "common/formats/model_config.h"
#include "memory/kv_blocks.h"
#include "services/common/kv_layout_hash.h"
#include "services/common/transferable_kv.h"
#include "services/proto/codec.h"

namespace pw::service {
namespace {

constexpr uint32_t kU32Max = 0xffffffffu;

ModelConfig TinyMoe() {
  auto c = LoadModelConfig(std::string(PW_SOURCE_DIR) + "/models/tiny-moe/config.json");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

// What a worker of `role` registers, as DecodeWorker::FillRegister / PrefillWorker::FillRegister
// fill it from their engine's pool (a decode worker's pool is also its registered memory).
void FillHonest(wire::Register::Builder r, wire::Role role, const ModelConfig& m,
                memory::KvDtype dtype = memory::KvDtype::kBf16, int block_size = 16, int blocks = 8) {
  memory::KvLayout l;
  l.num_layers = static_cast<int>(m.num_layers);
  l.num_kv_heads = static_cast<int>(m.num_kv_heads);
  l.head_dim = static_cast<int>(m.head_dim);
  l.block_size = block_size;
  l.dtype = dtype;
  auto pool = memory::KvBlockPool::Create(l, blocks, memory::ModelKvSpecs(m));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  const memory::KvBlockPool& p = **pool;
  r.setRole(role);
  r.setWorkerId(role == wire::Role::DECODE ? "decode-0" : "prefill-0");
  r.setPid(4242);
  r.setModelName("tiny-moe");
  r.setHeartbeatIntervalMs(500);
  auto kl = r.initKvLayout();
  kl.setNumBlocks(static_cast<uint32_t>(p.num_blocks()));
  kl.setBlockTokens(static_cast<uint32_t>(p.layout().block_size));
  kl.setBlockBytes(p.bytes_per_block());
  kl.setLayoutHash(KvLayoutHash(p.layout(), p.specs(), m.hidden_size, m.vocab_size, m.model_type));
  kl.setPageBytes(p.pages().page_bytes());
  kl.setLayerBytes(KvLayerBytes(p.layout(), p.specs()));
  kl.setNumLayers(static_cast<uint32_t>(p.layout().num_layers));
  kl.setPagesPerBlock(static_cast<uint32_t>(p.pages_per_block()));
  if (role == wire::Role::DECODE) {
    auto km = r.initKvMemory();
    km.setWorkerAddress(proto::AsData("ucx-worker-address"));
    km.setRkey(proto::AsData("rkey"));
    km.setBaseAddr(0x7f0000000000);
    km.setBytes(static_cast<uint64_t>(p.pages().num_pages()) * p.pages().page_bytes());
    r.setMaxBatch(64);
  } else {
    r.setMaxBatch(32);
  }
  r.setMaxContext(2048);
}

class RegistrationCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = TinyMoe();
    limits_.model = model_;
    limits_.max_kv_bytes = uint64_t{1} << 32;
  }
  // The honest decode Register with `change` applied, checked.
  Status Decode(const std::function<void(wire::Register::Builder)>& change) {
    proto::OutMessage m;
    auto r = m.body().initRegister();
    FillHonest(r, wire::Role::DECODE, model_);
    change(r);
    return CheckRegistration(r.asReader(), limits_, minor_);
  }
  // Expects `change` (which may also change limits_, for this check only) to be refused with a
  // reason containing `field`.
  void ExpectRefused(const char* what, const std::string& field,
                     const std::function<void(wire::Register::Builder)>& change) {
    SCOPED_TRACE(what);
    const RegistrationLimits saved = limits_;
    Status st = Decode(change);
    limits_ = saved;
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(field), std::string::npos) << st.message();
  }
  // Serves the fixture model `name` (tests/fixtures/models/NAME) from here on.
  void UseFixture(const std::string& name) {
    auto c = LoadModelConfig(std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/" + name +
                             "/config.json");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    model_ = *c;
    limits_.model = model_;
  }
  // The model's honest Register from a decode and from a prefill worker (`expect` looks at its
  // layout first): accepted at this protocol, refused from a worker of protocol 1.(since - 1),
  // the refusal naming both versions and `what`.
  void ExpectHonestSince(uint16_t since, const std::string& what,
                         const std::function<void(wire::Register::Builder)>& expect) {
    for (wire::Role role : {wire::Role::DECODE, wire::Role::PREFILL}) {
      SCOPED_TRACE(role == wire::Role::DECODE ? "decode" : "prefill");
      proto::OutMessage m;
      auto r = m.body().initRegister();
      FillHonest(r, role, model_);
      expect(r);
      Status st = CheckRegistration(r.asReader(), limits_, proto::kProtocolMinor);
      EXPECT_TRUE(st.ok()) << st.ToString();
      st = CheckRegistration(r.asReader(), limits_, static_cast<uint16_t>(since - 1));
      ASSERT_FALSE(st.ok());
      EXPECT_NE(st.message().find("speaks control protocol 1." + std::to_string(since - 1)),
                std::string::npos) << st.message();
      EXPECT_NE(st.message().find("since protocol 1." + std::to_string(since)), std::string::npos)
          << st.message();
      EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
    }
  }
  uint64_t HashFor(int block_size, memory::KvDtype dtype, int64_t hidden) const {
    memory::KvLayout l;
    l.num_layers = static_cast<int>(model_.num_layers);
    l.num_kv_heads = static_cast<int>(model_.num_kv_heads);
    l.head_dim = static_cast<int>(model_.head_dim);
    l.block_size = block_size;
    l.dtype = dtype;
    return KvLayoutHash(l, memory::ModelKvSpecs(model_), hidden, model_.vocab_size, model_.model_type);
  }

  ModelConfig model_;
  RegistrationLimits limits_;
  uint16_t minor_ = proto::kProtocolMinor;  // of the Register's envelope
};

TEST_F(RegistrationCheckTest, HonestWorkersAreAccepted) {
  for (wire::Role role : {wire::Role::DECODE, wire::Role::PREFILL}) {
    for (memory::KvDtype dtype : {memory::KvDtype::kF32, memory::KvDtype::kBf16}) {
      for (int block_size : {1, 16, 4096}) {
        SCOPED_TRACE(std::to_string(static_cast<int>(role)) + " " + memory::KvDtypeName(dtype) + " " +
                     std::to_string(block_size));
        proto::OutMessage m;
        auto r = m.body().initRegister();
        FillHonest(r, role, model_, dtype, block_size, block_size == 4096 ? 2 : 8);
        Status st = CheckRegistration(r.asReader(), limits_, proto::kProtocolMinor);
        EXPECT_TRUE(st.ok()) << st.ToString();
        // The default bound (this host's memory) holds these small pools too.
        RegistrationLimits host = limits_;
        host.max_kv_bytes = 0;
        st = CheckRegistration(r.asReader(), host, proto::kProtocolMinor);
        EXPECT_TRUE(st.ok()) << st.ToString();
      }
    }
  }
}

TEST_F(RegistrationCheckTest, BoundsAreInclusive) {
  EXPECT_TRUE(Decode([](auto r) { r.setMaxBatch(1u << 16); }).ok());
  EXPECT_TRUE(Decode([](auto r) { r.setMaxBatch(0); }).ok());  // the router's default batch
  EXPECT_TRUE(Decode([&](auto r) { r.setResidencyCapacity(static_cast<uint32_t>(model_.num_experts)); }).ok());
  Status st = Decode([&](auto r) {
    auto kl = r.getKvLayout();
    limits_.max_kv_bytes = uint64_t{kl.getNumBlocks()} * kl.getNumLayers() * kl.getPageBytes();
    r.getKvMemory().setBytes(limits_.max_kv_bytes);
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  st = Decode([&](auto r) {  // a pool of the most pages a page pool has, in bytes as it says
    limits_.max_kv_bytes = ~uint64_t{0};
    r.getKvLayout().setNumBlocks((1u << 31) - 1);
    r.getKvMemory().setBytes(uint64_t{1} << 50);
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_F(RegistrationCheckTest, EachForgedFieldIsRefusedByName) {
  ExpectRefused("maxBatch", "maxBatch", [](auto r) { r.setMaxBatch((1u << 16) + 1); });
  ExpectRefused("layoutHash", "layoutHash", [](auto r) {
    r.getKvLayout().setLayoutHash(r.getKvLayout().getLayoutHash() + 1);
  });
  ExpectRefused("another model's hash", "layoutHash", [&](auto r) {
    r.getKvLayout().setLayoutHash(HashFor(16, memory::KvDtype::kBf16, model_.hidden_size * 2));
  });
  ExpectRefused("the hash of other block tokens", "layoutHash", [&](auto r) {
    r.getKvLayout().setLayoutHash(HashFor(32, memory::KvDtype::kBf16, model_.hidden_size));
  });
  // The fp32 hash with bf16 bytes: the layout the hash names has twice the bytes.
  ExpectRefused("fp32 hash, bf16 bytes", "layerBytes", [&](auto r) {
    r.getKvLayout().setLayoutHash(HashFor(16, memory::KvDtype::kF32, model_.hidden_size));
  });
  ExpectRefused("blockTokens 0", "blockTokens", [](auto r) { r.getKvLayout().setBlockTokens(0); });
  ExpectRefused("blockTokens 4097", "blockTokens", [](auto r) { r.getKvLayout().setBlockTokens(4097); });
  ExpectRefused("numBlocks 0", "numBlocks", [](auto r) { r.getKvLayout().setNumBlocks(0); });
  ExpectRefused("numBlocks 2^31", "numBlocks", [](auto r) { r.getKvLayout().setNumBlocks(1u << 31); });
  ExpectRefused("blockBytes", "blockBytes", [](auto r) {
    r.getKvLayout().setBlockBytes(r.getKvLayout().getBlockBytes() + 1);
  });
  // Consistent with each other, not with the model's layout.
  ExpectRefused("layerBytes", "layerBytes", [](auto r) {
    auto kl = r.getKvLayout();
    kl.setLayerBytes(kl.getLayerBytes() * 2);
    kl.setBlockBytes(kl.getBlockBytes() * 2);
    kl.setPageBytes(kl.getPageBytes() * 2);
  });
  ExpectRefused("numLayers", "numLayers", [](auto r) {
    auto kl = r.getKvLayout();
    kl.setNumLayers(kl.getNumLayers() + 1);
    kl.setBlockBytes(kl.getLayerBytes() * kl.getNumLayers());
  });
  ExpectRefused("pageBytes", "pageBytes", [](auto r) {
    r.getKvLayout().setPageBytes(r.getKvLayout().getLayerBytes() - 1);
  });
  ExpectRefused("KV pages above the bound", "above", [&](auto r) {
    auto kl = r.getKvLayout();
    limits_.max_kv_bytes = uint64_t{kl.getNumBlocks()} * kl.getNumLayers() * kl.getPageBytes() - 1;
    r.getKvMemory().setBytes(limits_.max_kv_bytes);
  });
  ExpectRefused("kvMemory smaller than its KV pages", "kvMemory.bytes", [](auto r) {
    auto kl = r.getKvLayout();
    r.getKvMemory().setBytes(uint64_t{kl.getNumBlocks()} * kl.getNumLayers() * kl.getPageBytes() - 1);
  });
  ExpectRefused("kvMemory above the bound", "kvMemory.bytes", [&](auto r) {
    r.getKvMemory().setBytes(limits_.max_kv_bytes + 1);
  });
  ExpectRefused("kvMemory wraps around", "baseAddr", [](auto r) {
    r.getKvMemory().setBaseAddr(~uint64_t{0} - 100);
  });
  ExpectRefused("residencyCapacity", "residencyCapacity", [&](auto r) {
    r.setResidencyCapacity(static_cast<uint32_t>(model_.num_experts) + 1);
  });
  ExpectRefused("no kvMemory", "no kvMemory", [](auto r) { r.disownKvMemory(); });
  ExpectRefused("no kvLayout", "no kvLayout", [](auto r) { r.disownKvLayout(); });
}

// Products that wrap around 2^64 are refused, not compared after wrapping.
TEST_F(RegistrationCheckTest, ProductsDoNotWrapAround) {
  limits_.max_kv_bytes = ~uint64_t{0};
  ExpectRefused("blocks x layers x page bytes", "pageBytes", [](auto r) {
    auto kl = r.getKvLayout();
    kl.setNumBlocks(1u << 30);
    kl.setPageBytes(uint64_t{1} << 40);  // 2^30 * 4 * 2^40 = 2^72
    r.getKvMemory().setBytes(~uint64_t{0});
  });
  ExpectRefused("layerBytes x numLayers", "blockBytes", [](auto r) {
    auto kl = r.getKvLayout();
    kl.setLayerBytes(uint64_t{1} << 62);
    kl.setBlockBytes(0);  // 2^62 * 4 wraps to 0
    kl.setPageBytes(uint64_t{1} << 62);
  });
}

// The decode worker of the field report: every field it forged is named, with or without the
// model (a stand-in ClusterBackend in tests has no model: the bounds still hold).
TEST_F(RegistrationCheckTest, TheReportedForgedDecodeWorkerIsRefused) {
  auto forge = [](wire::Register::Builder r) {
    auto kl = r.getKvLayout();
    kl.setLayoutHash(0);
    kl.setNumBlocks(kU32Max);
    kl.setBlockBytes(uint64_t{1} << 60);
    r.setMaxBatch(kU32Max);
  };
  Status st = Decode(forge);
  ASSERT_FALSE(st.ok());
  for (const char* field : {"maxBatch", "numBlocks", "blockBytes", "layoutHash"}) {
    EXPECT_NE(st.message().find(field), std::string::npos) << field << ": " << st.message();
  }
  limits_.model.reset();
  st = Decode(forge);
  ASSERT_FALSE(st.ok());
  for (const char* field : {"maxBatch", "numBlocks", "blockBytes"}) {
    EXPECT_NE(st.message().find(field), std::string::npos) << field << ": " << st.message();
  }
}

// Without the model, a stand-in worker's layout (tests of the protocol) passes the bounds.
TEST_F(RegistrationCheckTest, WithoutTheModelOnlyBoundsAndConsistency) {
  limits_.model.reset();
  proto::OutMessage m;
  auto r = m.body().initRegister();
  r.setRole(wire::Role::DECODE);
  r.setMaxBatch(16);
  auto kl = r.initKvLayout();
  kl.setNumBlocks(64);
  kl.setBlockTokens(16);
  kl.setLayoutHash(42);
  r.initKvMemory().setBytes(64 * 4096);
  Status st = CheckRegistration(r.asReader(), limits_, proto::kProtocolMinor);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// Tools (pw-ctl registers as client) carry no KV: nothing here applies to them.
TEST_F(RegistrationCheckTest, ClientsAreNotWorkers) {
  proto::OutMessage m;
  auto r = m.body().initRegister();
  r.setRole(wire::Role::CLIENT);
  r.setMaxBatch(kU32Max);
  EXPECT_TRUE(CheckRegistration(r.asReader(), limits_, proto::kProtocolMinor).ok());
}

// A worker of protocol 1.2 registers no pagesPerBlock (one page per layer): still accepted for
// a model without a recurrent state.
TEST_F(RegistrationCheckTest, AWorkerBeforePagesPerBlockServesAnAttentionModel) {
  minor_ = 2;
  Status st = Decode([](auto r) { r.getKvLayout().setPagesPerBlock(0); });
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// qwen3_next's fixture: linear-attention layers 0 and 2 keep a recurrent state of 3200 bytes,
// two 2048-byte pages of a bf16 block of 16 tokens, one page of 4096 bytes.
TEST_F(RegistrationCheckTest, AHybridsWorkersCarryTheirStatePagesFromProtocol13On) {
  UseFixture("qwen3_next");
  ExpectHonestSince(3, "qwen3_next", [](auto r) {
    EXPECT_EQ(r.getKvLayout().getPagesPerBlock(), 2u + 2 * 2);
  });
  EXPECT_TRUE(Decode([](auto) {}).ok());
  ExpectRefused("no pagesPerBlock", "pagesPerBlock", [](auto r) { r.getKvLayout().setPagesPerBlock(0); });
  ExpectRefused("a page short", "pagesPerBlock", [](auto r) { r.getKvLayout().setPagesPerBlock(5); });
  // Pages of 4096 bytes hold a state in one: 4 pages a block, not 6.
  ExpectRefused("6 pages of 4096 bytes", "pagesPerBlock", [](auto r) {
    r.getKvLayout().setPageBytes(4096);
    r.getKvMemory().setBytes(r.getKvMemory().getBytes() * 2);
  });
  EXPECT_TRUE(Decode([](auto r) {
                r.getKvLayout().setPageBytes(4096);
                r.getKvLayout().setPagesPerBlock(4);
                r.getKvMemory().setBytes(r.getKvMemory().getBytes() * 2);
              }).ok());
  // The hash of the model's layout without its states (what a peer before 1.3 computes).
  ExpectRefused("the hash without the state", "layoutHash", [&](auto r) {
    memory::KvLayout l;
    l.num_layers = static_cast<int>(model_.num_layers);
    l.num_kv_heads = static_cast<int>(model_.num_kv_heads);
    l.head_dim = static_cast<int>(model_.head_dim);
    l.dtype = memory::KvDtype::kBf16;
    r.getKvLayout().setLayoutHash(KvLayoutHash(l, memory::FullAttentionSpecs(l), model_.hidden_size,
                                               model_.vocab_size, model_.model_type));
  });
  minor_ = 2;
  ExpectRefused("a decode worker of 1.2", "1.2", [](auto) {});
}

// gemma4_global's fixture: sliding layers of 4 kv heads x 16, full layers of 1 x 32 (as
// Gemma-4-26B-A4B's 8 x 256 and 2 x 512): a bf16 block of 16 tokens takes 4096 bytes a sliding
// layer, 2048 a full one, 12288 in all; pages of 4096 bytes.
TEST_F(RegistrationCheckTest, LayersOfTheirOwnKvWidthRegisterFromProtocol15On) {
  UseFixture("gemma4_global");
  ExpectHonestSince(5, "own KV width", [](auto r) {
    EXPECT_EQ(r.getKvLayout().getLayerBytes(), 4096u);
    EXPECT_EQ(r.getKvLayout().getBlockBytes(), 2u * 4096 + 2 * 2048);
    EXPECT_EQ(r.getKvLayout().getPageBytes(), 4096u);
    EXPECT_EQ(r.getKvLayout().getPagesPerBlock(), 4u);
  });
  EXPECT_TRUE(Decode([](auto) {}).ok());
  // Every layer counted at the widest one's bytes: not this model's block.
  ExpectRefused("numLayers x layerBytes", "blockBytes",
                [](auto r) { r.getKvLayout().setBlockBytes(4 * 4096); });
  // The hash of the same layout with every layer of the top-level shape.
  ExpectRefused("the hash without the full layers' shape", "layoutHash", [&](auto r) {
    memory::KvLayout l;
    l.num_layers = static_cast<int>(model_.num_layers);
    l.num_kv_heads = static_cast<int>(model_.num_kv_heads);
    l.head_dim = static_cast<int>(model_.head_dim);
    l.dtype = memory::KvDtype::kBf16;
    ModelConfig same = model_;
    same.full_head_dim = 0;
    same.full_num_kv_heads = 0;
    r.getKvLayout().setLayoutHash(KvLayoutHash(l, memory::ModelKvSpecs(same), model_.hidden_size,
                                               model_.vocab_size, model_.model_type));
  });
}

// deepseek_v3's fixture (and kimi_k2's, the same attention): 3 layers each keeping a latent of
// kv_lora_rank 32 + qk_rope_head_dim 8 values a token, 16 x 40 bf16 values (1280 bytes) a layer
// of a block, where K and V of 4 heads x 8 would take 2048.
TEST_F(RegistrationCheckTest, AnMlaModelsWorkersRegisterTheirLatentRowsFromProtocol14On) {
  for (const char* fixture : {"deepseek_v3", "kimi_k2"}) {
    SCOPED_TRACE(fixture);
    UseFixture(fixture);
    ExpectHonestSince(4, "MLA latent", [](auto r) {
      EXPECT_EQ(r.getKvLayout().getLayerBytes(), 16u * 40 * 2);
      EXPECT_EQ(r.getKvLayout().getBlockBytes(), 3u * 16 * 40 * 2);
      EXPECT_EQ(r.getKvLayout().getPageBytes(), 1280u);
      EXPECT_EQ(r.getKvLayout().getPagesPerBlock(), 3u);
    });
    EXPECT_TRUE(Decode([](auto) {}).ok());
    // Pages larger than a layer (a decode worker's --page-bytes) hold the same block.
    EXPECT_TRUE(Decode([](auto r) {
                  r.getKvLayout().setPageBytes(4096);
                  r.getKvMemory().setBytes(r.getKvMemory().getBytes() * 4);
                }).ok());
    // K and V of the layout's heads as the layer's bytes: not what an MLA block holds.
    ExpectRefused("K and V bytes", "layerBytes", [](auto r) {
      r.getKvLayout().setLayerBytes(2048);
      r.getKvLayout().setBlockBytes(3 * 2048);
      r.getKvLayout().setPageBytes(2048);
      r.getKvMemory().setBytes(r.getKvMemory().getBytes() * 2);
    });
    ExpectRefused("a page short of the latent rows", "pageBytes",
                  [](auto r) { r.getKvLayout().setPageBytes(1216); });
    // The hash of the model's layout without its latents (what a peer before 1.4 computes).
    ExpectRefused("the hash without the latent", "layoutHash", [&](auto r) {
      memory::KvLayout l;
      l.num_layers = static_cast<int>(model_.num_layers);
      l.num_kv_heads = static_cast<int>(model_.num_kv_heads);
      l.head_dim = static_cast<int>(model_.head_dim);
      l.dtype = memory::KvDtype::kBf16;
      r.getKvLayout().setLayoutHash(KvLayoutHash(l, memory::FullAttentionSpecs(l),
                                                 model_.hidden_size, model_.vocab_size,
                                                 model_.model_type));
    });
    // Another kv_lora_rank: another hash.
    ExpectRefused("the hash of a wider latent", "layoutHash", [&](auto r) {
      ModelConfig wider = model_;
      wider.mla.kv_lora_rank = 48;
      memory::KvLayout l;
      l.num_layers = static_cast<int>(model_.num_layers);
      l.num_kv_heads = static_cast<int>(model_.num_kv_heads);
      l.head_dim = static_cast<int>(model_.head_dim);
      l.dtype = memory::KvDtype::kBf16;
      r.getKvLayout().setLayoutHash(KvLayoutHash(l, memory::ModelKvSpecs(wider), model_.hidden_size,
                                                 model_.vocab_size, model_.model_type));
    });
    minor_ = 3;
    ExpectRefused("a decode worker of 1.3", "1.3", [](auto) {});
    minor_ = proto::kProtocolMinor;
  }
}

}  // namespace
}  // namespace pw::service
