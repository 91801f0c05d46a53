#include "services/workers/common/router_links.h"

#include <algorithm>
#include <set>

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

Result<RouterLinks> RouterLinks::Create(const std::vector<std::string>& endpoints, const MakeClient& make) {
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
    PW_ASSIGN_OR_RETURN(auto c, make(e));
    r.endpoints_.push_back(e);
    r.links_.push_back(std::move(c));
  }
  return r;
}

std::string RouterLinks::Describe() const {
  std::string out;
  for (const std::string& e : endpoints_) out += (out.empty() ? "" : ", ") + e;
  return out;
}

size_t RouterLinks::registered() const {
  return static_cast<size_t>(std::count_if(links_.begin(), links_.end(), [](const auto& c) { return c->registered(); }));
}

Status RouterLinks::Start() {
  for (auto& c : links_) PW_RETURN_IF_ERROR(c->Start());
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
