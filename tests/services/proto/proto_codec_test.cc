// Control-plane codec: round trips, and every kind of bad frame refused with a Status.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>

#include "services/proto/codec.h"

namespace pw::proto {
namespace {

std::string MakeTokenChunk(uint64_t seq) {
  OutMessage m;
  auto tc = m.body().initTokenChunk();
  tc.setRequestId(42);
  tc.setStartIndex(7);
  auto toks = tc.initTokens(3);
  toks.set(0, 11);
  toks.set(1, 12);
  toks.set(2, 13);
  return Encode(m, seq, "decode-0", 1234);
}

TEST(ProtoCodec, RoundTrip) {
  std::string bytes = MakeTokenChunk(5);
  ASSERT_EQ(bytes.size() % 8, 0u);
  auto parsed = InMessage::Parse(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const InMessage& m = **parsed;
  EXPECT_EQ(m.which(), Body::TOKEN_CHUNK);
  EXPECT_EQ(m.seq(), 5u);
  EXPECT_EQ(m.sender(), "decode-0");
  EXPECT_EQ(m.envelope().getVersionMajor(), kProtocolMajor);
  auto tc = m.body().getTokenChunk();
  EXPECT_EQ(tc.getRequestId(), 42u);
  EXPECT_EQ(tc.getStartIndex(), 7u);
  EXPECT_EQ(ToVector<uint32_t>(tc.getTokens()), (std::vector<uint32_t>{11, 12, 13}));
}

TEST(ProtoCodec, RefusesOtherMajorVersion) {
  // Encode() always stamps the current version, so build the foreign frame by hand.
  ::capnp::MallocMessageBuilder b;
  auto env = b.initRoot<Envelope>();
  env.setVersionMajor(kProtocolMajor + 1);
  env.setSenderId("peer-x");
  env.getBody().initHeartbeat();
  auto flat = ::capnp::messageToFlatArray(b);
  auto fb = flat.asBytes();
  auto parsed = InMessage::Parse(std::string_view(reinterpret_cast<const char*>(fb.begin()),
                                                  fb.size()));
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(parsed.status().message().find("peer-x"), std::string::npos);
  OutMessage same;
  same.body().initHeartbeat();
  EXPECT_TRUE(InMessage::Parse(Encode(same, 1, "peer-y", 0)).ok());
}

TEST(ProtoCodec, AcceptsNewerMinorVersion) {
  ::capnp::MallocMessageBuilder b;
  auto env = b.initRoot<Envelope>();
  env.setVersionMajor(kProtocolMajor);
  env.setVersionMinor(kProtocolMinor + 3);
  env.setSenderId("newer");
  env.getBody().initCancel().setRequestId(9);
  auto flat = ::capnp::messageToFlatArray(b);
  auto fb = flat.asBytes();
  auto parsed = InMessage::Parse(std::string_view(reinterpret_cast<const char*>(fb.begin()),
                                                  fb.size()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ((*parsed)->version_minor(), kProtocolMinor + 3);
}

TEST(ProtoCodec, RefusesEmptyAndMisalignedAndOversized) {
  EXPECT_EQ(InMessage::Parse(std::string_view()).status().code(), StatusCode::kCorrupt);
  std::string bytes = MakeTokenChunk(1);
  EXPECT_EQ(InMessage::Parse(std::string_view(bytes).substr(0, bytes.size() - 3)).status().code(),
            StatusCode::kCorrupt);
  ParseLimits tight;
  tight.max_frame_bytes = 16;
  EXPECT_EQ(InMessage::Parse(bytes, tight).status().code(), StatusCode::kOutOfRange);
}

TEST(ProtoCodec, RefusesTruncatedFrames) {
  std::string bytes = MakeTokenChunk(1);
  for (size_t n = 8; n < bytes.size(); n += 8) {
    auto parsed = InMessage::Parse(std::string_view(bytes).substr(0, n));
    EXPECT_FALSE(parsed.ok()) << "prefix of " << n << " bytes accepted";
  }
}

TEST(ProtoCodec, SegmentTableLyingAboutSizeIsRefused) {
  std::string bytes = MakeTokenChunk(1);
  // Word 0: segment count - 1 (u32) and first segment size in words (u32). Claim a huge segment.
  bytes[4] = '\xff';
  bytes[5] = '\xff';
  bytes[6] = '\xff';
  bytes[7] = '\x0f';
  auto parsed = InMessage::Parse(bytes);
  EXPECT_FALSE(parsed.ok());
}

TEST(ProtoCodec, RandomCorruptionNeverThrows) {
  const uint32_t seed = 20261129;
  std::mt19937 rng(seed);
  std::string good = MakeTokenChunk(3);
  int accepted = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    std::string bytes = good;
    int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    auto parsed = InMessage::Parse(bytes);
    if (!parsed.ok()) continue;
    ++accepted;
    // Reading an accepted message inside GuardWire must not escape an exception either.
    Status st = GuardWire("read", [&]() -> Status {
      const InMessage& m = **parsed;
      if (m.which() == Body::TOKEN_CHUNK) {
        auto tc = m.body().getTokenChunk();
        uint64_t sum = tc.getRequestId();
        for (auto t : tc.getTokens()) sum += t;
        (void)sum;
      }
      (void)m.sender();
      return Status::Ok();
    });
    (void)st;
  }
  SCOPED_TRACE("seed " + std::to_string(seed));
  EXPECT_GT(accepted, 0);  // some flips only touch data words
}

TEST(ProtoCodec, RandomGarbageIsRefused) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes((1 + rng() % 64) * 8, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    auto parsed = InMessage::Parse(bytes);
    (void)parsed;  // must return, with or without a message; never throw or abort
  }
  SUCCEED();
}

// A parsed message kept for a long time (a worker's registration, a queued request) is read
// again at every use. Cap'n Proto charges every read against one traversal budget for the
// life of its reader; the kept message must stay readable however often it is read.
TEST(ProtoCodec, KeptMessageCanBeReadManyTimes) {
  OutMessage m;
  auto reg = m.body().initRegister();
  reg.setWorkerId("decode-0");
  reg.setModelName("tiny-moe");
  auto mem = reg.initKvMemory();
  const std::string addr(300, 'a'), rkey(120, 'k');
  mem.setWorkerAddress(AsData(addr));
  mem.setRkey(AsData(rkey));
  auto table = reg.initWeightTable(512);
  for (unsigned i = 0; i < table.size(); ++i) {
    table[i].setLayer(i / 16);
    table[i].setExpert(i % 16);
    table[i].setCommittedBits(16);
  }
  auto parsed = InMessage::Parse(Encode(m, 1, "decode-0", 0));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  std::shared_ptr<InMessage> kept(std::move(parsed).value().release());
  for (int i = 0; i < 20000; ++i) {
    uint64_t bits = 0;
    std::string got_addr;
    Status st = GuardWire("kept registration", [&]() -> Status {
      auto r = kept->body().getRegister();
      for (auto e : r.getWeightTable()) bits += e.getCommittedBits();
      got_addr = ToBytes(r.getKvMemory().getWorkerAddress());
      return Status::Ok();
    });
    ASSERT_TRUE(st.ok()) << "read " << i << ": " << st.ToString();
    ASSERT_EQ(bits, 512u * 16);
    ASSERT_EQ(got_addr, addr);
  }
}

// Lifting the budget for kept messages must not let amplification through: 1000 pointers
// that all name the same 1000 bytes read as a million bytes and are refused at Parse().
TEST(ProtoCodec, AmplifyingPointersAreRefused) {
  constexpr uint64_t kPtrs = 1000, kDataWords = 125;
  std::vector<uint64_t> w;
  const uint64_t seg_words = 1 + kPtrs + kDataWords;
  w.push_back(seg_words << 32);     // segment table: one segment of seg_words words
  w.push_back(kPtrs << 48);         // root: struct at offset 0, no data, kPtrs pointers
  for (uint64_t i = 0; i < kPtrs; ++i) {
    const uint64_t offset = (1 + kPtrs) - (2 + i);  // from the end of pointer i to the bytes
    w.push_back((offset << 2) | 1 | ((((kDataWords * 8) << 3) | 2) << 32));  // List(UInt8)
  }
  for (uint64_t i = 0; i < kDataWords; ++i) w.push_back(0x0101010101010101ull);
  std::string bytes(reinterpret_cast<const char*>(w.data()), w.size() * 8);
  auto parsed = InMessage::Parse(bytes);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kCorrupt) << parsed.status().ToString();
}

// A Register whose weightTable is a list of 8,388,608 voids (no data at all), in a frame of 176
// bytes: read as a list of structs it has that many (empty) entries, and any walk over it (a
// handler's loop, the fuzz target's text conversion) costs as much. Found by control_frame_fuzz
// (fuzz/corpus/control_frame_fuzz/void-list-weight-table).
TEST(ProtoCodec, VoidListClaimingMillionsOfEntriesIsRefused) {
  const std::string hex =
      "0000000015000000000000000400020001000000010000000100000000000000"
      "0100000000000000000000000000000035000000520000000000000003000500"
      "02000000d2040000640000000000000000000000000000001100000052000000"
      "150000004a00000000000000000000000000000000000000fd00000000000004"
      "707265ffffff022d300000000000000074696e792d6d6f650000000000000000"
      "70726566696c6c2d3000000000000000";
  std::string bytes;
  for (size_t i = 0; i < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  ASSERT_EQ(bytes.size(), 176u);
  auto parsed = InMessage::Parse(bytes);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kCorrupt) << parsed.status().ToString();
}

TEST(ProtoCodec, GuardWireConvertsExceptions) {
  Status st = GuardWire("handler", []() -> Status { KJ_FAIL_REQUIRE("bad pointer"); });
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("handler"), std::string::npos);
}

}  // namespace
}  // namespace pw::proto
