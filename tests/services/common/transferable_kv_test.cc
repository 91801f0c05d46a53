// A worker's KV pool is transferable by the cluster only when every layer is full attention or a
// sliding window: a hybrid's recurrent-state layer is refused, naming the model and the layer.
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
}

}  // namespace
}  // namespace pw::service
