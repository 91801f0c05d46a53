// libFuzzer target: the .apw store reader (header, block table, block data) on arbitrary bytes.
// The first input byte is a mode: bit 0 repairs the checksums (every entry's data and entry
// CRC, the table CRC, the header CRC) and bit 1 sets file_bytes to the real size, so mutations
// reach the checks behind them. An accepted store must keep the reader's promises: every block
// of (layer, expert, kind) present once, its planes and LUTs inside the mapping.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/formats/apw_store.h"
#include "common/logging.h"

namespace {

uint32_t Get32(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}
uint64_t Get64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}
void Put32(std::string& s, size_t at, uint32_t v) { std::memcpy(&s[at], &v, 4); }
void Put64(std::string& s, size_t at, uint64_t v) { std::memcpy(&s[at], &v, 8); }

// Offsets from docs/formats.md (.apw, version 1).
constexpr size_t kHeaderBytes = 256, kEntryBytes = 128;

void Repair(std::string& s, bool fix_size) {
  if (s.size() < kHeaderBytes) return;
  if (fix_size) Put64(s, 16, s.size());
  const uint64_t n = Get32(s, 48), table = Get64(s, 56);
  if (n > 0 && n < 100000 && table <= s.size() && n * kEntryBytes <= s.size() - table) {
    for (uint64_t i = 0; i < n; ++i) {
      const size_t e = table + i * kEntryBytes;
      const uint64_t off = Get64(s, e + 24), bytes = Get64(s, e + 32);
      if (off <= s.size() && bytes <= s.size() - off) {
        Put32(s, e + 104, pw::apw::Crc32(s.data() + off, bytes));
      }
      Put32(s, e + 124, pw::apw::Crc32(s.data() + e, 124));
    }
    Put32(s, 76, pw::apw::Crc32(s.data() + table, n * kEntryBytes));
  }
  Put32(s, 252, pw::apw::Crc32(s.data(), 252));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode & 1) Repair(bytes, (mode & 2) != 0);
  // The reader maps a path: an anonymous memory file stands in.
  static int fd = memfd_create("apw-fuzz", 0);
  PW_CHECK(fd >= 0);
  PW_CHECK(ftruncate(fd, 0) == 0);
  PW_CHECK(pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  pw::apw::ApwStore::Options opt;
  opt.verify_data = (mode & 4) == 0;
  auto store = pw::apw::ApwStore::Open(path, opt);
  if (!store.ok()) {
    PW_CHECK(!store.status().message().empty());
    return 0;
  }
  const auto& info = (*store)->info();
  PW_CHECK(static_cast<uint64_t>((*store)->num_blocks()) ==
           uint64_t{info.num_layers} * info.num_experts * 2);
  for (int i = 0; i < (*store)->num_blocks(); ++i) {
    const pw::apw::BlockData& b = (*store)->block(i);
    PW_CHECK((*store)->Find(b.layer, b.expert, b.kind) == &b);
    const size_t plane = static_cast<size_t>(b.rows) * pw::anyprec::PlaneRowBytes(b.cols);
    volatile uint8_t sink = 0;
    for (int p = 0; p < pw::apw::kPlanes; ++p) {
      PW_CHECK(b.planes[p] != nullptr);
      if (plane > 0) sink = sink ^ b.planes[p][0] ^ b.planes[p][plane - 1];  // ASan: in bounds
    }
    for (int w = pw::apw::kMinBits; w <= pw::apw::kMaxBits; ++w) {
      PW_CHECK(b.luts[w] != nullptr);
      const size_t n = static_cast<size_t>(b.rows) << w;
      if (n > 0) sink = sink ^ static_cast<uint8_t>(b.luts[w][0] ^ b.luts[w][n - 1]);
    }
    (void)sink;
    PW_CHECK((*store)->VerifyBlock(i).ok() || !opt.verify_data);
  }
  return 0;
}

// A valid two-expert store, written by the real writer, in repair mode.
std::vector<std::string> PwFuzzSeeds() {
  pw::apw::StoreInfo info{1, 2, 16, 8, 0x1234};
  const std::string path = "/tmp/pw-apw-fuzz-seed-" + std::to_string(getpid()) + ".apw";
  auto w = pw::apw::ApwWriter::Create(path, info);
  PW_CHECK(w.ok());
  std::mt19937 rng(7);
  std::vector<std::vector<uint8_t>> keep;
  for (uint32_t e = 0; e < info.num_experts; ++e) {
    for (auto kind : {pw::apw::BlockKind::kGateUp, pw::apw::BlockKind::kDown}) {
      pw::apw::BlockData b;
      b.layer = 0;
      b.expert = e;
      b.kind = kind;
      b.rows = kind == pw::apw::BlockKind::kGateUp ? 2 * info.ffn : info.hidden;
      b.cols = kind == pw::apw::BlockKind::kGateUp ? info.hidden : info.ffn;
      const size_t plane = b.rows * pw::anyprec::PlaneRowBytes(b.cols);
      for (int p = 0; p < pw::apw::kPlanes; ++p) {
        keep.emplace_back(plane);
        for (auto& v : keep.back()) v = static_cast<uint8_t>(rng());
        b.planes[p] = keep.back().data();
      }
      for (int bits = pw::apw::kMinBits; bits <= pw::apw::kMaxBits; ++bits) {
        keep.emplace_back((static_cast<size_t>(b.rows) << bits) * 2);
        for (auto& v : keep.back()) v = static_cast<uint8_t>(rng() & 0x3f);
        b.luts[bits] = reinterpret_cast<const uint16_t*>(keep.back().data());
        b.damage[bits] = 1.0 / bits;
      }
      b.calib_tokens = 10 + e;
      PW_CHECK((*w)->Add(b).ok());
    }
  }
  PW_CHECK((*w)->Finish().ok());
  std::ifstream f(path, std::ios::binary);
  std::string store((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  unlink(path.c_str());
  return {std::string(1, '\x01') + store, std::string(1, '\x03') + store,
          std::string(1, '\x05') + store.substr(0, 4096)};
}
