// Whole-buffer and length-prefixed blob I/O over a pipe or socket file descriptor, for the
// processes that hand UCX coordinates to each other in tests and benchmarks.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace pw::transport {

// Writes all n bytes; false on error or a closed peer.
inline bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes; false on error, end of file, or no data for timeout_ms (< 0: wait).
inline bool ReadAll(int fd, void* p, size_t n, int timeout_ms = 30000) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, timeout_ms) <= 0) return false;
    const ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// An 8-byte length, then the bytes. ReadBlob refuses blobs over max_bytes.
inline bool WriteBlob(int fd, const std::string& s) {
  const uint64_t n = s.size();
  return WriteAll(fd, &n, 8) && WriteAll(fd, s.data(), s.size());
}
inline bool ReadBlob(int fd, std::string* s, uint64_t max_bytes = uint64_t{1} << 20,
                     int timeout_ms = 30000) {
  uint64_t n = 0;
  if (!ReadAll(fd, &n, 8, timeout_ms) || n > max_bytes) return false;
  s->resize(n);
  return ReadAll(fd, s->data(), n, timeout_ms);
}

}  // namespace pw::transport
