// A read-only memory mapping of a whole file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace pw {

class MmapFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE). An empty file maps to data() == nullptr, size() == 0.
  // Errors: kNotFound if the file does not exist, kIoError for other OS failures, kInvalidArgument
  // for a directory; the message names the path.
  static Result<std::unique_ptr<MmapFile>> Open(const std::string& path);
  ~MmapFile();
  MmapFile(const MmapFile&) = delete;
  MmapFile& operator=(const MmapFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MmapFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace pw
