// ZeroMQ transports: a ROUTER that binds (router, broker) and a DEALER that connects (workers).
//
// The ROUTER sets ZMQ_ROUTER_MANDATORY, so a frame to an unknown or vanished peer is an error
// (kUnavailable) instead of a silent drop, and ZMQ_ROUTER_HANDOVER, so a restarted worker that
// reconnects with its old routing id takes over the id. All sends are non-blocking.
#pragma once

#include <memory>
#include <string>
#include <zmq.hpp>

#include "services/transport/transport.h"

namespace pw::transport {

// Process-wide ZeroMQ context (one I/O thread).
zmq::context_t& ZmqContext();

class ZmqRouterTransport final : public Transport {
 public:
  // Binds `endpoint` ("tcp://127.0.0.1:0" picks a free port; see endpoint()).
  static Result<std::unique_ptr<ZmqRouterTransport>> Bind(const std::string& endpoint);

  Status Send(std::string_view peer, std::string_view bytes) override;
  Result<std::optional<Frame>> Recv(int timeout_ms) override;
  std::string Describe() const override { return "ROUTER " + endpoint_; }
  // The endpoint actually bound, with the port resolved.
  const std::string& endpoint() const { return endpoint_; }

 private:
  explicit ZmqRouterTransport(zmq::socket_t s) : socket_(std::move(s)) {}
  zmq::socket_t socket_;
  std::string endpoint_;
};

class ZmqDealerTransport final : public Transport {
 public:
  // Connects to `endpoint` with routing id `id` (non-empty, at most 255 bytes). ZeroMQ
  // reconnects on its own when the server restarts.
  static Result<std::unique_ptr<ZmqDealerTransport>> Connect(const std::string& endpoint,
                                                             const std::string& id);

  Status Send(std::string_view peer, std::string_view bytes) override;
  Result<std::optional<Frame>> Recv(int timeout_ms) override;
  std::string Describe() const override { return "DEALER " + id_ + " -> " + endpoint_; }
  // Closes the socket and connects a new one to the same endpoint with the same routing id.
  Status Reconnect() override;

 private:
  explicit ZmqDealerTransport(zmq::socket_t s) : socket_(std::move(s)) {}
  zmq::socket_t socket_;
  std::string endpoint_;
  std::string id_;
};

}  // namespace pw::transport
