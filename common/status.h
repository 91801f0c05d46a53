// Status and Result<T>: how recoverable errors travel in PagedWeight.
//
// Three kinds of error (docs/STYLE): a recoverable one (bad input, peer, file, config, capacity)
// is returned as a Status or Result<T> carrying a message a user can act on; a broken invariant
// aborts with file:line (PW_CHECK); bytes from a peer or a file are validated, never asserted on.
// No exceptions cross a library boundary.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace pw {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,    // the caller's input is malformed (bad prompt, bad option, bad request)
  kNotFound,           // a named file, tensor, key or request does not exist
  kIoError,            // the OS refused a read/write/mmap
  kCorrupt,            // a file or message failed validation (bounds, checksum, magic)
  kUnsupported,        // valid but not handled (unknown model_type, dtype)
  kOutOfRange,         // a value outside its allowed range (prompt longer than context)
  kResourceExhausted,  // a pool, queue or budget is full
  kUnavailable,        // a peer or service is not reachable now; retrying may help
  kCancelled,          // the work was cancelled by its owner
  kDeadlineExceeded,   // the work ran past its deadline
  kInternal,           // a bug surfaced as data rather than an abort
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", for logs and CLI errors.
  std::string ToString() const;
  // Returns a copy whose message is "prefix: message" (adds context on the way up).
  Status WithContext(std::string_view prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from OK");
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, const char* msg);

}  // namespace pw

// Broken invariant: abort with file:line. Never use on bytes from a peer or a file.
#define PW_CHECK(cond)                                                \
  do {                                                                \
    if (!(cond)) ::pw::CheckFailed(__FILE__, __LINE__, #cond, "");    \
  } while (0)
#define PW_CHECK_MSG(cond, msg)                                       \
  do {                                                                \
    if (!(cond)) ::pw::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

// Propagate a non-OK Status from an expression returning Status.
#define PW_RETURN_IF_ERROR(expr)            \
  do {                                      \
    ::pw::Status pw_status_ = (expr);       \
    if (!pw_status_.ok()) return pw_status_; \
  } while (0)

#define PW_CONCAT_INNER(a, b) a##b
#define PW_CONCAT(a, b) PW_CONCAT_INNER(a, b)
// `PW_ASSIGN_OR_RETURN(auto x, F());` declares x from a Result or returns its Status.
#define PW_ASSIGN_OR_RETURN(lhs, expr) \
  PW_ASSIGN_OR_RETURN_IMPL(PW_CONCAT(pw_result_, __LINE__), lhs, expr)
#define PW_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
