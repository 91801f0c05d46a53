#include "services/transport/zmq_transport.h"

#include <zmq.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/logging.h"

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

std::atomic<uint64_t> g_zap_refusals{0};

// The process's ZAP handler (RFC 27): libzmq asks it, over inproc://zeromq.zap.01, whether a
// CURVE client that completed the key exchange may connect. Each CURVE ROUTER names a domain
// ("pw-" + its server public key) and the client keys it admits. One thread, started with the
// first CURVE ROUTER, never stopped (like the context).
class ZapHandler {
 public:
  static ZapHandler& Get() {
    static ZapHandler* h = new ZapHandler();
    return *h;
  }
  void Allow(const std::string& domain, const std::string& client_public_z85) {
    uint8_t raw[32];
    PW_CHECK(zmq_z85_decode(raw, client_public_z85.c_str()) != nullptr);
    std::lock_guard<std::mutex> lock(mu_);
    allowed_[domain].insert(std::string(reinterpret_cast<char*>(raw), sizeof(raw)));
  }

 private:
  ZapHandler() : socket_(ZmqContext(), zmq::socket_type::rep) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("inproc://zeromq.zap.01");
    std::thread([this] { Loop(); }).detach();
  }
  bool Admit(const std::string& domain, const std::string& mechanism, const std::string& key) {
    if (mechanism != "CURVE") return false;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allowed_.find(domain);
    return it != allowed_.end() && it->second.count(key) != 0;
  }
  void Loop() {
    while (true) {
      std::vector<zmq::message_t> req;
      try {
        do {
          zmq::message_t m;
          if (!socket_.recv(m)) break;
          req.push_back(std::move(m));
        } while (req.back().more());
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        if (e.num() == ETERM) return;
        PW_LOG(ERROR) << "ZAP handler: " << e.what();
        continue;
      }
      // version, request id, domain, address, routing id, mechanism, credentials...
      auto part = [&req](size_t i) { return i < req.size() ? req[i].to_string() : std::string(); };
      const std::string request_id = part(1), domain = part(2), address = part(3);
      const std::string mechanism = part(5), key = part(6);
      const bool ok = req.size() >= 7 && Admit(domain, mechanism, key);
      if (!ok) {
        const uint64_t n = ++g_zap_refusals;
        if (n <= 10 || n % 1000 == 0) {
          PW_LOG(WARNING) << "refused a control-plane connection from " << address << " ("
                          << mechanism << "): not the cluster's client key (" << n
                          << " refused so far)";
        }
      }
      try {
        const std::string code = ok ? "200" : "400";
        const std::string text = ok ? "OK" : "unknown client key";
        const std::string user = ok ? "pw-cluster" : "";
        socket_.send(zmq::buffer("1.0", 3), zmq::send_flags::sndmore);
        socket_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
        socket_.send(zmq::buffer(code), zmq::send_flags::sndmore);
        socket_.send(zmq::buffer(text), zmq::send_flags::sndmore);
        socket_.send(zmq::buffer(user), zmq::send_flags::sndmore);
        socket_.send(zmq::buffer("", 0), zmq::send_flags::none);
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        PW_LOG(ERROR) << "ZAP handler reply: " << e.what();
      }
    }
  }

  zmq::socket_t socket_;  // the handler thread's only
  std::mutex mu_;
  std::map<std::string, std::set<std::string>> allowed_;  // domain -> 32-byte client keys
};

}  // namespace

uint64_t ZapRefusals() { return g_zap_refusals.load(); }

Result<std::unique_ptr<ZmqRouterTransport>> ZmqRouterTransport::Bind(const std::string& endpoint) {
  return Bind(endpoint, DefaultControlAuth());
}

Result<std::unique_ptr<ZmqRouterTransport>> ZmqRouterTransport::Bind(const std::string& endpoint,
                                                                     const ControlAuth& auth) {
  try {
    zmq::socket_t s(ZmqContext(), zmq::socket_type::router);
    if (auth.secure()) {
      const std::string domain = "pw-" + auth.curve->server.public_z85;
      ZapHandler::Get().Allow(domain, auth.curve->client.public_z85);
      s.set(zmq::sockopt::zap_domain, domain);
      s.set(zmq::sockopt::curve_server, 1);
      s.set(zmq::sockopt::curve_secretkey, auth.curve->server.secret_z85);
    }
    s.set(zmq::sockopt::router_mandatory, 1);
    s.set(zmq::sockopt::router_handover, 1);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndhwm, 100000);
    s.set(zmq::sockopt::rcvhwm, 100000);
    s.bind(endpoint);
    std::unique_ptr<ZmqRouterTransport> t(new ZmqRouterTransport(std::move(s)));
    t->endpoint_ = t->socket_.get(zmq::sockopt::last_endpoint);
    t->secure_ = auth.secure();
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
  auto fresh = Connect(endpoint_, id_, auth_);
  if (!fresh.ok()) return fresh.status();
  socket_ = std::move((*fresh)->socket_);  // the old socket closes (linger 0)
  return Status::Ok();
}

Result<std::unique_ptr<ZmqDealerTransport>> ZmqDealerTransport::Connect(const std::string& endpoint,
                                                                        const std::string& id) {
  return Connect(endpoint, id, DefaultControlAuth());
}

Result<std::unique_ptr<ZmqDealerTransport>> ZmqDealerTransport::Connect(const std::string& endpoint,
                                                                        const std::string& id,
                                                                        const ControlAuth& auth) {
  if (id.empty() || id.size() > 255) return InvalidArgument("DEALER id must be 1..255 bytes");
  try {
    zmq::socket_t s(ZmqContext(), zmq::socket_type::dealer);
    if (auth.secure()) {
      s.set(zmq::sockopt::curve_serverkey, auth.curve->server.public_z85);
      s.set(zmq::sockopt::curve_publickey, auth.curve->client.public_z85);
      s.set(zmq::sockopt::curve_secretkey, auth.curve->client.secret_z85);
    }
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
    t->auth_ = auth;
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
