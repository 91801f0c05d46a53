// RouterLinks (services/workers/common/router_links.h): request keys, and the links of a name
// whose addresses are routers (a headless Service of router pods) over real ZeroMQ on
// loopback; the name's answers are the test's (the addresses 127.0.0.x all reach loopback).
#include "services/workers/common/router_links.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "services/transport/zmq_transport.h"

namespace pw::workers {
namespace {

using transport::ControlClient;
using transport::ControlServer;

constexpr uint64_t kBeatMs = 100;

TEST(RouterLinks, RequestKeysKeepTheLinkApart) {
  EXPECT_EQ(RequestKey(0, 7), 7u);  // one router: the router's own ids
  const uint64_t k = RequestKey(1, 7);
  EXPECT_NE(k, RequestKey(0, 7));
  EXPECT_EQ(KeyLink(k), 1u);
  EXPECT_EQ(KeyRequest(k), 7u);
  EXPECT_EQ(KeyLink(RequestKey(kMaxRouterLinks - 1, kMaxRouterRequestId)), kMaxRouterLinks - 1);
  EXPECT_EQ(KeyRequest(RequestKey(kMaxRouterLinks - 1, kMaxRouterRequestId)), kMaxRouterRequestId);
  EXPECT_EQ(KeyName(k), "7 of router 1");
  EXPECT_TRUE(CheckRouterRequestId(kMaxRouterRequestId).ok());
  EXPECT_FALSE(CheckRouterRequestId(kMaxRouterRequestId + 1).ok());
}

TEST(RouterLinks, RefusesBadEndpointLists) {
  auto make = [](const std::string&, size_t) -> Result<std::unique_ptr<ControlClient>> {
    return Internal("not reached");
  };
  EXPECT_FALSE(RouterLinks::Create({}, make).ok());
  EXPECT_FALSE(RouterLinks::Create({"tcp://127.0.0.1:1", "tcp://127.0.0.1:1"}, make).ok());
  auto bad = RouterLinks::Create({"routers:5555"}, make, 100);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tcp://HOST:PORT"), std::string::npos) << bad.status().ToString();
}

TEST(RouterLinks, ResolvesALiteralAddress) {
  auto a = ResolveIpv4("127.0.0.1");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, std::vector<std::string>{"127.0.0.1"});
}


std::unique_ptr<ControlServer> Bind(const std::string& endpoint, const Clock* clock) {
  auto t = transport::ZmqRouterTransport::Bind(endpoint);
  EXPECT_TRUE(t.ok()) << endpoint << ": " << t.status().ToString();
  if (!t.ok()) return nullptr;
  ControlServer::Options so;
  so.id = "router@" + endpoint;
  so.heartbeat_ms = kBeatMs;
  return std::make_unique<ControlServer>(std::move(t).value(), clock, so);
}

// Every address the name has is a router: one at first, a second pod later, which is then lost
// and whose link goes to a third pod's address.
TEST(RouterLinks, EveryAddressOfTheNameIsARouter) {
  ManualClock clock;
  auto first = transport::ZmqRouterTransport::Bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string port = (*first)->endpoint().substr((*first)->endpoint().rfind(':') + 1);
  ControlServer::Options so;
  so.id = "router-a";
  so.heartbeat_ms = kBeatMs;
  ControlServer a(std::move(first).value(), &clock, so);

  std::vector<std::string> answer = {"127.0.0.1"};  // what the name resolves to now
  int lost = 0;
  std::vector<size_t> lost_links;
  auto make = [&](const std::string& endpoint, size_t link) -> Result<std::unique_ptr<ControlClient>> {
    PW_ASSIGN_OR_RETURN(auto t, transport::ZmqDealerTransport::Connect(endpoint, "decode-0"));
    ControlClient::Options o;
    o.id = "decode-0";
    o.role = wire::Role::DECODE;
    o.heartbeat_ms = kBeatMs;
    auto c = std::make_unique<ControlClient>(std::move(t), &clock, o);
    c->on_server_lost = [&, link] {
      ++lost;
      lost_links.push_back(link);
    };
    return c;
  };
  auto resolve = [&](const std::string& host) -> Result<std::vector<std::string>> {
    EXPECT_EQ(host, "routers");
    return answer;
  };
  auto links = RouterLinks::Create({"tcp://routers:" + port}, make, 1000, &clock, resolve);
  ASSERT_TRUE(links.ok()) << links.status().ToString();
  ASSERT_EQ(links->size(), 1u);
  EXPECT_EQ(links->endpoint(0), "tcp://127.0.0.1:" + port);
  ASSERT_TRUE(links->Start().ok());

  std::vector<ControlServer*> servers = {&a};
  auto pump_until = [&](auto done) {
    for (int i = 0; i < 1000 && !done(); ++i) {
      for (ControlServer* s : servers) s->Poll(1, nullptr);
      links->Poll(1, [](size_t, const proto::InMessage&) { return Status::Ok(); });
      links->Refresh();
    }
    return done();
  };
  ASSERT_TRUE(pump_until([&] { return links->registered() == 1; }));
  // Time passes in steps of half a beat, every side polled between them (no one falls silent).
  auto pass = [&](uint64_t ms) {
    for (uint64_t t = 0; t < ms; t += kBeatMs / 2) {
      clock.Advance(kBeatMs / 2);
      for (int i = 0; i < 3; ++i) {
        for (ControlServer* s : servers) s->Poll(1, nullptr);
        links->Poll(1, [](size_t, const proto::InMessage&) { return Status::Ok(); });
      }
    }
  };

  // A second router pod under the name: linked at the next resolution, not before.
  auto b = Bind("tcp://127.0.0.2:" + port, &clock);
  ASSERT_NE(b, nullptr);
  servers.push_back(b.get());
  answer = {"127.0.0.1", "127.0.0.2"};
  links->Refresh();
  EXPECT_EQ(links->size(), 1u) << "resolved again before resolve_ms";
  pass(1000);
  ASSERT_TRUE(pump_until([&] { return links->registered() == 2; }));
  ASSERT_EQ(links->size(), 2u);
  EXPECT_EQ(links->endpoint(1), "tcp://127.0.0.2:" + port);
  EXPECT_EQ(b->peers().count("decode-0"), 1u);

  // That pod is gone (and its address with it); a third comes up at another address.
  servers.pop_back();
  b.reset();
  answer = {"127.0.0.1"};
  for (int i = 0; i < 100 && lost == 0; ++i) pass(kBeatMs);
  ASSERT_EQ(lost, 1);
  EXPECT_EQ(lost_links, std::vector<size_t>{1});
  EXPECT_EQ(links->registered(), 1u) << "router a's link went too";
  auto c = Bind("tcp://127.0.0.3:" + port, &clock);
  ASSERT_NE(c, nullptr);
  servers.push_back(c.get());
  answer = {"127.0.0.1", "127.0.0.3"};
  pass(1000);
  ASSERT_TRUE(pump_until([&] { return links->registered() == 2; }));
  EXPECT_EQ(links->size(), 2u) << "the lost router's link is not reused";
  EXPECT_EQ(links->endpoint(1), "tcp://127.0.0.3:" + port);
  EXPECT_EQ(c->peers().count("decode-0"), 1u);
}

}  // namespace
}  // namespace pw::workers
