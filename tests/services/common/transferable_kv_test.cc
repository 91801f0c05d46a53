// A peer of the control protocol exchanges a worker's KV only if it carries every kind the pool
// holds: full-attention and sliding-window pages from protocol 1.0, a hybrid's recurrent state
// from 1.3. An earlier peer is refused for a hybrid, naming both versions, the model and the
// layer.
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

}  // namespace
}  // namespace pw::service
