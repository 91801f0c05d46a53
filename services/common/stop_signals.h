// SIGINT/SIGTERM -> a flag the service loops poll to start draining (every process's main).
#pragma once

#include <atomic>
#include <csignal>

namespace pw::service {

inline std::atomic<bool>& StopFlag() {
  static std::atomic<bool> flag{false};
  return flag;
}

inline void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { StopFlag().store(true); };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

}  // namespace pw::service
