#include "common/logging.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace pw {
namespace log_internal {
std::atomic<int> g_min_level{-1};
}  // namespace log_internal

namespace {

std::mutex& LogMutex() {
  static std::mutex m;
  return m;
}

struct LogState {
  std::string tag = "pw";
  std::function<void(std::string_view)> sink;
};

LogState& State() {
  static LogState s;
  return s;
}

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
  }
  return '?';
}

void WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w <= 0) return;  // nothing sensible to do if stderr is gone
    data += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

bool ParseLogLevel(std::string_view text, LogLevel* out) {
  std::string lower;
  for (char c : text)
    lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower == "debug") {
    *out = LogLevel::kDebug;
  } else if (lower == "info") {
    *out = LogLevel::kInfo;
  } else if (lower == "warning" || lower == "warn") {
    *out = LogLevel::kWarning;
  } else if (lower == "error") {
    *out = LogLevel::kError;
  } else {
    return false;
  }
  return true;
}

LogLevel GetLogLevel() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (log_internal::g_min_level.load() >= 0) return;  // SetLogLevel came first
    LogLevel level = LogLevel::kInfo;
    const char* env = std::getenv("PW_LOG_LEVEL");
    if (env != nullptr && !ParseLogLevel(env, &level)) {
      std::fprintf(stderr, "PW_LOG_LEVEL=%s is not one of debug|info|warning|error; using info\n",
                   env);
    }
    log_internal::g_min_level.store(static_cast<int>(level));
  });
  return static_cast<LogLevel>(log_internal::g_min_level.load(std::memory_order_relaxed));
}

void SetLogLevel(LogLevel level) {
  GetLogLevel();  // consume the environment first so it cannot override this later
  log_internal::g_min_level.store(static_cast<int>(level));
}

void SetLogProcessTag(std::string tag) {
  std::lock_guard<std::mutex> lock(LogMutex());
  State().tag = std::move(tag);
}

std::string LogSafe(std::string_view bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size());
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

void SetLogSink(std::function<void(std::string_view)> sink) {
  std::lock_guard<std::mutex> lock(LogMutex());
  State().sink = std::move(sink);
}

namespace log_internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  auto now = std::chrono::system_clock::now();
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char ts[64];
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(us % 1000000));
  std::string_view file(file_);
  size_t slash = file.rfind('/');
  if (slash != std::string_view::npos) file.remove_prefix(slash + 1);
  long tid = static_cast<long>(::syscall(SYS_gettid));

  std::lock_guard<std::mutex> lock(LogMutex());
  LogState& st = State();
  std::string line;
  line.reserve(96 + stream_.view().size());
  line += ts;
  line += ' ';
  line += LevelLetter(level_);
  line += ' ';
  line += st.tag;
  line += ' ';
  line += std::to_string(static_cast<long>(::getpid()));
  line += ':';
  line += std::to_string(tid);
  line += ' ';
  line += file;
  line += ':';
  line += std::to_string(line_);
  line += "] ";
  line += stream_.view();
  line += '\n';
  if (st.sink) {
    st.sink(line);
  } else {
    WriteAll(STDERR_FILENO, line.data(), line.size());
  }
}

}  // namespace log_internal
}  // namespace pw
