// The directory of the running executable: where a launcher finds the binaries it starts
// (pw-cluster its processes, pw its subcommands' binaries). "." when /proc/self/exe is unreadable.
#pragma once

#include <unistd.h>

#include <climits>
#include <string>

namespace pw::service {

inline std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

}  // namespace pw::service
