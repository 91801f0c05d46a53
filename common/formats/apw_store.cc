#include "common/formats/apw_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/plane_layout.h"

namespace pw::apw {
namespace {

static_assert(std::endian::native == std::endian::little, ".apw is little-endian");

constexpr char kMagic[8] = {'P', 'W', 'A', 'P', 'W', '\r', '\n', '\x1a'};
constexpr size_t kHeaderBytes = 256;
constexpr size_t kEntryBytes = 128;
constexpr int kDamageSlots = 7;  // D[0], D[3..8]
constexpr int kDamageBits[kDamageSlots] = {0, 3, 4, 5, 6, 7, 8};

uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

template <typename T>
void Put(uint8_t* dst, size_t off, T v) {
  std::memcpy(dst + off, &v, sizeof v);
}
template <typename T>
T Get(const uint8_t* src, size_t off) {
  T v;
  std::memcpy(&v, src + off, sizeof v);
  return v;
}

uint64_t PlaneBytesOf(uint32_t rows, uint32_t cols) {
  return static_cast<uint64_t>(rows) * anyprec::PlaneRowBytes(static_cast<int>(cols));
}
uint64_t PlaneStride(uint32_t rows, uint32_t cols) { return AlignUp(PlaneBytesOf(rows, cols), kPartAlign); }
uint64_t LutBytes(uint32_t rows, int bits) { return static_cast<uint64_t>(rows) * (1u << bits) * 2; }
uint64_t LutOffset(uint32_t rows, uint32_t cols, int bits) {
  uint64_t off = kPlanes * PlaneStride(rows, cols);
  for (int b = kMinBits; b < bits; ++b) off += AlignUp(LutBytes(rows, b), kPartAlign);
  return off;
}

// Expected shape of a block kind.
void ExpectedShape(const StoreInfo& info, BlockKind kind, uint32_t* rows, uint32_t* cols) {
  if (kind == BlockKind::kGateUp) {
    *rows = 2 * info.ffn;
    *cols = info.hidden;
  } else {
    *rows = info.hidden;
    *cols = info.ffn;
  }
}

std::string Describe(uint32_t layer, uint32_t expert, BlockKind kind) {
  return "layer " + std::to_string(layer) + ", expert " + std::to_string(expert) + ", " +
         BlockKindName(kind);
}

}  // namespace

const char* BlockKindName(BlockKind kind) {
  return ExpertProjName(kind);
}

bool StoreInfo::HasLayer(uint32_t layer) const {
  if (layer >= num_layers) return false;
  return layers.empty() || std::binary_search(layers.begin(), layers.end(), layer);
}

std::vector<uint32_t> StoreInfo::BlockLayers() const {
  if (!layers.empty()) return layers;
  std::vector<uint32_t> all(num_layers);
  for (uint32_t l = 0; l < num_layers; ++l) all[l] = l;
  return all;
}

std::string LayerListString(const std::vector<uint32_t>& layers) {
  std::string s = "[";
  for (size_t i = 0; i < layers.size(); ++i) s += (i ? ", " : "") + std::to_string(layers[i]);
  return s + "]";
}

Status CheckStoreLayers(const StoreInfo& info, const std::vector<uint32_t>& moe_layers, const std::string& where) {
  const std::vector<uint32_t> have = info.BlockLayers();
  if (have != moe_layers) {
    return InvalidArgument(where + "the store holds expert blocks for layers " + LayerListString(have) +
                           ", the model's MoE layers are " + LayerListString(moe_layers));
  }
  return Status::Ok();
}

uint64_t BlockDataBytes(uint32_t rows, uint32_t cols) {
  return LutOffset(rows, cols, kMaxBits + 1);
}

namespace {

// One block table entry, checked as far as it goes on its own: its checksum, a block of `info`'s
// layers, the model's shape, the data size of that shape, finite non-negative damages. Where its
// data lies, and whether it repeats another entry, is the caller's to check (a reader and a
// resumed writer place regions by different rules). `where` names the entry in errors.
struct CheckedEntry {
  uint32_t layer, expert;
  BlockKind kind;
  uint32_t rows, cols, data_crc;
  uint64_t offset, bytes, calib_tokens;
  double damage[kDamageSlots];
  std::string name;  // `where` and the block's (layer, expert, kind)
};

Result<CheckedEntry> CheckEntry(const uint8_t* e, const StoreInfo& info, const std::string& where) {
  if (Get<uint32_t>(e, 124) != Crc32(e, 124)) return Corrupt(where + ": table entry checksum mismatch");
  CheckedEntry c;
  c.layer = Get<uint32_t>(e, 0);
  c.expert = Get<uint32_t>(e, 4);
  const auto kind = Get<uint32_t>(e, 8);
  if (c.layer >= info.num_layers || c.expert >= info.num_experts || kind > 1) {
    return Corrupt(where + ": (layer " + std::to_string(c.layer) + ", expert " + std::to_string(c.expert) +
                   ", kind " + std::to_string(kind) + ") out of range");
  }
  if (!info.HasLayer(c.layer)) {
    return Corrupt(where + ": layer " + std::to_string(c.layer) + " is not in the store's layers " +
                   LayerListString(info.layers));
  }
  c.kind = static_cast<BlockKind>(kind);
  c.name = where + " (" + Describe(c.layer, c.expert, c.kind) + ")";
  c.rows = Get<uint32_t>(e, 12);
  c.cols = Get<uint32_t>(e, 16);
  uint32_t rows, cols;
  ExpectedShape(info, c.kind, &rows, &cols);
  if (c.rows != rows || c.cols != cols || Get<uint32_t>(e, 20) != anyprec::PlaneRowBytes(static_cast<int>(cols))) {
    return Corrupt(c.name + ": shape " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
                   " does not match the model's " + std::to_string(rows) + "x" + std::to_string(cols));
  }
  c.offset = Get<uint64_t>(e, 24);
  c.bytes = Get<uint64_t>(e, 32);
  if (c.bytes != BlockDataBytes(rows, cols)) {
    return Corrupt(c.name + ": data region [" + std::to_string(c.offset) + ", +" + std::to_string(c.bytes) +
                   ") out of bounds or misaligned");
  }
  c.calib_tokens = Get<uint64_t>(e, 40);
  for (int sl = 0; sl < kDamageSlots; ++sl) {
    c.damage[sl] = Get<double>(e, 48 + 8 * sl);
    if (!std::isfinite(c.damage[sl]) || c.damage[sl] < 0) {
      return Corrupt(c.name + ": damage[" + std::to_string(kDamageBits[sl]) + "] is not a finite non-negative number");
    }
  }
  c.data_crc = Get<uint32_t>(e, 104);
  return c;
}

}  // namespace

// ---- Writer -------------------------------------------------------------------------------

ApwWriter::ApwWriter(std::string path, const StoreInfo& info, int fd)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), info_(info), fd_(fd) {
  seen_.assign(static_cast<size_t>(info.num_layers) * info.num_experts * 2, 0);
  end_ = kDataAlign;  // header page
}

ApwWriter::~ApwWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_ && !keep_unfinished_) ::unlink(tmp_path_.c_str());
}

Result<StoreInfo> ApwWriter::CheckedInfo(const std::string& path, const StoreInfo& given) {
  if (given.num_layers == 0 || given.num_experts == 0 || given.hidden == 0 || given.ffn == 0) {
    return InvalidArgument(path + ": store info has a zero dimension");
  }
  StoreInfo info = given;
  info.layers = given.BlockLayers();
  for (size_t i = 0; i < info.layers.size(); ++i) {
    if (info.layers[i] >= info.num_layers || (i > 0 && info.layers[i] <= info.layers[i - 1])) {
      return InvalidArgument(path + ": store layers " + LayerListString(info.layers) +
                             " are not ascending layers of a " + std::to_string(info.num_layers) + "-layer model");
    }
  }
  return info;
}

Result<std::unique_ptr<ApwWriter>> ApwWriter::Create(const std::string& path, const StoreInfo& given,
                                                     bool keep_unfinished) {
  PW_ASSIGN_OR_RETURN(StoreInfo info, CheckedInfo(path, given));
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) return IoError(tmp + ": cannot create: " + std::strerror(errno));
  std::unique_ptr<ApwWriter> w(new ApwWriter(path, info, fd));
  w->keep_unfinished_ = keep_unfinished;
  return w;
}

Result<ApwWriter::Progress> ApwWriter::Flush() {
  if (finished_ || fd_ < 0) return Internal(path_ + ": Flush after Finish");
  if (::fdatasync(fd_) != 0) return IoError(tmp_path_ + ": cannot flush: " + std::strerror(errno));
  return Progress{end_, table_};
}

bool ApwWriter::LayerComplete(uint32_t layer) const {
  if (layer >= info_.num_layers || !info_.HasLayer(layer)) return false;
  for (uint32_t e = 0; e < info_.num_experts; ++e) {
    for (auto kind : {BlockKind::kGateUp, BlockKind::kDown}) {
      if (!seen_[ExpertBlockIndex(layer, e, kind, info_.num_experts)]) return false;
    }
  }
  return true;
}

Result<std::unique_ptr<ApwWriter>> ApwWriter::Resume(const std::string& path, const StoreInfo& given,
                                                     const Progress& progress) {
  PW_ASSIGN_OR_RETURN(StoreInfo info, CheckedInfo(path, given));
  const std::string tmp = path + ".tmp";
  if (progress.table.size() % kEntryBytes != 0) {
    return Corrupt(tmp + ": the progress holds " + std::to_string(progress.table.size()) +
                   " table bytes, not whole entries");
  }
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return IoError(tmp + ": cannot reopen to resume: " + std::strerror(errno));
  std::unique_ptr<ApwWriter> w(new ApwWriter(path, info, fd));
  w->keep_unfinished_ = true;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return IoError(tmp + ": cannot stat: " + std::strerror(errno));
  if (static_cast<uint64_t>(st.st_size) < progress.end) {
    return Corrupt(tmp + ": " + std::to_string(st.st_size) + " bytes, the progress needs " +
                   std::to_string(progress.end));
  }
  std::vector<uint8_t> data;
  uint64_t end = kDataAlign;
  const size_t n = progress.table.size() / kEntryBytes;
  for (size_t i = 0; i < n; ++i) {
    const std::string where = tmp + ": block " + std::to_string(i) + " of the progress";
    PW_ASSIGN_OR_RETURN(CheckedEntry c, CheckEntry(progress.table.data() + i * kEntryBytes, info, where));
    const std::string& name = c.name;
    uint8_t& seen = w->seen_[ExpertBlockIndex(c.layer, c.expert, c.kind, info.num_experts)];
    if (seen) return Corrupt(name + ": listed twice");
    seen = 1;
    const uint64_t offset = c.offset, bytes = c.bytes;
    if (offset != AlignUp(end, kDataAlign) || offset + bytes > progress.end) {
      return Corrupt(name + ": data region [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                     ") is not where this writer puts it");
    }
    data.resize(bytes);
    for (uint64_t at = 0; at < bytes;) {
      const ssize_t r = ::pread(fd, data.data() + at, bytes - at, static_cast<off_t>(offset + at));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return IoError(name + ": cannot read its data: " + (r < 0 ? std::strerror(errno) : "end of file"));
      at += static_cast<uint64_t>(r);
    }
    if (Crc32(data.data(), data.size()) != c.data_crc) return Corrupt(name + ": data checksum mismatch");
    end = offset + bytes;
  }
  if (end != progress.end) {
    return Corrupt(tmp + ": the progress ends at " + std::to_string(progress.end) + ", its blocks at " +
                   std::to_string(end));
  }
  if (::ftruncate(fd, static_cast<off_t>(progress.end)) != 0) {
    return IoError(tmp + ": cannot cut off what followed the progress: " + std::strerror(errno));
  }
  w->end_ = progress.end;
  w->table_ = progress.table;
  return w;
}

Status ApwWriter::Write(const void* data, size_t n, uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return IoError(tmp_path_ + ": write failed: " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

Status ApwWriter::Add(const BlockData& b) {
  if (finished_ || fd_ < 0) return Internal(path_ + ": Add after Finish");
  const std::string name = Describe(b.layer, b.expert, b.kind);
  if (b.layer >= info_.num_layers || b.expert >= info_.num_experts ||
      (b.kind != BlockKind::kGateUp && b.kind != BlockKind::kDown)) {
    return InvalidArgument(path_ + ": block (" + name + ") outside the store's model");
  }
  if (!info_.HasLayer(b.layer)) {
    return InvalidArgument(path_ + ": block (" + name + ") of a layer outside the store's layers " +
                           LayerListString(info_.layers));
  }
  uint32_t rows, cols;
  ExpectedShape(info_, b.kind, &rows, &cols);
  if (b.rows != rows || b.cols != cols) {
    return InvalidArgument(path_ + ": block (" + name + ") is " + std::to_string(b.rows) + "x" +
                           std::to_string(b.cols) + ", expected " + std::to_string(rows) + "x" +
                           std::to_string(cols));
  }
  uint8_t& seen = seen_[ExpertBlockIndex(b.layer, b.expert, b.kind, info_.num_experts)];
  if (seen) return InvalidArgument(path_ + ": block (" + name + ") added twice");
  for (int p = 0; p < kPlanes; ++p) {
    if (b.planes[p] == nullptr) return InvalidArgument(path_ + ": block (" + name + ") lacks plane " + std::to_string(p));
  }
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    if (b.luts[bits] == nullptr) return InvalidArgument(path_ + ": block (" + name + ") lacks LUT " + std::to_string(bits));
  }
  for (int bits : kDamageBits) {
    if (!std::isfinite(b.damage[bits]) || b.damage[bits] < 0) {
      return InvalidArgument(path_ + ": block (" + name + ") damage[" + std::to_string(bits) + "] is not a finite non-negative number");
    }
  }
  seen = 1;
  // Assemble the block's data region in memory (it is at most a few hundred MB for the
  // largest experts) so its checksum and write are one pass each.
  const uint64_t bytes = BlockDataBytes(rows, cols);
  std::vector<uint8_t> data(bytes, 0);
  for (int p = 0; p < kPlanes; ++p) {
    std::memcpy(data.data() + p * PlaneStride(rows, cols), b.planes[p], PlaneBytesOf(rows, cols));
  }
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    std::memcpy(data.data() + LutOffset(rows, cols, bits), b.luts[bits], LutBytes(rows, bits));
  }
  const uint64_t offset = AlignUp(end_, kDataAlign);
  PW_RETURN_IF_ERROR(Write(data.data(), data.size(), offset));
  end_ = offset + bytes;

  uint8_t e[kEntryBytes] = {};
  Put<uint32_t>(e, 0, b.layer);
  Put<uint32_t>(e, 4, b.expert);
  Put<uint32_t>(e, 8, static_cast<uint32_t>(b.kind));
  Put<uint32_t>(e, 12, rows);
  Put<uint32_t>(e, 16, cols);
  Put<uint32_t>(e, 20, static_cast<uint32_t>(anyprec::PlaneRowBytes(static_cast<int>(cols))));
  Put<uint64_t>(e, 24, offset);
  Put<uint64_t>(e, 32, bytes);
  Put<uint64_t>(e, 40, b.calib_tokens);
  for (int s = 0; s < kDamageSlots; ++s) Put<double>(e, 48 + 8 * s, b.damage[kDamageBits[s]]);
  Put<uint32_t>(e, 104, Crc32(data.data(), data.size()));
  Put<uint32_t>(e, 124, Crc32(e, 124));
  table_.insert(table_.end(), e, e + kEntryBytes);
  return Status::Ok();
}

Status ApwWriter::Finish() {
  if (finished_ || fd_ < 0) return Internal(path_ + ": Finish called twice");
  for (size_t i = 0; i < seen_.size(); ++i) {
    if (!seen_[i] && info_.HasLayer(static_cast<uint32_t>(i / 2 / info_.num_experts))) {
      const auto layer = static_cast<uint32_t>(i / 2 / info_.num_experts);
      const auto expert = static_cast<uint32_t>(i / 2 % info_.num_experts);
      return InvalidArgument(path_ + ": block (" + Describe(layer, expert, static_cast<BlockKind>(i % 2)) +
                             ") was never added");
    }
  }
  const uint64_t table_offset = AlignUp(end_, kPartAlign);
  PW_RETURN_IF_ERROR(Write(table_.data(), table_.size(), table_offset));
  // Version 2's layer list follows the table; a store of every layer stays version 1.
  const bool partial = info_.layers.size() != info_.num_layers;
  const uint64_t layers_offset = table_offset + table_.size();
  std::vector<uint8_t> layer_list(partial ? info_.layers.size() * 4 : 0);
  for (size_t i = 0; partial && i < info_.layers.size(); ++i) Put<uint32_t>(layer_list.data(), 4 * i, info_.layers[i]);
  if (partial) PW_RETURN_IF_ERROR(Write(layer_list.data(), layer_list.size(), layers_offset));
  const uint64_t file_bytes = layers_offset + layer_list.size();
  uint8_t h[kHeaderBytes] = {};
  std::memcpy(h, kMagic, 8);
  Put<uint32_t>(h, 8, partial ? kFormatVersion : kFullStoreVersion);
  Put<uint32_t>(h, 12, kHeaderBytes);
  Put<uint64_t>(h, 16, file_bytes);
  Put<uint64_t>(h, 24, info_.model_hash);
  Put<uint32_t>(h, 32, info_.num_layers);
  Put<uint32_t>(h, 36, info_.num_experts);
  Put<uint32_t>(h, 40, info_.hidden);
  Put<uint32_t>(h, 44, info_.ffn);
  Put<uint32_t>(h, 48, static_cast<uint32_t>(table_.size() / kEntryBytes));
  Put<uint32_t>(h, 52, kEntryBytes);
  Put<uint64_t>(h, 56, table_offset);
  Put<uint32_t>(h, 64, kMinBits);
  Put<uint32_t>(h, 68, kMaxBits);
  Put<uint32_t>(h, 72, kDataAlign);
  Put<uint32_t>(h, 76, Crc32(table_.data(), table_.size()));
  if (partial) {
    Put<uint32_t>(h, 80, static_cast<uint32_t>(info_.layers.size()));
    Put<uint32_t>(h, 84, Crc32(layer_list.data(), layer_list.size()));
    Put<uint64_t>(h, 88, layers_offset);
  }
  Put<uint32_t>(h, 252, Crc32(h, 252));
  PW_RETURN_IF_ERROR(Write(h, kHeaderBytes, 0));
  if (::ftruncate(fd_, static_cast<off_t>(file_bytes)) != 0 || ::fsync(fd_) != 0) {
    return IoError(tmp_path_ + ": cannot flush: " + std::strerror(errno));
  }
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return IoError(path_ + ": cannot rename from " + tmp_path_ + ": " + std::strerror(errno));
  }
  finished_ = true;
  return Status::Ok();
}

// ---- Reader -------------------------------------------------------------------------------

ApwStore::~ApwStore() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

const BlockData* ApwStore::Find(uint32_t layer, uint32_t expert, BlockKind kind) const {
  if (layer >= info_.num_layers || expert >= info_.num_experts) return nullptr;  // absent layers: index_ is -1
  const auto k = static_cast<uint32_t>(kind);
  if (k > 1) return nullptr;
  const int32_t i = index_[ExpertBlockIndex(layer, expert, kind, info_.num_experts)];
  return i < 0 ? nullptr : &blocks_[i];
}

std::string ApwStore::BlockName(int i) const {
  const BlockData& b = blocks_[i];
  return "block " + std::to_string(i) + " (" + Describe(b.layer, b.expert, b.kind) + ")";
}

Status ApwStore::VerifyBlock(int i) const {
  if (Crc32(map_ + data_offset_[i], data_bytes_[i]) != data_crc_[i]) {
    return Corrupt(path_ + ": " + BlockName(i) + ": data checksum mismatch (corrupt store)");
  }
  return Status::Ok();
}

Result<std::unique_ptr<ApwStore>> ApwStore::Open(const std::string& path, const Options& options) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return errno == ENOENT ? NotFound(path + ": no such store")
                           : IoError(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return IoError(path + ": cannot stat: " + std::strerror(errno));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderBytes) {
    ::close(fd);
    return Corrupt(path + ": truncated: " + std::to_string(size) + " bytes, smaller than the header");
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return IoError(path + ": mmap failed: " + std::strerror(errno));
  std::unique_ptr<ApwStore> s(new ApwStore());
  s->path_ = path;
  s->map_ = static_cast<const uint8_t*>(m);
  s->map_bytes_ = size;
  const uint8_t* h = s->map_;

  if (std::memcmp(h, kMagic, 8) != 0) return Corrupt(path + ": not an .apw store (bad magic)");
  const auto version = Get<uint32_t>(h, 8);
  if (version != kFormatVersion && version != kFullStoreVersion) {
    return Unsupported(path + ": .apw version " + std::to_string(version) + " unsupported, this build reads versions " +
                       std::to_string(kFullStoreVersion) + " and " + std::to_string(kFormatVersion));
  }
  if (Get<uint32_t>(h, 252) != Crc32(h, 252)) return Corrupt(path + ": header checksum mismatch");
  if (Get<uint32_t>(h, 12) != kHeaderBytes || Get<uint32_t>(h, 52) != kEntryBytes ||
      Get<uint32_t>(h, 64) != kMinBits || Get<uint32_t>(h, 68) != kMaxBits ||
      Get<uint32_t>(h, 72) != kDataAlign) {
    return Corrupt(path + ": header has unexpected layout constants");
  }
  const auto file_bytes = Get<uint64_t>(h, 16);
  if (file_bytes != size) {
    return Corrupt(path + ": " + (size < file_bytes ? "truncated" : "has trailing bytes") + ": " +
                   std::to_string(size) + " bytes, header says " + std::to_string(file_bytes));
  }
  StoreInfo& info = s->info_;
  info.model_hash = Get<uint64_t>(h, 24);
  info.num_layers = Get<uint32_t>(h, 32);
  info.num_experts = Get<uint32_t>(h, 36);
  info.hidden = Get<uint32_t>(h, 40);
  info.ffn = Get<uint32_t>(h, 44);
  if (options.expected_model_hash && *options.expected_model_hash != info.model_hash) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "model hash %016llx, expected %016llx",
                  static_cast<unsigned long long>(info.model_hash),
                  static_cast<unsigned long long>(*options.expected_model_hash));
    return InvalidArgument(path + ": store was made for another model (" + buf + ")");
  }
  constexpr uint32_t kMaxDim = 1u << 20;
  if (info.num_layers == 0 || info.num_experts == 0 || info.hidden == 0 || info.ffn == 0 ||
      info.num_layers > 4096 || info.num_experts > 65536 || info.hidden > kMaxDim || info.ffn > kMaxDim) {
    return Corrupt(path + ": implausible model dimensions in header");
  }
  if (version == kFullStoreVersion) {
    info.layers = info.BlockLayers();
  } else {
    // The layer list: ascending layers of the model, each with all its experts' blocks.
    const auto count = Get<uint32_t>(h, 80);
    const auto offset = Get<uint64_t>(h, 88);
    if (count == 0 || count > info.num_layers || offset < kHeaderBytes || offset > size ||
        (size - offset) / 4 < count) {
      return Corrupt(path + ": layer list (" + std::to_string(count) + " layers at " + std::to_string(offset) +
                     ") out of bounds");
    }
    if (Crc32(h + offset, static_cast<size_t>(count) * 4) != Get<uint32_t>(h, 84)) {
      return Corrupt(path + ": layer list checksum mismatch");
    }
    for (uint32_t i = 0; i < count; ++i) {
      const auto l = Get<uint32_t>(h, offset + 4 * i);
      if (l >= info.num_layers || (i > 0 && l <= info.layers.back())) {
        return Corrupt(path + ": layer list entry " + std::to_string(i) + " (layer " + std::to_string(l) +
                       ") is not an ascending layer of the " + std::to_string(info.num_layers) + "-layer model");
      }
      info.layers.push_back(l);
    }
  }
  const uint64_t expected_blocks = static_cast<uint64_t>(info.layers.size()) * info.num_experts * 2;
  const auto num_blocks = Get<uint32_t>(h, 48);
  if (num_blocks != expected_blocks) {
    return Corrupt(path + ": " + std::to_string(num_blocks) + " blocks, the store's " +
                   std::to_string(info.layers.size()) + " layers need " + std::to_string(expected_blocks));
  }
  const auto table_offset = Get<uint64_t>(h, 56);
  const uint64_t table_bytes = static_cast<uint64_t>(num_blocks) * kEntryBytes;
  if (table_offset < kHeaderBytes || table_offset > size || size - table_offset < table_bytes) {
    return Corrupt(path + ": block table out of bounds");
  }
  const uint8_t* table = h + table_offset;
  if (Crc32(table, table_bytes) != Get<uint32_t>(h, 76)) {
    // Find the first bad entry, to name it.
    for (uint32_t i = 0; i < num_blocks; ++i) {
      const uint8_t* e = table + i * kEntryBytes;
      if (Get<uint32_t>(e, 124) != Crc32(e, 124)) {
        return Corrupt(path + ": block " + std::to_string(i) + ": table entry checksum mismatch");
      }
    }
    return Corrupt(path + ": block table checksum mismatch");
  }
  s->blocks_.resize(num_blocks);
  s->data_crc_.resize(num_blocks);
  s->data_offset_.resize(num_blocks);
  s->data_bytes_.resize(num_blocks);
  s->index_.assign(static_cast<size_t>(info.num_layers) * info.num_experts * 2, -1);
  for (uint32_t i = 0; i < num_blocks; ++i) {
    PW_ASSIGN_OR_RETURN(CheckedEntry c, CheckEntry(table + i * kEntryBytes, info, path + ": block " + std::to_string(i)));
    const std::string& name = c.name;
    int32_t& slot = s->index_[ExpertBlockIndex(c.layer, c.expert, c.kind, info.num_experts)];
    if (slot >= 0) return Corrupt(name + ": duplicate of block " + std::to_string(slot));
    slot = static_cast<int32_t>(i);
    const uint64_t offset = c.offset, bytes = c.bytes;
    if (offset % kDataAlign != 0 || offset < kHeaderBytes || offset > table_offset || table_offset - offset < bytes) {
      return Corrupt(name + ": data region [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                     ") out of bounds or misaligned");
    }
    BlockData& b = s->blocks_[i];
    b.layer = c.layer;
    b.expert = c.expert;
    b.kind = c.kind;
    b.rows = c.rows;
    b.cols = c.cols;
    b.calib_tokens = c.calib_tokens;
    for (int sl = 0; sl < kDamageSlots; ++sl) b.damage[kDamageBits[sl]] = c.damage[sl];
    s->data_offset_[i] = offset;
    s->data_bytes_[i] = bytes;
    s->data_crc_[i] = c.data_crc;
    const uint32_t rows = c.rows, cols = c.cols;
    const uint8_t* data = h + offset;
    for (int p = 0; p < kPlanes; ++p) b.planes[p] = data + p * PlaneStride(rows, cols);
    for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
      b.luts[bits] = reinterpret_cast<const uint16_t*>(data + LutOffset(rows, cols, bits));
    }
  }
  // Data regions must not overlap one another.
  std::vector<std::pair<uint64_t, uint32_t>> order;
  for (uint32_t i = 0; i < num_blocks; ++i) order.emplace_back(s->data_offset_[i], i);
  std::sort(order.begin(), order.end());
  for (size_t k = 1; k < order.size(); ++k) {
    const uint32_t prev = order[k - 1].second;
    if (s->data_offset_[prev] + s->data_bytes_[prev] > order[k].first) {
      return Corrupt(path + ": " + s->BlockName(static_cast<int>(order[k].second)) + ": data overlaps " +
                     s->BlockName(static_cast<int>(prev)));
    }
  }
  if (options.verify_data) {
    for (uint32_t i = 0; i < num_blocks; ++i) PW_RETURN_IF_ERROR(s->VerifyBlock(static_cast<int>(i)));
  }
  return s;
}

std::vector<double> CalibrationShares(const ApwStore& store) {
  const StoreInfo& info = store.info();
  std::vector<double> layer_tokens(static_cast<size_t>(info.num_layers) * 2, 0.0);
  auto slot = [](const BlockData& b) { return static_cast<size_t>(b.layer) * 2 + static_cast<uint32_t>(b.kind); };
  for (int i = 0; i < store.num_blocks(); ++i) {
    layer_tokens[slot(store.block(i))] += static_cast<double>(store.block(i).calib_tokens);
  }
  std::vector<double> share(static_cast<size_t>(store.num_blocks()));
  for (int i = 0; i < store.num_blocks(); ++i) {
    const BlockData& b = store.block(i);
    share[i] = (static_cast<double>(b.calib_tokens) + 1) / (layer_tokens[slot(b)] + info.num_experts) *
               info.num_experts;
  }
  return share;
}

}  // namespace pw::apw
