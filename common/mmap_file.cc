#include "common/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pw {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Reads the whole of fd into anonymous memory, 2 MiB aligned, then makes it read-only.
Status CopyIn(int fd, const std::string& path, size_t size, void** base, size_t* len, const uint8_t** data) {
  const size_t rounded = (size + kHugePage - 1) / kHugePage * kHugePage;
  *len = rounded + kHugePage;  // room to align the start
  void* p = ::mmap(nullptr, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return IoError(path + ": cannot allocate " + std::to_string(size) + " bytes to copy it into: " +
                   std::strerror(err));
  }
  *base = p;
  auto* a = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + kHugePage - 1) & ~(kHugePage - 1));
  (void)::madvise(a, rounded, MADV_HUGEPAGE);  // advice only: fine where THP is off
  size_t off = 0;
  while (off < size) {
    const ssize_t n = ::pread(fd, a + off, size - off, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "the file ended early";
      ::munmap(p, *len);
      return IoError(path + ": cannot read it at byte " + std::to_string(off) + " of " +
                     std::to_string(size) + ": " + why);
    }
    off += static_cast<size_t>(n);
  }
  if (::mprotect(p, *len, PROT_READ) != 0) {
    const int err = errno;
    ::munmap(p, *len);
    return IoError(path + ": cannot make its copy read-only: " + std::strerror(err));
  }
  *data = a;
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<MmapFile>> MmapFile::Open(const std::string& path, FileLoad load) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = path + ": cannot open: " + std::strerror(err);
    return err == ENOENT ? NotFound(msg) : IoError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return IoError(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + ": not a regular file");
  }
  size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  void* base = nullptr;
  size_t len = 0;
  Status s = Status::Ok();
  if (size > 0 && load == FileLoad::kCopy) {
    s = CopyIn(fd, path, size, &base, &len, &data);
  } else if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      s = IoError(path + ": cannot mmap " + std::to_string(size) + " bytes: " + std::strerror(err));
    } else {
      data = static_cast<const uint8_t*>(p);
      base = p;
      len = size;
    }
  }
  ::close(fd);  // a mapping stays valid after close
  if (!s.ok()) return s;
  return std::unique_ptr<MmapFile>(new MmapFile(path, data, size, base, len));
}

MmapFile::~MmapFile() {
  if (map_base_ != nullptr) ::munmap(map_base_, map_len_);
}

}  // namespace pw
