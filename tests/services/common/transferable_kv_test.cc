// A worker's KV pool is transferable by the cluster only when every layer is full attention or a
// sliding window: a hybrid's recurrent-state layer and an MLA model's latent layer are refused,
// naming the model and the layer.
#include "services/common/transferable_kv.h"

#include <gtest/gtest.h>

namespace pw::service {
namespace {

TEST(TransferableKv, HybridPoolsAreRefusedNamingTheLayer) {
  const memory::KvLayout l{.num_layers = 3, .num_kv_heads = 2, .head_dim = 8, .block_size = 4};
  auto full = memory::KvBlockPool::Create(l, 2);
  ASSERT_TRUE(full.ok());
  EXPECT_TRUE(CheckTransferableKv(**full, "m").ok());
  std::vector<memory::KvLayerSpec> sliding(3);
  sliding[0] = {.kind = memory::KvKind::kSlidingWindow, .window = 8};
  auto window = memory::KvBlockPool::Create(l, 2, sliding);
  ASSERT_TRUE(window.ok()) << window.status().ToString();
  EXPECT_TRUE(CheckTransferableKv(**window, "gpt-oss").ok());  // gpt_oss is served
  std::vector<memory::KvLayerSpec> specs(3);
  specs[1] = {.kind = memory::KvKind::kRecurrentState, .state_bytes = 1000};
  auto hybrid = memory::KvBlockPool::Create(l, 2, specs);
  ASSERT_TRUE(hybrid.ok()) << hybrid.status().ToString();
  const Status s = CheckTransferableKv(**hybrid, "/models/qwen3-next");
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("/models/qwen3-next: KV layer 1 is recurrent_state"),
            std::string::npos)
      << s.ToString();
  // deepseek_v3: every layer a latent row per token (memory/kv_spec.h kLatent).
  const std::vector<memory::KvLayerSpec> latent(3, {.kind = memory::KvKind::kLatent,
                                                    .latent_dim = 576});
  auto mla = memory::KvBlockPool::Create(l, 2, latent);
  ASSERT_TRUE(mla.ok()) << mla.status().ToString();
  const Status m = CheckTransferableKv(**mla, "/models/deepseek-v3");
  EXPECT_EQ(m.code(), StatusCode::kUnsupported);
  EXPECT_NE(m.message().find("/models/deepseek-v3: KV layer 0 is latent"), std::string::npos)
      << m.ToString();
  EXPECT_NE(m.message().find("an MLA (latent KV) model is not served by the cluster yet"),
            std::string::npos)
      << m.ToString();
}

}  // namespace
}  // namespace pw::service
