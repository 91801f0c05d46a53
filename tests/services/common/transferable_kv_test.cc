// A worker's KV pool is served by the cluster unless its per-token layers take blocks of
// different sizes (refused at start, naming the model and both layers); an MLA model's latent
// layers are served, KvLayout.layerBytes their latent rows. A peer of the control protocol
// exchanges a worker's KV only if it carries every kind the pool holds: full-attention and
// sliding-window pages from protocol 1.0, a hybrid's recurrent state from 1.3, an MLA latent
// from 1.4. An earlier peer is refused, naming both versions, the model and the layer.
#include "services/common/transferable_kv.h"

#include <gtest/gtest.h>

#include "services/proto/codec.h"

namespace pw::service {
namespace {

TEST(TransferableKv, ARecurrentStateNeedsAPeerOfProtocol13) {
  std::vector<memory::KvLayerSpec> full(3);
  std::vector<memory::KvLayerSpec> sliding(3);
  sliding[0] = {.kind = memory::KvKind::kSlidingWindow, .window = 8};
  std::vector<memory::KvLayerSpec> hybrid(3);
  hybrid[1] = {.kind = memory::KvKind::kRecurrentState, .state_bytes = 1000};
  EXPECT_FALSE(HasRecurrentState(full));
  EXPECT_FALSE(HasRecurrentState(sliding));
  EXPECT_TRUE(HasRecurrentState(hybrid));
  for (uint16_t minor : {uint16_t{0}, uint16_t{2}, uint16_t{3}, proto::kProtocolMinor}) {
    EXPECT_TRUE(CheckPeerCarriesKv(full, "m", "the router", minor).ok());
    EXPECT_TRUE(CheckPeerCarriesKv(sliding, "gpt-oss", "the router", minor).ok());
  }
  EXPECT_TRUE(CheckPeerCarriesKv(hybrid, "qwen3-next", "the router", 3).ok());
  EXPECT_TRUE(CheckPeerCarriesKv(hybrid, "qwen3-next", "the router", proto::kProtocolMinor).ok());
  const Status s = CheckPeerCarriesKv(hybrid, "qwen3-next", "the router", 2);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("the router speaks control protocol 1.2; qwen3-next keeps a recurrent "
                             "state (KV layer 1) that the KV transfer carries since protocol 1.3 "
                             "(this process speaks 1." +
                             std::to_string(proto::kProtocolMinor) + ")"),
            std::string::npos)
      << s.ToString();
}

TEST(TransferableKv, ALatentNeedsAPeerOfProtocol14) {
  const std::vector<memory::KvLayerSpec> latent(
      3, {.kind = memory::KvKind::kLatent, .latent_dim = 576});
  EXPECT_TRUE(CheckPeerCarriesKv(latent, "deepseek-v3", "the router", 4).ok());
  EXPECT_TRUE(CheckPeerCarriesKv(latent, "deepseek-v3", "the router", proto::kProtocolMinor).ok());
  for (uint16_t minor : {uint16_t{0}, uint16_t{2}, uint16_t{3}}) {
    const Status s = CheckPeerCarriesKv(latent, "deepseek-v3", "the worker", minor);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported);
    EXPECT_NE(
        s.message().find("the worker speaks control protocol 1." + std::to_string(minor) +
                         "; deepseek-v3 keeps an MLA latent (KV layer 0) that the KV transfer "
                         "carries since protocol 1.4 (this process speaks 1." +
                         std::to_string(proto::kProtocolMinor) + ")"),
        std::string::npos)
        << s.ToString();
  }
}

// Full-attention, sliding-window, recurrent-state and latent pools are served, KvLayout.layerBytes
// the bytes of their per-token layers; a pool whose per-token layers differ in size is refused
// at the worker's start, naming the model and both layers.
TEST(TransferableKv, PoolsOfOneLayerSizeAreServed) {
  const memory::KvLayout l{.num_layers = 3, .num_kv_heads = 2, .head_dim = 8, .block_size = 4};
  auto full = memory::KvBlockPool::Create(l, 2);
  ASSERT_TRUE(full.ok());
  EXPECT_TRUE(CheckTransferableKv(**full, "m").ok());
  EXPECT_EQ(KvLayerBytes(l, (*full)->specs()), l.bytes_per_layer());
  std::vector<memory::KvLayerSpec> sliding(3);
  sliding[0] = {.kind = memory::KvKind::kSlidingWindow, .window = 8};
  auto window = memory::KvBlockPool::Create(l, 2, sliding);
  ASSERT_TRUE(window.ok()) << window.status().ToString();
  EXPECT_TRUE(CheckTransferableKv(**window, "gpt-oss").ok());
  EXPECT_EQ(KvLayerBytes(l, sliding), l.bytes_per_layer());
  std::vector<memory::KvLayerSpec> specs(3);
  specs[0] = {.kind = memory::KvKind::kRecurrentState, .state_bytes = 1000};
  auto hybrid = memory::KvBlockPool::Create(l, 2, specs);
  ASSERT_TRUE(hybrid.ok()) << hybrid.status().ToString();
  EXPECT_TRUE(CheckTransferableKv(**hybrid, "qwen3-next").ok());
  EXPECT_EQ(KvLayerBytes(l, specs), l.bytes_per_layer());
  // deepseek_v3: every layer a latent row per token (memory/kv_spec.h kLatent), 4 tokens x 576
  // fp32 values a block, not 2 x 2 heads x 4 tokens x 8 values.
  const std::vector<memory::KvLayerSpec> latent(
      3, {.kind = memory::KvKind::kLatent, .latent_dim = 576});
  auto mla = memory::KvBlockPool::Create(l, 2, latent);
  ASSERT_TRUE(mla.ok()) << mla.status().ToString();
  EXPECT_TRUE(CheckTransferableKv(**mla, "/models/deepseek-v3").ok());
  EXPECT_EQ(KvLayerBytes(l, latent), 4u * 576 * 4);
  EXPECT_EQ((*mla)->bytes_per_block(), 3 * KvLayerBytes(l, latent));
  // A latent beside a full-attention layer: two sizes, refused.
  std::vector<memory::KvLayerSpec> mixed(3);
  mixed[2] = {.kind = memory::KvKind::kLatent, .latent_dim = 576};
  auto both = memory::KvBlockPool::Create(l, 2, mixed);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  const Status m = CheckTransferableKv(**both, "/models/mixed");
  EXPECT_EQ(m.code(), StatusCode::kUnsupported);
  EXPECT_NE(m.message().find("/models/mixed: KV layer 2 (latent) takes 9216 bytes a block, layer 0 "
                             "(full_attention) 512"),
            std::string::npos)
      << m.ToString();
}

}  // namespace
}  // namespace pw::service
