// Transport: moves opaque control-plane frames between this process and its peers.
//
// One implementation per fabric (ZeroMQ ROUTER/DEALER here) plus decorators (fault injection).
// A Transport is used from one thread at a time.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pw::transport {

// One received frame. `peer` is the sender's routing id on a ROUTER transport, empty on a
// DEALER (whose only peer is the server it connected to).
struct Frame {
  std::string peer;
  std::string bytes;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Queues one frame for `peer` (ignored by a DEALER) without blocking.
  // Errors: kUnavailable when the peer is unknown or unreachable, kResourceExhausted when its
  // queue is at the high-water mark, kIoError on a socket failure.
  virtual Status Send(std::string_view peer, std::string_view bytes) = 0;

  // Waits up to `timeout_ms` (0 = poll, negative = forever) for one frame; nullopt on timeout.
  virtual Result<std::optional<Frame>> Recv(int timeout_ms) = 0;

  // What this transport is bound or connected to ("tcp://127.0.0.1:5555"), for logs.
  virtual std::string Describe() const = 0;

  // Drops the connection to the server and opens a new one (a connecting transport; others do
  // nothing). Frames queued on the old one are lost. A client calls it when the server has
  // been silent for a while: a peer that took over its routing id (ZMQ_ROUTER_HANDOVER) has
  // silenced the old connection for good, and a new one takes the id back.
  virtual Status Reconnect() { return Status::Ok(); }
};

}  // namespace pw::transport
