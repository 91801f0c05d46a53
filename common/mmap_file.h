// A read-only view of a whole file: mapped from the page cache, or copied into the process's
// own memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace pw {

// How a file's bytes come into the process.
//   kMap:  mmap(PROT_READ, MAP_PRIVATE) of the file: pages shared with the page cache and
//          with every other process mapping it; nothing read until touched.
//   kCopy: read() whole into anonymous memory (2 MiB aligned, advised for huge pages), then
//          made read-only: each process holds its own copy, read once at open. Streaming it
//          is faster on some hosts (docs/benchmarks.md, "Weights copied into the process").
enum class FileLoad { kMap, kCopy };

class MmapFile {
 public:
  // Opens `path` read-only as `load` says. An empty file gives data() == nullptr, size() == 0.
  // Errors: kNotFound if the file does not exist, kIoError for other OS failures (a short
  // read included), kInvalidArgument for a directory; the message names the path.
  static Result<std::unique_ptr<MmapFile>> Open(const std::string& path, FileLoad load = FileLoad::kMap);
  ~MmapFile();
  MmapFile(const MmapFile&) = delete;
  MmapFile& operator=(const MmapFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MmapFile(std::string path, const uint8_t* data, size_t size, void* map_base, size_t map_len)
      : path_(std::move(path)), data_(data), size_(size), map_base_(map_base), map_len_(map_len) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
  void* map_base_;  // what munmap releases (the copy's region is larger than the file)
  size_t map_len_;
};

}  // namespace pw
