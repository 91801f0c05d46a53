#include "loadgen/sse_response.h"

#include <algorithm>
#include <cctype>

namespace pw::loadgen {

namespace {
constexpr size_t kMaxHead = 64 * 1024;
constexpr size_t kMaxBody = 4096;

std::string Lower(std::string_view s) {
  std::string o(s);
  for (char& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}
std::string_view TrimView(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}
}  // namespace

bool SseResponse::Fail(std::string m) {
  if (error_.empty()) error_ = std::move(m);
  return false;
}

bool SseResponse::ParseHead(std::string_view head) {
  // "HTTP/1.1 200 OK"
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  if (line.substr(0, 5) != "HTTP/" || line.size() < 12 || line[8] != ' ') {
    return Fail("bad status line '" + std::string(line.substr(0, 80)) + "'");
  }
  const bool http10 = line.substr(0, 8) == "HTTP/1.0";
  status_ = 0;
  for (size_t i = 9; i < 12; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(line[i]))) return Fail("bad status code");
    status_ = status_ * 10 + (line[i] - '0');
  }
  bool chunked = false, have_length = false;
  uint64_t length = 0;
  keep_alive_ = !http10;
  size_t pos = eol == std::string_view::npos ? head.size() : eol + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string_view::npos) e = head.size();
    std::string_view h = head.substr(pos, e - pos);
    pos = e + 2;
    if (h.empty()) continue;
    const size_t colon = h.find(':');
    if (colon == std::string_view::npos) return Fail("bad header line");
    const std::string key = Lower(TrimView(h.substr(0, colon)));
    const std::string val = Lower(TrimView(h.substr(colon + 1)));
    if (key == "content-length") {
      if (val.empty() || val.size() > 15 ||
          !std::all_of(val.begin(), val.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return Fail("bad Content-Length '" + val + "'");
      }
      have_length = true;
      length = std::stoull(val);
    } else if (key == "transfer-encoding") {
      chunked = val.find("chunked") != std::string::npos;
    } else if (key == "connection") {
      if (val.find("close") != std::string::npos) keep_alive_ = false;
      if (val.find("keep-alive") != std::string::npos) keep_alive_ = true;
    } else if (key == "content-type") {
      sse_ = val.find("text/event-stream") != std::string::npos;
    }
  }
  if (chunked) {
    state_ = State::kChunkSize;
  } else if (have_length) {
    remaining_ = length;
    state_ = length == 0 ? State::kDone : State::kLength;
  } else {
    keep_alive_ = false;
    state_ = State::kUntilClose;
  }
  return true;
}

void SseResponse::Body(std::string_view data) {
  if (!sse_ || status_ / 100 != 2) {
    body_.append(data.substr(0, kMaxBody - std::min(kMaxBody, body_.size())));
    return;
  }
  events_.append(data);
  size_t start = 0;
  while (true) {
    // Events end at a blank line; servers send "\n\n" (also accept "\r\n\r\n").
    size_t end = events_.find("\n\n", start);
    size_t sep = 2;
    const size_t crlf = events_.find("\r\n\r\n", start);
    if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
      end = crlf;
      sep = 4;
    }
    if (end == std::string::npos) break;
    std::string_view ev(events_.data() + start, end - start);
    start = end + sep;
    // One or more lines; only "data:" lines matter (joined by "\n" per the SSE spec).
    std::string joined;
    size_t lp = 0;
    bool any = false;
    while (lp <= ev.size()) {
      size_t le = ev.find('\n', lp);
      if (le == std::string_view::npos) le = ev.size();
      std::string_view l = TrimView(ev.substr(lp, le - lp));
      lp = le + 1;
      if (l.substr(0, 5) == "data:") {
        std::string_view d = l.substr(5);
        if (!d.empty() && d.front() == ' ') d.remove_prefix(1);
        if (any) joined += '\n';
        joined.append(d);
        any = true;
      }
    }
    if (any) on_event_(joined);
  }
  events_.erase(0, start);
}

bool SseResponse::Feed(std::string_view bytes) {
  while (!bytes.empty()) {
    switch (state_) {
      case State::kHeaders: {
        const size_t old = buf_.size();
        buf_.append(bytes);
        const size_t end = buf_.find("\r\n\r\n", old >= 3 ? old - 3 : 0);
        if (end == std::string::npos) {
          if (buf_.size() > kMaxHead) return Fail("response headers over 64 KiB");
          return true;
        }
        const std::string head = buf_.substr(0, end);
        const size_t used = end + 4 - old;
        buf_.clear();
        bytes.remove_prefix(used);
        if (!ParseHead(head)) return false;
        break;
      }
      case State::kChunkSize: {
        const size_t nl = bytes.find('\n');
        if (nl == std::string_view::npos) {
          buf_.append(bytes);
          if (buf_.size() > 1024) return Fail("chunk-size line too long");
          return true;
        }
        buf_.append(bytes.substr(0, nl));
        bytes.remove_prefix(nl + 1);
        std::string_view sz = TrimView(buf_);
        sz = sz.substr(0, sz.find(';'));
        uint64_t n = 0;
        if (sz.empty() || sz.size() > 15) return Fail("bad chunk size");
        for (char c : sz) {
          const int v = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                        : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
                        : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                                    : -1;
          if (v < 0) return Fail("bad chunk size '" + std::string(sz) + "'");
          n = n * 16 + static_cast<uint64_t>(v);
        }
        buf_.clear();
        remaining_ = n;
        state_ = n == 0 ? State::kTrailer : State::kChunkData;
        break;
      }
      case State::kChunkData: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(remaining_, bytes.size()));
        Body(bytes.substr(0, take));
        bytes.remove_prefix(take);
        remaining_ -= take;
        if (remaining_ == 0) state_ = State::kChunkDataEnd;
        break;
      }
      case State::kChunkDataEnd: {
        // The CRLF after a chunk's data.
        const size_t nl = bytes.find('\n');
        if (nl == std::string_view::npos) {
          if (TrimView(bytes).size() != 0) return Fail("missing CRLF after chunk");
          return true;
        }
        if (!TrimView(bytes.substr(0, nl)).empty()) return Fail("missing CRLF after chunk");
        bytes.remove_prefix(nl + 1);
        state_ = State::kChunkSize;
        break;
      }
      case State::kTrailer: {
        // Trailer lines until an empty line.
        buf_.append(bytes);
        bytes = {};
        while (true) {
          const size_t nl = buf_.find('\n');
          if (nl == std::string::npos) break;
          const bool empty = TrimView(std::string_view(buf_).substr(0, nl)).empty();
          const std::string rest = buf_.substr(nl + 1);
          buf_ = rest;
          if (empty) {
            state_ = State::kDone;
            if (!buf_.empty()) return Fail("bytes after the end of the response");
            return true;
          }
        }
        return true;
      }
      case State::kLength: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(remaining_, bytes.size()));
        Body(bytes.substr(0, take));
        bytes.remove_prefix(take);
        remaining_ -= take;
        if (remaining_ == 0) state_ = State::kDone;
        break;
      }
      case State::kUntilClose:
        Body(bytes);
        bytes = {};
        break;
      case State::kDone:
        return Fail("bytes after the end of the response");
    }
  }
  return true;
}

bool SseResponse::FinishAtEof() {
  if (state_ == State::kUntilClose) {
    if (!events_.empty()) Body("\n\n");
    state_ = State::kDone;
  }
  if (state_ != State::kDone) return Fail("connection closed before the end of the response");
  return true;
}

}  // namespace pw::loadgen
