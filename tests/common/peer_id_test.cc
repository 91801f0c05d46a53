// What a control-plane id may be (common/peer_id.h): the ids the project's own files use are
// accepted; an empty or over-long id, and one with a space, a quote, a backslash or a byte
// outside printable ASCII, is refused with the offending byte named and shown escaped.
#include "common/peer_id.h"

#include <gtest/gtest.h>

#include <string>

namespace pw {
namespace {

TEST(PeerId, AcceptsTheIdsOfTheNodeFiles) {
  for (const char* id : {"prefill-0", "decode-0", "decode-12", "router", "broker", "pw-ctl-4242",
                         "node-a.example:decode_1", "prefill-worker-0.prefill.default.svc"}) {
    EXPECT_EQ(PeerIdProblem(id), "") << id;
  }
  EXPECT_EQ(PeerIdProblem(std::string(kMaxPeerIdBytes, 'a')), "");
}

TEST(PeerId, RefusesWhatALogLineOrARoutingIdCannotCarry) {
  EXPECT_NE(PeerIdProblem(""), "");
  EXPECT_NE(PeerIdProblem(std::string(kMaxPeerIdBytes + 1, 'a')).find("256 bytes"), std::string::npos);
  struct Case {
    std::string id;
    std::string shown;  // the byte as the message shows it
    std::string at;
  } cases[] = {
      {"decode 0", "' '", "byte 6"},
      {"decode\n0", "'\\x0a'", "byte 6"},
      {std::string("d\x00", 2), "'\\x00'", "byte 1"},
      {"a\"b", "'\"'", "byte 1"},
      {"it's", "'''", "byte 2"},
      {"back\\slash", "'\\x5c'", "byte 4"},
      {"caf\xc3\xa9", "'\\xc3'", "byte 3"},
      {"del\x7f", "'\\x7f'", "byte 3"},
  };
  for (const Case& c : cases) {
    const std::string problem = PeerIdProblem(c.id);
    EXPECT_NE(problem.find("has " + c.shown + " at " + c.at), std::string::npos) << problem;
    // The message itself is one printable line.
    for (char ch : problem) EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << problem;
  }
}

}  // namespace
}  // namespace pw
