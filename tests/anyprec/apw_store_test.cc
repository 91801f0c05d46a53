// .apw store: round trip, determinism, and refusal of truncated, corrupt and foreign stores.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/formats/apw_store.h"
#include "kernels/anyprec/anyprec.h"

namespace pw::apw {
namespace {

struct FakeBlock {
  std::vector<uint8_t> planes[kPlanes];
  std::vector<uint16_t> luts[kMaxBits + 1];
  BlockData data;
};

constexpr StoreInfo kInfo{2, 3, 40, 24, 0x1234abcd5678ef01ull};

std::vector<FakeBlock> MakeBlocks(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<FakeBlock> out(kInfo.num_layers * kInfo.num_experts * 2);
  size_t i = 0;
  for (uint32_t l = 0; l < kInfo.num_layers; ++l) {
    for (uint32_t e = 0; e < kInfo.num_experts; ++e) {
      for (BlockKind k : {BlockKind::kGateUp, BlockKind::kDown}) {
        FakeBlock& f = out[i++];
        f.data.layer = l;
        f.data.expert = e;
        f.data.kind = k;
        f.data.rows = k == BlockKind::kGateUp ? 2 * kInfo.ffn : kInfo.hidden;
        f.data.cols = k == BlockKind::kGateUp ? kInfo.hidden : kInfo.ffn;
        const size_t pb = f.data.rows * anyprec::PlaneRowBytes(f.data.cols);
        for (int p = 0; p < kPlanes; ++p) {
          f.planes[p].resize(pb);
          for (auto& v : f.planes[p]) v = static_cast<uint8_t>(rng());
          f.data.planes[p] = f.planes[p].data();
        }
        for (int b = kMinBits; b <= kMaxBits; ++b) {
          f.luts[b].resize(f.data.rows << b);
          for (auto& v : f.luts[b]) v = static_cast<uint16_t>(rng() & 0x7bff);
          f.data.luts[b] = f.luts[b].data();
        }
        f.data.damage[0] = 100.0 + i;
        for (int b = kMinBits; b <= kMaxBits; ++b) f.data.damage[b] = 10.0 / b + i;
        f.data.calib_tokens = 17 * i;
      }
    }
  }
  return out;
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid()) + ".apw";
}

void WriteStore(const std::string& path, const std::vector<FakeBlock>& blocks) {
  auto w = ApwWriter::Create(path, kInfo);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  // Reverse order: the reader must not depend on the order blocks were added in.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) ASSERT_TRUE((*w)->Add(it->data).ok());
  Status st = (*w)->Finish();
  ASSERT_TRUE(st.ok()) << st.ToString();
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void WriteAll(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

TEST(ApwStore, Crc32MatchesKnownValue) {
  const char* s = "123456789";
  EXPECT_EQ(Crc32(s, 9), 0xCBF43926u);
  EXPECT_EQ(Crc32(s + 4, 5, Crc32(s, 4)), 0xCBF43926u);
}

TEST(ApwStore, RoundTripsEveryField) {
  const auto blocks = MakeBlocks(1);
  const std::string path = TempPath("roundtrip");
  WriteStore(path, blocks);
  auto store = ApwStore::Open(path, {true, kInfo.model_hash});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const ApwStore& s = **store;
  EXPECT_EQ(s.info().hidden, kInfo.hidden);
  EXPECT_EQ(s.info().ffn, kInfo.ffn);
  EXPECT_EQ(s.num_blocks(), static_cast<int>(blocks.size()));
  for (const FakeBlock& f : blocks) {
    const BlockData* b = s.Find(f.data.layer, f.data.expert, f.data.kind);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->rows, f.data.rows);
    EXPECT_EQ(b->calib_tokens, f.data.calib_tokens);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->planes[0]) % kDataAlign, 0u);
    for (int p = 0; p < kPlanes; ++p) {
      ASSERT_EQ(0, std::memcmp(b->planes[p], f.planes[p].data(), f.planes[p].size()));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b->planes[p]) % kPartAlign, 0u);
    }
    for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
      ASSERT_EQ(0, std::memcmp(b->luts[bits], f.luts[bits].data(), f.luts[bits].size() * 2));
      EXPECT_EQ(b->damage[bits], f.data.damage[bits]);
    }
    EXPECT_EQ(b->damage[0], f.data.damage[0]);
  }
  EXPECT_EQ(s.Find(2, 0, BlockKind::kDown), nullptr);
  std::remove(path.c_str());
}

TEST(ApwStore, SameInputsSameBytes) {
  const auto blocks = MakeBlocks(2);
  const std::string a = TempPath("det_a"), b = TempPath("det_b");
  WriteStore(a, blocks);
  WriteStore(b, blocks);
  EXPECT_EQ(ReadAll(a), ReadAll(b));
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST(ApwStore, WriterRefusesIncompleteOrWrongBlocks) {
  auto blocks = MakeBlocks(3);
  const std::string path = TempPath("incomplete");
  auto w = ApwWriter::Create(path, kInfo);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Add(blocks[0].data).ok());
  EXPECT_FALSE((*w)->Add(blocks[0].data).ok());  // twice
  BlockData wrong = blocks[1].data;
  wrong.rows += 1;
  EXPECT_FALSE((*w)->Add(wrong).ok());
  Status st = (*w)->Finish();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("never added"), std::string::npos) << st.message();
  w = Result<std::unique_ptr<ApwWriter>>(Internal("drop"));
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0) << "temporary file left behind";
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
}

TEST(ApwStore, RefusesAnotherModel) {
  const std::string path = TempPath("foreign");
  WriteStore(path, MakeBlocks(4));
  auto store = ApwStore::Open(path, {true, kInfo.model_hash ^ 1});
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("another model"), std::string::npos);
  std::remove(path.c_str());
}

TEST(ApwStore, RefusesTruncatedStores) {
  const std::string path = TempPath("trunc");
  WriteStore(path, MakeBlocks(5));
  const auto bytes = ReadAll(path);
  for (size_t n : {size_t{0}, size_t{10}, size_t{255}, size_t{4096}, bytes.size() / 2, bytes.size() - 1}) {
    WriteAll(path, std::vector<uint8_t>(bytes.begin(), bytes.begin() + n));
    auto store = ApwStore::Open(path);
    EXPECT_FALSE(store.ok()) << "size " << n;
  }
  std::remove(path.c_str());
}

TEST(ApwStore, CorruptBlockDataIsNamed) {
  const auto blocks = MakeBlocks(6);
  const std::string path = TempPath("corrupt");
  WriteStore(path, blocks);
  auto bytes = ReadAll(path);
  // Flip one byte inside block (layer 1, expert 2, down)'s LUT_5, located by its content.
  const FakeBlock* target = nullptr;
  for (const auto& f : blocks) {
    if (f.data.layer == 1 && f.data.expert == 2 && f.data.kind == BlockKind::kDown) target = &f;
  }
  ASSERT_NE(target, nullptr);
  const auto* needle = reinterpret_cast<const uint8_t*>(target->luts[5].data());
  auto it = std::search(bytes.begin(), bytes.end(), needle, needle + target->luts[5].size() * 2);
  ASSERT_NE(it, bytes.end());
  const size_t at = static_cast<size_t>(it - bytes.begin()) + 7;
  bytes[at] ^= 0x40;
  WriteAll(path, bytes);
  auto store = ApwStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("layer 1, expert 2, down"), std::string::npos)
      << store.status().message();
  EXPECT_NE(store.status().message().find("checksum"), std::string::npos);
  // Without data verification the open succeeds and VerifyBlock names the block.
  auto lazy = ApwStore::Open(path, {false, std::nullopt});
  ASSERT_TRUE(lazy.ok());
  int bad = 0;
  for (int i = 0; i < (*lazy)->num_blocks(); ++i) bad += !(*lazy)->VerifyBlock(i).ok();
  EXPECT_EQ(bad, 1);
  std::remove(path.c_str());
}

TEST(ApwStore, RandomByteFlipsNeverCrashAndNeverPassSilently) {
  const auto blocks = MakeBlocks(7);
  const std::string path = TempPath("flips");
  WriteStore(path, blocks);
  const auto clean = ReadAll(path);
  std::mt19937 rng(77);
  int refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    auto bytes = clean;
    const size_t at = rng() % bytes.size();
    bytes[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    WriteAll(path, bytes);
    auto store = ApwStore::Open(path);
    if (!store.ok()) {
      ++refused;
      continue;
    }
    // Accepted: the flip must have hit alignment padding, so every block reads as written.
    for (const FakeBlock& f : blocks) {
      const BlockData* b = (*store)->Find(f.data.layer, f.data.expert, f.data.kind);
      ASSERT_NE(b, nullptr);
      for (int p = 0; p < kPlanes; ++p) {
        ASSERT_EQ(0, std::memcmp(b->planes[p], f.planes[p].data(), f.planes[p].size())) << "flip at " << at;
      }
      for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
        ASSERT_EQ(0, std::memcmp(b->luts[bits], f.luts[bits].data(), f.luts[bits].size() * 2)) << "flip at " << at;
      }
    }
  }
  EXPECT_GT(refused, 0);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace pw::apw
