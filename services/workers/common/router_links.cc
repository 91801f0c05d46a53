#include "services/workers/common/router_links.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "common/logging.h"

namespace pw::workers {

std::string KeyName(uint64_t key) {
  const std::string id = std::to_string(KeyRequest(key));
  return KeyLink(key) == 0 ? id : id + " of router " + std::to_string(KeyLink(key));
}

Status CheckRouterRequestId(uint64_t request_id) {
  if (request_id <= kMaxRouterRequestId) return Status::Ok();
  return InvalidArgument("request id " + std::to_string(request_id) + " above " +
                         std::to_string(kMaxRouterRequestId) + " (a router's ids fit " +
                         std::to_string(64 - kLinkBits) + " bits)");
}

Result<std::vector<std::string>> ResolveIpv4(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc == EAI_NONAME || rc == EAI_NODATA) return std::vector<std::string>{};
  if (rc != 0) return Unavailable("resolving " + host + ": " + gai_strerror(rc));
  std::set<std::string> out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf)) != nullptr) out.insert(buf);
  }
  freeaddrinfo(res);
  return std::vector<std::string>(out.begin(), out.end());
}

namespace {

// "tcp://HOST:PORT" -> HOST, PORT.
Status SplitEndpoint(const std::string& e, std::string* host, std::string* port) {
  const std::string scheme = "tcp://";
  const size_t colon = e.rfind(':');
  if (e.compare(0, scheme.size(), scheme) != 0 || colon == std::string::npos || colon <= scheme.size() ||
      colon + 1 == e.size()) {
    return InvalidArgument("router: endpoint " + e + " is not tcp://HOST:PORT");
  }
  *host = e.substr(scheme.size(), colon - scheme.size());
  *port = e.substr(colon + 1);
  return Status::Ok();
}

}  // namespace

Result<RouterLinks> RouterLinks::Create(const std::vector<std::string>& endpoints, MakeClient make,
                                        uint64_t resolve_ms, const Clock* clock, Resolve resolve) {
  if (endpoints.empty()) return InvalidArgument("router: at least one router endpoint is required");
  if (endpoints.size() > kMaxRouterLinks) {
    return InvalidArgument("router: " + std::to_string(endpoints.size()) + " endpoints, at most " +
                           std::to_string(kMaxRouterLinks));
  }
  std::set<std::string> seen;
  RouterLinks r;
  for (const std::string& e : endpoints) {
    if (e.empty()) return InvalidArgument("router: an empty endpoint");
    if (!seen.insert(e).second) return InvalidArgument("router: endpoint " + e + " given twice");
    if (resolve_ms > 0) {
      std::string host, port;
      PW_RETURN_IF_ERROR(SplitEndpoint(e, &host, &port));
    }
  }
  r.configured_ = endpoints;
  r.make_ = std::move(make);
  r.resolve_ms_ = resolve_ms;
  r.clock_ = clock ? clock : SteadyClock::Get();
  r.resolve_ = resolve ? std::move(resolve) : Resolve(ResolveIpv4);
  if (resolve_ms == 0) {
    for (const std::string& e : endpoints) PW_RETURN_IF_ERROR(r.Link(e));
    return r;
  }
  // A name that does not resolve yet (no router pod, DNS not answering) links nothing now:
  // Refresh tries again.
  auto resolved = r.ResolveEndpoints();
  if (!resolved.ok()) PW_LOG(WARNING) << "router endpoints: " << resolved.status().ToString();
  for (const std::string& e : resolved.ok() ? *resolved : std::vector<std::string>{}) {
    PW_RETURN_IF_ERROR(r.Link(e));
  }
  r.next_resolve_ms_ = r.clock_->NowMs() + resolve_ms;
  return r;
}

Result<std::vector<std::string>> RouterLinks::ResolveEndpoints() const {
  std::vector<std::string> out;
  for (const std::string& e : configured_) {
    std::string host, port;
    PW_RETURN_IF_ERROR(SplitEndpoint(e, &host, &port));
    PW_ASSIGN_OR_RETURN(auto addresses, resolve_(host));
    for (const std::string& a : addresses) {
      const std::string ep = "tcp://" + a + ":" + port;
      if (std::find(out.begin(), out.end(), ep) == out.end()) out.push_back(ep);
    }
  }
  return out;
}

Status RouterLinks::Link(const std::string& endpoint) {
  // A link whose router is gone from the names and which has nothing of it left (see the file
  // comment) takes the new address; otherwise a new link.
  size_t slot = links_.size();
  if (resolve_ms_ > 0 && started_) {
    auto wanted = ResolveEndpoints();
    for (size_t i = 0; i < links_.size() && wanted.ok(); ++i) {
      if (!links_[i]->registered() &&
          std::find(wanted->begin(), wanted->end(), endpoints_[i]) == wanted->end()) {
        slot = i;
        break;
      }
    }
  }
  if (slot == links_.size() && links_.size() >= kMaxRouterLinks) {
    return ResourceExhausted("router: " + std::to_string(kMaxRouterLinks) + " router links in use, none free for " +
                             endpoint);
  }
  PW_ASSIGN_OR_RETURN(auto c, make_(endpoint, slot));
  if (started_) PW_RETURN_IF_ERROR(c->Start());
  if (slot == links_.size()) {
    endpoints_.push_back(endpoint);
    links_.push_back(std::move(c));
  } else {
    PW_LOG(INFO) << "router link " << slot << ": " << endpoints_[slot] << " gone, now " << endpoint;
    endpoints_[slot] = endpoint;
    links_[slot] = std::move(c);
  }
  return Status::Ok();
}

void RouterLinks::Refresh() {
  if (resolve_ms_ == 0 || clock_->NowMs() < next_resolve_ms_) return;
  next_resolve_ms_ = clock_->NowMs() + resolve_ms_;
  auto wanted = ResolveEndpoints();
  if (!wanted.ok()) {
    PW_LOG(WARNING) << "router endpoints: " << wanted.status().ToString();
    return;
  }
  for (const std::string& e : *wanted) {
    if (std::find(endpoints_.begin(), endpoints_.end(), e) != endpoints_.end()) continue;
    PW_LOG(INFO) << "router endpoints: a new router at " << e;
    Status st = Link(e);
    if (!st.ok()) PW_LOG(WARNING) << st.ToString();
  }
}

std::string RouterLinks::Describe() const {
  std::string out;
  for (const std::string& e : endpoints_) out += (out.empty() ? "" : ", ") + e;
  if (resolve_ms_ == 0) return out;
  std::string names;
  for (const std::string& e : configured_) names += (names.empty() ? "" : ", ") + e;
  return names + " (every address, resolved every " + std::to_string(resolve_ms_) + " ms; now " +
         (out.empty() ? "none" : out) + ")";
}

size_t RouterLinks::registered() const {
  return static_cast<size_t>(std::count_if(links_.begin(), links_.end(), [](const auto& c) { return c->registered(); }));
}

Status RouterLinks::Start() {
  for (auto& c : links_) PW_RETURN_IF_ERROR(c->Start());
  started_ = true;
  return Status::Ok();
}

int RouterLinks::Poll(int timeout_ms, const Handler& handler) {
  auto poll_all = [&](int each_ms) {
    int n = 0;
    for (size_t i = 0; i < links_.size(); ++i) {
      n += links_[i]->Poll(each_ms, [&](const std::string&, const proto::InMessage& m) { return handler(i, m); });
    }
    return n;
  };
  if (links_.empty()) {  // no router resolved yet
    if (timeout_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return 0;
  }
  if (links_.size() == 1) return poll_all(timeout_ms);
  const int n = poll_all(0);
  if (n > 0 || timeout_ms <= 0) return n;
  return poll_all(std::max(1, timeout_ms / static_cast<int>(links_.size())));
}

Status RouterLinks::Send(uint64_t key, proto::OutMessage& msg) {
  const size_t link = KeyLink(key);
  if (link >= links_.size()) return Internal("request key " + std::to_string(key) + " names no router link");
  return links_[link]->Send(msg);
}

transport::ControlCounters RouterLinks::counters() const {
  transport::ControlCounters sum;
  for (const auto& c : links_) {
    const auto& k = c->counters();
    sum.received += k.received;
    sum.malformed += k.malformed;
    sum.wrong_version += k.wrong_version;
    sum.unregistered += k.unregistered;
    sum.duplicates += k.duplicates;
    sum.lost += k.lost;
    sum.handler_errors += k.handler_errors;
    sum.send_errors += k.send_errors;
  }
  return sum;
}

}  // namespace pw::workers
