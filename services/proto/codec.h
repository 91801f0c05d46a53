// Encoding and decoding control-plane frames: one Cap'n Proto `Envelope` per ZeroMQ frame.
//
// Contract: Parse() never throws and never aborts on peer bytes. It bounds the frame size, the
// traversal budget and the nesting depth, copies the bytes into word-aligned storage, walks the
// whole message once (every pointer bounds-checked, amplification refused), and refuses another
// protocol major version or an unknown body member. A parsed message may be kept and read any
// number of times: its reader carries no traversal budget of its own, since the validation
// walk already bounded what one full read can cost. Reading fields of a parsed message can still meet malformed data
// (e.g. text without its NUL); handlers run inside GuardWire(), which turns a Cap'n Proto
// exception into a Status.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "services/proto/cluster.capnp.h"

namespace pw::proto {

inline constexpr uint16_t kProtocolMajor = wire::K_PROTOCOL_MAJOR;
inline constexpr uint16_t kProtocolMinor = wire::K_PROTOCOL_MINOR;

using Envelope = wire::Envelope;
using Body = wire::Envelope::Body;

// Bounds applied to every incoming frame.
struct ParseLimits {
  size_t max_frame_bytes = 64u << 20;  // larger frames are refused unread
  int max_nesting = 16;                // struct/list depth
};

// Human-readable name of a body member ("register", "tokenChunk", ...; "unknown(<n>)").
std::string BodyName(Body::Which which);

// A message being built. Envelope fields (version, seq, sender, time) are filled by Encode().
class OutMessage {
 public:
  OutMessage();
  OutMessage(const OutMessage&) = delete;
  OutMessage& operator=(const OutMessage&) = delete;

  Envelope::Builder envelope() { return root_; }
  Body::Builder body() { return root_.getBody(); }

 private:
  std::unique_ptr<::capnp::MallocMessageBuilder> builder_;
  Envelope::Builder root_;
  friend std::string Encode(OutMessage& msg, uint64_t seq, std::string_view sender,
                            uint64_t sent_at_ms);
};

// Stamps the envelope (current protocol version, seq, sender, sent_at_ms) and returns the
// frame bytes (Cap'n Proto standard framing; length is a multiple of 8).
std::string Encode(OutMessage& msg, uint64_t seq, std::string_view sender, uint64_t sent_at_ms);

// A parsed, validated frame. Owns its bytes; readers borrowed from it live as long as it does.
class InMessage {
 public:
  // Validates `bytes` as described in the file comment. Errors: kCorrupt (framing, bounds,
  // pointers), kUnsupported (another protocol major version, unknown body member),
  // kOutOfRange (frame larger than limits.max_frame_bytes).
  static Result<std::unique_ptr<InMessage>> Parse(std::span<const uint8_t> bytes,
                                                  const ParseLimits& limits = {});
  static Result<std::unique_ptr<InMessage>> Parse(std::string_view bytes,
                                                  const ParseLimits& limits = {}) {
    return Parse(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()),
                                          bytes.size()),
                 limits);
  }

  Envelope::Reader envelope() const { return root_; }
  Body::Reader body() const { return root_.getBody(); }
  Body::Which which() const { return which_; }
  uint64_t seq() const { return seq_; }
  const std::string& sender() const { return sender_; }
  uint16_t version_minor() const { return minor_; }

 private:
  InMessage() = default;
  kj::Array<::capnp::word> words_;
  std::unique_ptr<::capnp::FlatArrayMessageReader> reader_;
  Envelope::Reader root_;
  Body::Which which_ = Body::NONE;
  uint64_t seq_ = 0;
  uint16_t minor_ = 0;
  std::string sender_;
};

// Runs `fn` (returning Status), converting any Cap'n Proto or std exception raised while
// reading peer data into kCorrupt "<what>: <detail>".
template <typename F>
Status GuardWire(std::string_view what, F&& fn);

// Copies a Cap'n Proto list of scalars / Data / Text into owned C++ values.
template <typename T>
std::vector<T> ToVector(typename ::capnp::List<T>::Reader list) {
  std::vector<T> out;
  out.reserve(list.size());
  for (auto v : list) out.push_back(v);
  return out;
}
inline std::string ToString(::capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }
inline std::string ToBytes(::capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}
inline ::capnp::Data::Reader AsData(std::string_view bytes) {
  return ::capnp::Data::Reader(reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size());
}
// Fills a List(UInt32) field from a span.
template <typename ListBuilderInit>
void FillU32(ListBuilderInit&& init, std::span<const uint32_t> values) {
  auto list = init(static_cast<unsigned>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) list.set(static_cast<unsigned>(i), values[i]);
}

// Internal: formats the currently caught exception.
std::string DescribeCurrentException();

template <typename F>
Status GuardWire(std::string_view what, F&& fn) {
  try {
    return fn();
  } catch (...) {
    return Corrupt(std::string(what) + ": " + DescribeCurrentException());
  }
}

}  // namespace pw::proto
