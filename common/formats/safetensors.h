// Safetensors checkpoints: a validating mmap reader, sharded checkpoints, and a writer.
//
// File layout (https://huggingface.co/docs/safetensors):
//   [8 bytes: N, little-endian u64][N bytes: JSON header][data section]
// The JSON header is an object: tensor name -> {"dtype": "BF16", "shape": [d0, ...],
// "data_offsets": [begin, end]} with offsets in bytes relative to the start of the data section,
// plus an optional "__metadata__" object of string -> string.
//
// Everything read from a file is validated before use (ParseSafetensorsHeader): a file that is
// truncated, lies about its header length or offsets, has overlapping tensors, an unknown dtype,
// a negative or overflowing shape, or a byte size that does not match dtype x shape is refused
// with a kCorrupt / kUnsupported Status naming the file and the tensor or field. No exception
// escapes, and no input makes the reader crash or read out of bounds.
//
// TensorView data is not aligned beyond what the file gives: files written by SafetensorsWriter
// place every tensor at a multiple of its element size (from an 8-byte aligned data section);
// other files may not, so read multi-byte elements with memcpy or 16-bit loads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"
#include "common/mmap_file.h"
#include "common/status.h"

namespace pw {

// Largest JSON header accepted (same cap as the reference implementation): 100 MB.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Non-owning view of one tensor's bytes; valid while the object it came from lives.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;     // row-major, outermost first; [] is a scalar
  const uint8_t* data = nullptr;  // nbytes bytes (nullptr allowed when nbytes == 0)
  size_t nbytes = 0;              // == numel() * DTypeSize(dtype)

  int64_t numel() const;
};

// "[2, 3]"; "[]" for a scalar.
std::string ShapeToString(const std::vector<int64_t>& shape);

// A header entry after validation. Offsets are absolute in the file.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute byte offset in the file (8 + N + data_offsets[0])
  uint64_t nbytes = 0;  // data_offsets[1] - data_offsets[0]
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;        // sorted by name
  std::map<std::string, std::string> metadata;  // the "__metadata__" object, if any
  uint64_t data_start = 0;                      // 8 + N
};

// Parses and fully validates the header of a safetensors image of `size` bytes at `data`.
// `label` (usually the path) starts every error message. Pure function of its input: the
// fuzz target calls it directly.
Result<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, size_t size,
                                                 std::string_view label);

// One mmapped (or copied: FileLoad), validated .safetensors file.
class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path,
                                                       FileLoad load = FileLoad::kMap);

  const std::string& path() const { return file_->path(); }
  // All tensor names, sorted.
  std::vector<std::string> TensorNames() const;
  bool Has(std::string_view name) const;
  // kNotFound "missing tensor X in <path>" if absent.
  Result<TensorView> Get(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  size_t size() const { return file_->size(); }

 private:
  SafetensorsFile(std::unique_ptr<MmapFile> file, SafetensorsHeader header);
  TensorView ViewOf(const SafetensorsEntry& e) const;
  std::unique_ptr<MmapFile> file_;
  SafetensorsHeader header_;
  std::unordered_map<std::string_view, size_t> index_;  // name -> header_.tensors position
};

// A Hugging Face checkpoint directory: model.safetensors, or the shards listed in
// model.safetensors.index.json ({"weight_map": {tensor: shard file name}}). When both exist
// the single file wins. Every shard of the index must exist, be a valid safetensors file and
// hold every tensor the index assigns to it; shard names must be plain file names inside `dir`.
class Checkpoint {
 public:
  // `load`: every file mapped, or copied into the process (common/mmap_file.h).
  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& dir, FileLoad load = FileLoad::kMap);

  const std::string& dir() const { return dir_; }
  std::vector<std::string> TensorNames() const;  // sorted
  bool Has(std::string_view name) const;
  // kNotFound "missing tensor X in <dir>".
  Result<TensorView> Get(std::string_view name) const;
  // As Get, and also checks the tensor's dtype and shape: kInvalidArgument
  // "tensor X in <dir> has shape [..], expected [..]" or "... has dtype F32, expected BF16".
  Result<TensorView> Get(std::string_view name, DType dtype,
                         const std::vector<int64_t>& shape) const;
  // Sum of the sizes of all files mapped.
  size_t total_bytes() const;

 private:
  Checkpoint() = default;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor name -> files_ index
};

// Builds a safetensors file and writes it atomically (to "<path>.tmp.<pid>", then rename).
// Tensors are laid out by descending element size, then insertion order, so every tensor
// starts at a multiple of its element size.
class SafetensorsWriter {
 public:
  // Fills exactly nbytes bytes at dst. Called once, during Write.
  using FillFn = std::function<void(uint8_t* dst, size_t nbytes)>;

  // Copies `nbytes` bytes from `data`. kInvalidArgument if the name is empty, duplicated or
  // "__metadata__", a dimension is negative, or nbytes != numel * DTypeSize(dtype).
  Status Add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data,
             size_t nbytes);
  // Like Add, but the bytes are produced by `fill` while writing, one tensor in memory at a time
  // (for multi-GB files).
  Status AddLazy(std::string name, DType dtype, std::vector<int64_t> shape, FillFn fill);
  void SetMetadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }
  // Writes the file. kIoError naming the path on failure (the temporary file is removed).
  Status Write(const std::string& path) const;

 private:
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    size_t nbytes;
    std::vector<uint8_t> bytes;  // used when fill is empty
    FillFn fill;
  };
  Status Check(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
               size_t* nbytes) const;
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace pw
