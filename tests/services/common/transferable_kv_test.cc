// KvLayout.layerBytes of a worker's KV pool is its widest per-token layer's bytes: K and V of the
// layout's heads, an MLA model's latent rows, or an attention layer of its own shape where that
// is wider (each layer moves its own bytes). A peer of the control protocol exchanges a
// worker's KV only if it carries every kind the pool holds: full-attention and sliding-window
// pages from protocol 1.0, a hybrid's recurrent state from 1.3, an MLA latent from 1.4, an
// attention layer of its own KV width (gemma4's full layers) from 1.5. An earlier peer is
// refused, naming both versions, the model and the layer.
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

TEST(TransferableKv, ALayerOfItsOwnShapeNeedsAPeerOfProtocol15) {
  std::vector<memory::KvLayerSpec> gemma4(4);
  gemma4[0] = gemma4[2] = {.kind = memory::KvKind::kSlidingWindow, .window = 8};
  gemma4[1] = gemma4[3] = {.num_kv_heads = 1, .head_dim = 32};
  EXPECT_TRUE(CheckPeerCarriesKv(gemma4, "gemma-4", "the router", 5).ok());
  EXPECT_TRUE(CheckPeerCarriesKv(gemma4, "gemma-4", "the router", proto::kProtocolMinor).ok());
  for (uint16_t minor : {uint16_t{0}, uint16_t{3}, uint16_t{4}}) {
    const Status s = CheckPeerCarriesKv(gemma4, "gemma-4", "the worker", minor);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported);
    EXPECT_NE(s.message().find("the worker speaks control protocol 1." + std::to_string(minor) +
                               "; gemma-4 keeps attention of its own KV width (KV layer 1) that "
                               "the KV transfer carries since protocol 1.5"),
              std::string::npos)
        << s.ToString();
  }
}

// Full-attention, sliding-window, recurrent-state, latent and mixed pools: KvLayout.layerBytes
// is the widest per-token layer's bytes (pages hold it), the block the sum of its layers'.
TEST(TransferableKv, LayerBytesAreTheWidestLayers) {
  const memory::KvLayout l{.num_layers = 3, .num_kv_heads = 2, .head_dim = 8, .block_size = 4};
  auto full = memory::KvBlockPool::Create(l, 2);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(KvLayerBytes(l, (*full)->specs()), l.bytes_per_layer());
  std::vector<memory::KvLayerSpec> sliding(3);
  sliding[0] = {.kind = memory::KvKind::kSlidingWindow, .window = 8};
  EXPECT_EQ(KvLayerBytes(l, sliding), l.bytes_per_layer());
  std::vector<memory::KvLayerSpec> specs(3);
  specs[0] = {.kind = memory::KvKind::kRecurrentState, .state_bytes = 1000};
  EXPECT_EQ(KvLayerBytes(l, specs), l.bytes_per_layer());
  // deepseek_v3: every layer a latent row per token (memory/kv_spec.h kLatent), 4 tokens x 576
  // fp32 values a block, not 2 x 2 heads x 4 tokens x 8 values.
  const std::vector<memory::KvLayerSpec> latent(
      3, {.kind = memory::KvKind::kLatent, .latent_dim = 576});
  auto mla = memory::KvBlockPool::Create(l, 2, latent);
  ASSERT_TRUE(mla.ok()) << mla.status().ToString();
  EXPECT_EQ(KvLayerBytes(l, latent), 4u * 576 * 4);
  EXPECT_EQ((*mla)->bytes_per_block(), 3 * KvLayerBytes(l, latent));
  // gemma4's full layers narrower than its sliding ones (Gemma-4-26B-A4B: 2 x 512 against
  // 8 x 256): the sliding layers' bytes; wider: theirs.
  std::vector<memory::KvLayerSpec> narrow(3);
  narrow[0] = {.kind = memory::KvKind::kSlidingWindow, .window = 8};
  narrow[1] = {.num_kv_heads = 1, .head_dim = 8};
  EXPECT_EQ(KvLayerBytes(l, narrow), l.bytes_per_layer());
  auto pool = memory::KvBlockPool::Create(l, 2, narrow);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ((*pool)->bytes_per_block(), 2 * l.bytes_per_layer() + l.bytes_per_layer() / 2);
  std::vector<memory::KvLayerSpec> wide = narrow;
  wide[1] = {.num_kv_heads = 2, .head_dim = 32};
  EXPECT_EQ(KvLayerBytes(l, wide), 4 * l.bytes_per_layer());
  // A latent beside a full-attention layer: the latent's rows, the wider.
  std::vector<memory::KvLayerSpec> mixed(3);
  mixed[2] = {.kind = memory::KvKind::kLatent, .latent_dim = 576};
  EXPECT_EQ(KvLayerBytes(l, mixed), 4u * 576 * 4);
}

}  // namespace
}  // namespace pw::service
