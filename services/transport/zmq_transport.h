// ZeroMQ transports: a ROUTER that binds (router, broker) and a DEALER that connects (workers).
//
// The ROUTER sets ZMQ_ROUTER_MANDATORY, so a frame to an unknown or vanished peer is an error
// (kUnavailable) instead of a silent drop, and ZMQ_ROUTER_HANDOVER, so a restarted worker that
// reconnects with its old routing id takes over the id. All sends are non-blocking.
//
// Authentication (control_auth.h): with CURVE keys a ROUTER is a CURVE server whose
// connections are admitted by this process's ZAP handler only with the cluster's client key,
// and a DEALER a CURVE client of the cluster's server key. The handover above happens only
// after a connection has authenticated, so without the keys no connection can take a routing
// id over.
#pragma once

#include <memory>
#include <string>
#include <zmq.hpp>

#include "services/transport/control_auth.h"
#include "services/transport/transport.h"

namespace pw::transport {

// Process-wide ZeroMQ context (one I/O thread).
zmq::context_t& ZmqContext();

class ZmqRouterTransport final : public Transport {
 public:
  // Binds `endpoint` ("tcp://127.0.0.1:0" picks a free port; see endpoint()) with the
  // process's DefaultControlAuth(), or with `auth`.
  static Result<std::unique_ptr<ZmqRouterTransport>> Bind(const std::string& endpoint);
  static Result<std::unique_ptr<ZmqRouterTransport>> Bind(const std::string& endpoint,
                                                          const ControlAuth& auth);

  Status Send(std::string_view peer, std::string_view bytes) override;
  Result<std::optional<Frame>> Recv(int timeout_ms) override;
  std::string Describe() const override {
    return std::string(secure_ ? "CURVE " : "plaintext ") + "ROUTER " + endpoint_;
  }
  // The endpoint actually bound, with the port resolved.
  const std::string& endpoint() const { return endpoint_; }

 private:
  explicit ZmqRouterTransport(zmq::socket_t s) : socket_(std::move(s)) {}
  zmq::socket_t socket_;
  std::string endpoint_;
  bool secure_ = false;
};

class ZmqDealerTransport final : public Transport {
 public:
  // Connects to `endpoint` with routing id `id` (non-empty, at most 255 bytes). ZeroMQ
  // reconnects on its own when the server restarts. Uses the process's DefaultControlAuth(),
  // or `auth`.
  static Result<std::unique_ptr<ZmqDealerTransport>> Connect(const std::string& endpoint,
                                                             const std::string& id);
  static Result<std::unique_ptr<ZmqDealerTransport>> Connect(const std::string& endpoint,
                                                             const std::string& id,
                                                             const ControlAuth& auth);

  Status Send(std::string_view peer, std::string_view bytes) override;
  Result<std::optional<Frame>> Recv(int timeout_ms) override;
  std::string Describe() const override {
    return std::string(auth_.secure() ? "CURVE " : "plaintext ") + "DEALER " + id_ + " -> " +
           endpoint_;
  }
  // Closes the socket and connects a new one to the same endpoint with the same routing id
  // and credentials.
  Status Reconnect() override;

 private:
  explicit ZmqDealerTransport(zmq::socket_t s) : socket_(std::move(s)) {}
  zmq::socket_t socket_;
  std::string endpoint_;
  std::string id_;
  ControlAuth auth_;
};

// Connections this process's ZAP handler refused (a CURVE client key that is not the
// cluster's). Handshakes that fail earlier (no CURVE at all, a wrong server key) never reach
// it and are not counted.
uint64_t ZapRefusals();

}  // namespace pw::transport
