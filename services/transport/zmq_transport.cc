#include "services/transport/zmq_transport.h"

#include <vector>

namespace pw::transport {

zmq::context_t& ZmqContext() {
  static zmq::context_t* ctx = new zmq::context_t(1);  // never destroyed: sockets may outlive main
  return *ctx;
}

namespace {

Status FromZmqError(const zmq::error_t& e, std::string_view what) {
  if (e.num() == EHOSTUNREACH) return Unavailable(std::string(what) + ": peer unknown or gone");
  if (e.num() == EAGAIN) return ResourceExhausted(std::string(what) + ": send queue full");
  return IoError(std::string(what) + ": " + e.what());
}

// Receives all parts of one multipart message (non-blocking after the first part).
Result<std::vector<zmq::message_t>> RecvMultipart(zmq::socket_t& s, int timeout_ms) {
  std::vector<zmq::message_t> parts;
  try {
    zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
    int n = zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    if (n <= 0) return parts;
    while (true) {
      zmq::message_t m;
      auto r = s.recv(m, zmq::recv_flags::dontwait);
      if (!r) break;
      bool more = m.more();
      parts.push_back(std::move(m));
      if (!more) break;
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return parts;
    return IoError(std::string("zmq recv: ") + e.what());
  }
  return parts;
}

}  // namespace

Result<std::unique_ptr<ZmqRouterTransport>> ZmqRouterTransport::Bind(const std::string& endpoint) {
  try {
    zmq::socket_t s(ZmqContext(), zmq::socket_type::router);
    s.set(zmq::sockopt::router_mandatory, 1);
    s.set(zmq::sockopt::router_handover, 1);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndhwm, 100000);
    s.set(zmq::sockopt::rcvhwm, 100000);
    s.bind(endpoint);
    std::unique_ptr<ZmqRouterTransport> t(new ZmqRouterTransport(std::move(s)));
    t->endpoint_ = t->socket_.get(zmq::sockopt::last_endpoint);
    return t;
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot bind ROUTER to '" + endpoint + "': " + e.what());
  }
}

Status ZmqRouterTransport::Send(std::string_view peer, std::string_view bytes) {
  if (peer.empty()) return InvalidArgument("ROUTER send needs a peer id");
  try {
    auto r = socket_.send(zmq::buffer(peer.data(), peer.size()),
                          zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (!r) return ResourceExhausted("send to '" + std::string(peer) + "': queue full");
    r = socket_.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::dontwait);
    if (!r) return ResourceExhausted("send to '" + std::string(peer) + "': queue full");
  } catch (const zmq::error_t& e) {
    return FromZmqError(e, "send to '" + std::string(peer) + "'");
  }
  return Status::Ok();
}

Result<std::optional<Frame>> ZmqRouterTransport::Recv(int timeout_ms) {
  PW_ASSIGN_OR_RETURN(auto parts, RecvMultipart(socket_, timeout_ms));
  if (parts.empty()) return std::optional<Frame>();
  Frame f;
  f.peer = parts[0].to_string();
  // Expected [id, payload]; anything else is handed up as an empty frame for the codec to refuse.
  if (parts.size() == 2) f.bytes = parts[1].to_string();
  return std::optional<Frame>(std::move(f));
}

Status ZmqDealerTransport::Reconnect() {
  auto fresh = Connect(endpoint_, id_);
  if (!fresh.ok()) return fresh.status();
  socket_ = std::move((*fresh)->socket_);  // the old socket closes (linger 0)
  return Status::Ok();
}

Result<std::unique_ptr<ZmqDealerTransport>> ZmqDealerTransport::Connect(const std::string& endpoint,
                                                                        const std::string& id) {
  if (id.empty() || id.size() > 255) return InvalidArgument("DEALER id must be 1..255 bytes");
  try {
    zmq::socket_t s(ZmqContext(), zmq::socket_type::dealer);
    s.set(zmq::sockopt::routing_id, id);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndhwm, 100000);
    s.set(zmq::sockopt::rcvhwm, 100000);
    s.set(zmq::sockopt::reconnect_ivl, 100);
    s.set(zmq::sockopt::reconnect_ivl_max, 1000);
    s.connect(endpoint);
    std::unique_ptr<ZmqDealerTransport> t(new ZmqDealerTransport(std::move(s)));
    t->endpoint_ = endpoint;
    t->id_ = id;
    return t;
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot connect DEALER to '" + endpoint + "': " + e.what());
  }
}

Status ZmqDealerTransport::Send(std::string_view, std::string_view bytes) {
  try {
    auto r = socket_.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::dontwait);
    if (!r) return ResourceExhausted("send to " + endpoint_ + ": queue full or not connected");
  } catch (const zmq::error_t& e) {
    return FromZmqError(e, "send to " + endpoint_);
  }
  return Status::Ok();
}

Result<std::optional<Frame>> ZmqDealerTransport::Recv(int timeout_ms) {
  PW_ASSIGN_OR_RETURN(auto parts, RecvMultipart(socket_, timeout_ms));
  if (parts.empty()) return std::optional<Frame>();
  Frame f;
  if (parts.size() == 1) f.bytes = parts[0].to_string();
  return std::optional<Frame>(std::move(f));
}

}  // namespace pw::transport
