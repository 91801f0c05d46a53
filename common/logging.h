// Leveled, thread-safe logging to stderr.
//
//   PW_LOG(INFO) << "decode worker " << id << " registered";
//   PW_LOG(WARNING) << "peer " << peer << " sent a bad message, dropped";
//
// Levels, lowest first: DEBUG, INFO, WARNING, ERROR. A statement below the current level costs
// one integer compare; its stream arguments are not evaluated. The level comes from the
// environment variable PW_LOG_LEVEL (debug | info | warning | error, case-insensitive; default
// info), read once at first use, and may be changed with SetLogLevel.
//
// Each message is written as one line with a single write, so lines from different threads
// never interleave:
//   2026-11-29T12:10:03.123456Z I router 4242:4243 router.cc:88] message
//   (UTC timestamp, level letter, process tag, pid:tid, source file:line)
// The process tag defaults to "pw"; binaries set it once at start with SetLogProcessTag.
// Logging never aborts; broken invariants use PW_CHECK from common/status.h.
#pragma once

#include <atomic>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace pw {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Level names accepted by PW_LOG(...).
namespace log_levels {
inline constexpr LogLevel DEBUG = LogLevel::kDebug;
inline constexpr LogLevel INFO = LogLevel::kInfo;
inline constexpr LogLevel WARNING = LogLevel::kWarning;
inline constexpr LogLevel ERROR = LogLevel::kError;
}  // namespace log_levels

// Current minimum level (messages below it are dropped).
LogLevel GetLogLevel();
void SetLogLevel(LogLevel level);
// Parses "debug" | "info" | "warning" | "warn" | "error" (any case). False if unknown.
bool ParseLogLevel(std::string_view text, LogLevel* out);
// Sets the process tag printed on every line (e.g. "router", "decode-1").
void SetLogProcessTag(std::string tag);
// Replaces the output (default: stderr) with `sink`, which receives each complete line
// including its trailing '\n'; an empty function restores stderr. Called under the log mutex:
// the sink must not log. Meant for tests.
void SetLogSink(std::function<void(std::string_view line)> sink);
// Bytes from outside (a peer's routing id, a name in a message) as they may appear in a line:
// printable ASCII as it is, a backslash and every other byte as \xNN, so the text can
// neither break the line nor forge another.
std::string LogSafe(std::string_view bytes);

namespace log_internal {
// Minimum level as an int; -1 until initialised from the environment.
extern std::atomic<int> g_min_level;

inline bool Enabled(LogLevel level) {
  int min = g_min_level.load(std::memory_order_relaxed);
  if (min < 0) min = static_cast<int>(GetLogLevel());
  return static_cast<int>(level) >= min;
}

// Collects one message and emits it on destruction.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// Lets the PW_LOG macro be an expression of type void in both branches.
struct Voidify {
  void operator&(std::ostream&) {}
};
}  // namespace log_internal
}  // namespace pw

#define PW_LOG(level)                                   \
  !::pw::log_internal::Enabled(::pw::log_levels::level) \
      ? (void)0                                         \
      : ::pw::log_internal::Voidify() &                 \
            ::pw::log_internal::LogMessage(::pw::log_levels::level, __FILE__, __LINE__).stream()
