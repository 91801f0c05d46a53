#include "services/proto/codec.h"

#include <capnp/dynamic.h>
#include <kj/exception.h>

#include <cstring>
#include <exception>

namespace pw::proto {

namespace {

void WalkStruct(::capnp::DynamicStruct::Reader s);

// Reads every pointer a value holds, as the schema types it. Cap'n Proto charges each list it
// reads to the reader's traversal budget, lists of void or of zero-sized structs (which claim
// any length without a byte of data) one word per element: a walk under a budget bounded by the
// frame's size refuses them.
void WalkValue(const ::capnp::DynamicValue::Reader& v) {
  switch (v.getType()) {
    case ::capnp::DynamicValue::STRUCT:
      WalkStruct(v.as<::capnp::DynamicStruct>());
      break;
    case ::capnp::DynamicValue::LIST: {
      auto list = v.as<::capnp::DynamicList>();
      const auto which = list.getSchema().whichElementType();
      if (which == ::capnp::schema::Type::STRUCT || which == ::capnp::schema::Type::LIST ||
          which == ::capnp::schema::Type::TEXT || which == ::capnp::schema::Type::DATA) {
        for (auto e : list) WalkValue(e);
      }
      break;
    }
    default:
      break;  // scalars, enums, text and data are checked when their pointer is read
  }
}

void WalkStruct(::capnp::DynamicStruct::Reader s) {
  // A group is read in place (its fields are the struct's); a pointer field only when set.
  auto walk = [&](::capnp::StructSchema::Field field) {
    if (field.getProto().isGroup() || s.has(field)) WalkValue(s.get(field));
  };
  for (auto field : s.getSchema().getNonUnionFields()) walk(field);
  KJ_IF_MAYBE(field, s.which()) { walk(*field); }
}

}  // namespace

std::string BodyName(Body::Which which) {
  switch (which) {
    case Body::NONE: return "none";
    case Body::REGISTER: return "register";
    case Body::REGISTER_ACK: return "registerAck";
    case Body::HEARTBEAT: return "heartbeat";
    case Body::NOT_REGISTERED: return "notRegistered";
    case Body::KV_RESERVE: return "kvReserve";
    case Body::KV_RESERVE_REPLY: return "kvReserveReply";
    case Body::PREFILL_REQUEST: return "prefillRequest";
    case Body::KV_READY: return "kvReady";
    case Body::START_DECODE: return "startDecode";
    case Body::TOKEN_CHUNK: return "tokenChunk";
    case Body::FINISH: return "finish";
    case Body::CANCEL: return "cancel";
    case Body::DRAIN: return "drain";
    case Body::TELEMETRY: return "telemetry";
    case Body::WEIGHT_MANIFEST_REQUEST: return "weightManifestRequest";
    case Body::WEIGHT_MANIFEST: return "weightManifest";
    case Body::PLAN: return "plan";
    case Body::PLAN_ACK: return "planAck";
    case Body::CTL_REQUEST: return "ctlRequest";
    case Body::CTL_REPLY: return "ctlReply";
    case Body::KV_RENEW: return "kvRenew";
  }
  return "unknown(" + std::to_string(static_cast<unsigned>(which)) + ")";
}

static bool KnownBody(Body::Which which) {
  return static_cast<unsigned>(which) <= static_cast<unsigned>(Body::KV_RENEW);
}

OutMessage::OutMessage()
    : builder_(std::make_unique<::capnp::MallocMessageBuilder>()),
      root_(builder_->initRoot<Envelope>()) {}

std::string Encode(OutMessage& msg, uint64_t seq, std::string_view sender, uint64_t sent_at_ms) {
  msg.root_.setVersionMajor(kProtocolMajor);
  msg.root_.setVersionMinor(kProtocolMinor);
  msg.root_.setSeq(seq);
  msg.root_.setSenderId(::capnp::Text::Reader(sender.data(), sender.size()));
  msg.root_.setSentAtMs(sent_at_ms);
  kj::Array<::capnp::word> words = ::capnp::messageToFlatArray(*msg.builder_);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

std::string DescribeCurrentException() {
  try {
    throw;
  } catch (const kj::Exception& e) {
    return std::string(e.getDescription().cStr());
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

Result<std::unique_ptr<InMessage>> InMessage::Parse(std::span<const uint8_t> bytes,
                                                    const ParseLimits& limits) {
  if (bytes.size() > limits.max_frame_bytes) {
    return OutOfRange("control frame of " + std::to_string(bytes.size()) +
                      " bytes exceeds the limit of " + std::to_string(limits.max_frame_bytes));
  }
  if (bytes.empty() || bytes.size() % sizeof(::capnp::word) != 0) {
    return Corrupt("control frame of " + std::to_string(bytes.size()) +
                   " bytes is not a whole number of 8-byte words");
  }
  std::unique_ptr<InMessage> msg(new InMessage());
  const size_t num_words = bytes.size() / sizeof(::capnp::word);
  msg->words_ = kj::heapArray<::capnp::word>(num_words);
  std::memcpy(msg->words_.begin(), bytes.data(), bytes.size());
  Status st = GuardWire("malformed control frame", [&]() -> Status {
    const kj::ArrayPtr<const ::capnp::word> words(msg->words_.begin(), num_words);
    {
      // The validation walk: follows and bounds-checks every pointer once, as the schema types
      // it, with a budget that refuses amplification (pointers that share their target, and
      // lists of void or zero-sized structs that claim millions of elements from a few bytes,
      // so that the message reads as far more words than it holds).
      ::capnp::ReaderOptions check;
      check.traversalLimitInWords = num_words * 8 + 1024;
      check.nestingLimit = limits.max_nesting;
      ::capnp::FlatArrayMessageReader validator(words, check);
      WalkStruct(validator.getRoot<::capnp::DynamicStruct>(::capnp::Schema::from<Envelope>()));
    }
    // The reader kept for the handlers. A walk of the whole message is known to cost at most
    // the budget above, so the traversal budget, which Cap'n Proto charges per reader for its
    // whole life, is lifted: a message kept and read again and again (a registration read at
    // every placement, a queued request scanned at every cancel) never runs dry.
    ::capnp::ReaderOptions opts;
    opts.traversalLimitInWords = kj::maxValue;
    opts.nestingLimit = limits.max_nesting;
    msg->reader_ = std::make_unique<::capnp::FlatArrayMessageReader>(words, opts);
    auto root = msg->reader_->getRoot<Envelope>();
    msg->root_ = root;
    msg->minor_ = root.getVersionMinor();
    if (root.getVersionMajor() != kProtocolMajor) {
      return Unsupported("protocol version " + std::to_string(root.getVersionMajor()) + "." +
                         std::to_string(root.getVersionMinor()) + " from '" +
                         ToString(root.getSenderId()) + "', this process speaks " +
                         std::to_string(kProtocolMajor) + "." + std::to_string(kProtocolMinor));
    }
    msg->which_ = root.getBody().which();
    msg->seq_ = root.getSeq();
    msg->sender_ = ToString(root.getSenderId());
    if (!KnownBody(msg->which_)) {
      return Unsupported("unknown message body " + BodyName(msg->which_) + " from '" +
                         msg->sender_ + "'");
    }
    return Status::Ok();
  });
  if (!st.ok()) return st;
  return msg;
}

}  // namespace pw::proto
