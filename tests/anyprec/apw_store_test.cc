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

const StoreInfo kInfo{2, 3, 40, 24, 0x1234abcd5678ef01ull, {}};

std::vector<FakeBlock> MakeBlocks(uint32_t seed, const StoreInfo& info = kInfo) {
  std::mt19937 rng(seed);
  std::vector<FakeBlock> out(info.BlockLayers().size() * kInfo.num_experts * 2);
  size_t i = 0;
  for (uint32_t l : info.BlockLayers()) {
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

void WriteStore(const std::string& path, const std::vector<FakeBlock>& blocks, const StoreInfo& info = kInfo) {
  auto w = ApwWriter::Create(path, info);
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

// A resumable writer flushed after layer 0 and dropped (a killed build), then resumed in a new
// writer that adds layer 1: the store is byte for byte the one written straight through, and
// what the first writer wrote after its flush (a block being written) is cut off.
TEST(ApwStore, AResumedWriterGivesTheStraightThroughBytes) {
  const auto blocks = MakeBlocks(9);
  const std::string straight = TempPath("straight"), resumed = TempPath("resumed");
  {
    auto w = ApwWriter::Create(straight, kInfo);
    ASSERT_TRUE(w.ok());
    for (const FakeBlock& f : blocks) ASSERT_TRUE((*w)->Add(f.data).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  const size_t per_layer = kInfo.num_experts * 2;
  ApwWriter::Progress progress;
  {
    auto w = ApwWriter::Create(resumed, kInfo, /*keep_unfinished=*/true);
    ASSERT_TRUE(w.ok());
    for (size_t i = 0; i < per_layer; ++i) ASSERT_TRUE((*w)->Add(blocks[i].data).ok());
    EXPECT_TRUE((*w)->LayerComplete(0));
    EXPECT_FALSE((*w)->LayerComplete(1));
    auto p = (*w)->Flush();
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    progress = *p;
    ASSERT_TRUE((*w)->Add(blocks[per_layer].data).ok());  // past the flush: to be cut off
  }
  ASSERT_TRUE(std::ifstream(resumed + ".tmp").good()) << "a resumable writer keeps its .tmp";
  auto w = ApwWriter::Resume(resumed, kInfo, progress);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE((*w)->LayerComplete(0));
  EXPECT_FALSE((*w)->LayerComplete(1));
  EXPECT_FALSE((*w)->Add(blocks[0].data).ok()) << "a block the progress lists is not added twice";
  for (size_t i = per_layer; i < blocks.size(); ++i) ASSERT_TRUE((*w)->Add(blocks[i].data).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_EQ(ReadAll(resumed), ReadAll(straight));
  std::remove(straight.c_str());
  std::remove(resumed.c_str());
}

// What Resume refuses, each by name: a listed block whose data changed, a progress entry
// damaged, a .tmp shorter than the progress, a .tmp that is gone.
TEST(ApwStore, ResumeRefusesADamagedOrShortTmpByName) {
  const auto blocks = MakeBlocks(10);
  const std::string path = TempPath("resume_bad"), tmp = path + ".tmp";
  ApwWriter::Progress progress;
  {
    auto w = ApwWriter::Create(path, kInfo, true);
    ASSERT_TRUE(w.ok());
    for (size_t i = 0; i < kInfo.num_experts * 2; ++i) ASSERT_TRUE((*w)->Add(blocks[i].data).ok());
    progress = *(*w)->Flush();
  }
  const std::vector<uint8_t> good = ReadAll(tmp);
  ASSERT_EQ(good.size(), progress.end);
  ASSERT_TRUE(ApwWriter::Resume(path, kInfo, progress).ok());
  WriteAll(tmp, good);

  std::vector<uint8_t> flipped = good;
  flipped[progress.end - 100] ^= 0x10;  // inside the last block's LUTs
  WriteAll(tmp, flipped);
  auto r = ApwWriter::Resume(path, kInfo, progress);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("data checksum mismatch"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("expert 2, down"), std::string::npos) << r.status().ToString();

  WriteAll(tmp, good);
  ApwWriter::Progress bad_entry = progress;
  bad_entry.table[3 * 128 + 40] ^= 1;  // block 3's calibration count
  r = ApwWriter::Resume(path, kInfo, bad_entry);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("block 3 of the progress: table entry checksum mismatch"), std::string::npos)
      << r.status().ToString();

  WriteAll(tmp, std::vector<uint8_t>(good.begin(), good.end() - 1));
  r = ApwWriter::Resume(path, kInfo, progress);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the progress needs"), std::string::npos) << r.status().ToString();

  std::remove(tmp.c_str());
  r = ApwWriter::Resume(path, kInfo, progress);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot reopen to resume"), std::string::npos) << r.status().ToString();
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

// A model whose layer 0 is dense (GLM-4.5's first_k_dense_replace): the store holds layers 1
// and 2, numbered as the model numbers them, in format version 2 with its layer list; a store
// of every layer stays version 1.
const StoreInfo kDenseFirst{3, 3, 40, 24, 0x1234abcd5678ef01ull, {1, 2}};

uint32_t HeaderVersion(const std::string& path) {
  const auto bytes = ReadAll(path);
  uint32_t v = 0;
  std::memcpy(&v, bytes.data() + 8, 4);
  return v;
}

TEST(ApwStore, DenseLayersHaveNoBlocksAndTheHeaderListsTheStoresLayers) {
  const auto blocks = MakeBlocks(11, kDenseFirst);
  ASSERT_EQ(blocks.size(), 2u * 3 * 2);
  const std::string path = TempPath("dense_first");
  WriteStore(path, blocks, kDenseFirst);
  EXPECT_EQ(HeaderVersion(path), kFormatVersion);
  auto store = ApwStore::Open(path, {true, kDenseFirst.model_hash});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const ApwStore& s = **store;
  EXPECT_EQ(s.info().num_layers, 3u);
  EXPECT_EQ(s.info().layers, (std::vector<uint32_t>{1, 2}));
  EXPECT_FALSE(s.info().HasLayer(0));
  EXPECT_TRUE(s.info().HasLayer(2));
  EXPECT_EQ(s.num_blocks(), 12);
  EXPECT_EQ(s.Find(0, 0, BlockKind::kGateUp), nullptr);
  for (const FakeBlock& f : blocks) {
    const BlockData* b = s.Find(f.data.layer, f.data.expert, f.data.kind);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->calib_tokens, f.data.calib_tokens);
    ASSERT_EQ(0, std::memcmp(b->planes[7], f.planes[7].data(), f.planes[7].size()));
  }
  EXPECT_TRUE(CheckStoreLayers(s.info(), {1, 2}, "").ok());
  Status mismatch = CheckStoreLayers(s.info(), {0, 1, 2}, "x: ");
  EXPECT_NE(mismatch.message().find("layers [1, 2], the model's MoE layers are [0, 1, 2]"), std::string::npos)
      << mismatch.ToString();

  // A full store is version 1 (what older builds read) and lists every layer on reading.
  const std::string full = TempPath("full_v1");
  WriteStore(full, MakeBlocks(12));
  EXPECT_EQ(HeaderVersion(full), kFullStoreVersion);
  auto opened = ApwStore::Open(full);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ((*opened)->info().layers, (std::vector<uint32_t>{0, 1}));
  std::remove(full.c_str());
  std::remove(path.c_str());
}

TEST(ApwStore, PartialStoresAreCompleteLayersOnly) {
  const std::string path = TempPath("partial_wrong");
  // The writer: a block of a layer outside the list, a layer missing an expert, a bad list.
  {
    auto w = ApwWriter::Create(path, kDenseFirst);
    ASSERT_TRUE(w.ok());
    auto other = MakeBlocks(13);  // layers 0 and 1
    Status st = (*w)->Add(other[0].data);
    EXPECT_NE(st.message().find("outside the store's layers [1, 2]"), std::string::npos) << st.ToString();
    auto blocks = MakeBlocks(13, kDenseFirst);
    for (size_t i = 1; i < blocks.size(); ++i) ASSERT_TRUE((*w)->Add(blocks[i].data).ok());
    st = (*w)->Finish();
    EXPECT_NE(st.message().find("layer 1, expert 0, gate_up) was never added"), std::string::npos) << st.ToString();
    StoreInfo unordered = kDenseFirst;
    unordered.layers = {2, 1};
    EXPECT_FALSE(ApwWriter::Create(path, unordered).ok());
    unordered.layers = {1, 3};
    EXPECT_FALSE(ApwWriter::Create(path, unordered).ok());
  }
  // The reader: a layer list naming a layer the table has no blocks of.
  WriteStore(path, MakeBlocks(14, kDenseFirst), kDenseFirst);
  auto bytes = ReadAll(path);
  uint64_t list_at = 0;
  std::memcpy(&list_at, bytes.data() + 88, 8);
  uint32_t zero = 0;
  std::memcpy(bytes.data() + list_at, &zero, 4);  // [0, 2]: the list's checksum now fails
  WriteAll(path, bytes);
  auto bad = ApwStore::Open(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layer list checksum"), std::string::npos) << bad.status().ToString();
  const uint32_t crc = Crc32(bytes.data() + list_at, 8);
  std::memcpy(bytes.data() + 84, &crc, 4);
  const uint32_t hcrc = Crc32(bytes.data(), 252);
  std::memcpy(bytes.data() + 252, &hcrc, 4);
  WriteAll(path, bytes);
  bad = ApwStore::Open(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layer 1 is not in the store's layers [0, 2]"), std::string::npos)
      << bad.status().ToString();
  std::remove(path.c_str());
}

TEST(ApwStore, AnUnknownVersionIsNamed) {
  const std::string path = TempPath("v3");
  WriteStore(path, MakeBlocks(15, kDenseFirst), kDenseFirst);
  auto bytes = ReadAll(path);
  const uint32_t v3 = 3;
  std::memcpy(bytes.data() + 8, &v3, 4);
  const uint32_t hcrc = Crc32(bytes.data(), 252);
  std::memcpy(bytes.data() + 252, &hcrc, 4);
  WriteAll(path, bytes);
  auto bad = ApwStore::Open(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(bad.status().message().find(".apw version 3 unsupported"), std::string::npos) << bad.status().ToString();
  std::remove(path.c_str());
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
