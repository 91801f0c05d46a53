// RouterLinks: a worker's control links to its routers, one ControlClient per router, and the
// key under which the worker keeps a router's request.
//
// Several routers (the Helm chart's router.replicas > 1 behind one Service) may place requests
// on the same prefill and decode workers at once. Each router numbers its requests from 1, so
// a worker knows a request by its key: the index of the link it came on in the top
// kLinkBits bits, the router's request id in the others (RequestKey). With one router the key
// is the router's id. Every reply (KvReady, KvReserveReply, TokenChunk, Finish) names the
// router's id again and goes back on the key's link; a router that is lost takes with it the
// requests whose key names its link, and only those.
//
// Router pods behind a headless Service (resolve_ms > 0): each endpoint's host names every
// router, one IPv4 address each; every address is a link, and the names are resolved again
// every resolve_ms, so a router pod that starts later (scaled up, or restarted with a new
// address) gets a link too. A link whose address is gone and which is not registered (its
// router's requests were dropped when it was lost, or it had none) is reused for a new
// address; one still registered stays (a router pod that drains). A name that resolves to
// nothing (no router pod yet), or does not resolve now, leaves no link until it does.
//
// Readiness: a worker serves while it is registered with at least one of its routers.
// Polling: one link waits up to the caller's timeout; with several, each waits its share of
// it after a pass that found nothing (no socket set to wait on all of them at once here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "services/proto/codec.h"
#include "services/transport/control.h"

namespace pw::workers {

inline constexpr int kLinkBits = 8;
inline constexpr size_t kMaxRouterLinks = size_t{1} << kLinkBits;
inline constexpr uint64_t kMaxRouterRequestId = (uint64_t{1} << (64 - kLinkBits)) - 1;

// The worker's key of request `request_id` of the router on link `link` (request_id <=
// kMaxRouterRequestId, link < kMaxRouterLinks: CheckRouterRequestId and RouterLinks check).
inline uint64_t RequestKey(size_t link, uint64_t request_id) {
  return (static_cast<uint64_t>(link) << (64 - kLinkBits)) | request_id;
}
inline size_t KeyLink(uint64_t key) { return static_cast<size_t>(key >> (64 - kLinkBits)); }
inline uint64_t KeyRequest(uint64_t key) { return key & kMaxRouterRequestId; }
// "7", or "7 of router 1" for a link other than the first (log lines).
std::string KeyName(uint64_t key);
// InvalidArgument when a router's request id does not fit a key.
Status CheckRouterRequestId(uint64_t request_id);
// Every IPv4 address `host` resolves to (getaddrinfo), sorted, without repeats; an empty list
// when the name has no address (yet).
Result<std::vector<std::string>> ResolveIpv4(const std::string& host);

class RouterLinks {
 public:
  // Makes the client of link `link` (its callbacks set), not started.
  using MakeClient = std::function<Result<std::unique_ptr<transport::ControlClient>>(
      const std::string& endpoint, size_t link)>;
  // The IPv4 addresses a host resolves to (ResolveIpv4; a test may give its own).
  using Resolve = std::function<Result<std::vector<std::string>>(const std::string& host)>;
  // A frame from the router on link `link`.
  using Handler = std::function<Status(size_t link, const proto::InMessage& m)>;

  // One client per endpoint, in order (at least one, at most kMaxRouterLinks, no repeats), or,
  // with resolve_ms > 0, one per address of the endpoints' hosts (see the file comment).
  static Result<RouterLinks> Create(const std::vector<std::string>& endpoints, MakeClient make,
                                    uint64_t resolve_ms = 0, const Clock* clock = nullptr,
                                    Resolve resolve = nullptr);

  size_t size() const { return links_.size(); }
  transport::ControlClient& at(size_t link) { return *links_[link]; }
  const std::string& endpoint(size_t link) const { return endpoints_[link]; }
  // "tcp://a:5555, tcp://b:5555" (log lines).
  std::string Describe() const;
  // Links registered now.
  size_t registered() const;
  Status Start();
  // With resolve_ms > 0 and resolve_ms since the last time: resolves the endpoints' hosts again
  // and links (and starts) the addresses that have none. Call from the polling loop.
  void Refresh();
  int Poll(int timeout_ms, const Handler& handler);
  // Sends `msg` on the link of request `key`.
  Status Send(uint64_t key, proto::OutMessage& msg);
  // Every link's counters summed.
  transport::ControlCounters counters() const;

 private:
  // The endpoints each an address of the configured ones' hosts (resolve_ms_ > 0).
  Result<std::vector<std::string>> ResolveEndpoints() const;
  Status Link(const std::string& endpoint);

  std::vector<std::string> configured_;  // as given
  MakeClient make_;
  uint64_t resolve_ms_ = 0;
  const Clock* clock_ = nullptr;
  Resolve resolve_;
  uint64_t next_resolve_ms_ = 0;
  bool started_ = false;
  std::vector<std::string> endpoints_;  // link i's endpoint
  std::vector<std::unique_ptr<transport::ControlClient>> links_;
};

}  // namespace pw::workers
