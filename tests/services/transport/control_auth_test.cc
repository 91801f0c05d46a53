// The authenticated control plane: key files (generation, 0600, refusals), CURVE registration
// over real ZeroMQ sockets on loopback, and impostors that claim a registered worker's routing
// id without the cluster's credentials (plaintext, or CURVE with a key of their own): their
// handshakes fail, the server never sees a frame from them, and the live worker is neither
// displaced nor silenced however long heartbeat time runs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "services/transport/control.h"
#include "services/transport/control_auth.h"
#include "services/transport/curve_keys.h"
#include "services/transport/zmq_transport.h"

namespace pw::transport {
namespace {

constexpr uint64_t kBeatMs = 100;

std::string TmpDir() {
  std::string d = std::string(PW_BINARY_DIR) + "/test-tmp/control-auth-" + std::to_string(getpid());
  std::filesystem::create_directories(d);
  return d;
}

ControlAuth Curve(const CurveKeys& k) {
  ControlAuth a;
  a.curve = k;
  return a;
}

TEST(CurveKeys, WrittenOwnerOnlyAndReadBack) {
  auto k = GenerateCurveKeys();
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->server.public_z85.size(), 40u);
  EXPECT_NE(k->server.public_z85, k->client.public_z85);
  const std::string path = TmpDir() + "/ok.keys";
  std::filesystem::remove(path);
  ASSERT_TRUE(WriteCurveKeys(path, *k).ok());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto back = ReadCurveKeys(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->server.secret_z85, k->server.secret_z85);
  EXPECT_EQ(back->client.public_z85, k->client.public_z85);
  // Written again (a new run), the file is replaced, still 0600.
  auto k2 = GenerateCurveKeys();
  ASSERT_TRUE(WriteCurveKeys(path, *k2).ok());
  EXPECT_EQ(ReadCurveKeys(path)->server.public_z85, k2->server.public_z85);
}

TEST(CurveKeys, BadFilesAreRefusedNamingTheProblem) {
  auto k = GenerateCurveKeys();
  ASSERT_TRUE(k.ok());
  const std::string dir = TmpDir();
  auto expect_refused = [](const std::string& path, const std::string& says) {
    auto r = ReadCurveKeys(path);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  };
  expect_refused(dir + "/absent.keys", "cannot open");
  const std::string wide = dir + "/wide.keys";
  std::filesystem::remove(wide);
  ASSERT_TRUE(WriteCurveKeys(wide, *k).ok());
  chmod(wide.c_str(), 0644);
  expect_refused(wide, "group or others");
  auto write_text = [](const std::string& path, const std::string& text) {
    std::filesystem::remove(path);
    std::ofstream(path) << text;
    chmod(path.c_str(), 0600);
  };
  const std::string other_secret = GenerateCurveKeys()->server.secret_z85;
  write_text(dir + "/swapped.keys", "server_public: " + k->server.public_z85 +
                                        "\nserver_secret: " + other_secret +
                                        "\nclient_public: " + k->client.public_z85 +
                                        "\nclient_secret: " + k->client.secret_z85 + "\n");
  expect_refused(dir + "/swapped.keys", "server_secret does not belong to server_public");
  write_text(dir + "/short.keys", "server_public: " + k->server.public_z85 +
                                      "\nserver_secret: abc\nclient_public: " +
                                      k->client.public_z85 + "\nclient_secret: " +
                                      k->client.secret_z85 + "\n");
  expect_refused(dir + "/short.keys", "'server_secret' is not a 40-character Z85 CURVE key");
  write_text(dir + "/missing.keys", "server_public: " + k->server.public_z85 + "\n");
  expect_refused(dir + "/missing.keys", "'server_secret' is missing");
}

// Standard base64 of a Z85 key's 32 bytes, as Helm's `randBytes 32` writes a secret.
std::string Base64Of(const std::string& z85) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  uint8_t raw[32];
  EXPECT_NE(zmq_z85_decode(raw, z85.c_str()), nullptr);
  std::string out;
  for (size_t i = 0; i < 32; i += 3) {
    const uint32_t n = (uint32_t{raw[i]} << 16) | (i + 1 < 32 ? uint32_t{raw[i + 1]} << 8 : 0) |
                       (i + 2 < 32 ? uint32_t{raw[i + 2]} : 0);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < 32 ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < 32 ? kAlphabet[n & 63] : '=';
  }
  return out;
}

TEST(CurveKeys, SecretsAloneDeriveThePublicKeysPwClusterWrites) {
  auto k = GenerateCurveKeys();  // what `pw-cluster keys` writes
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  const std::string dir = TmpDir();
  auto write_text = [](const std::string& path, const std::string& text) {
    std::filesystem::remove(path);
    std::ofstream(path) << text;
    chmod(path.c_str(), 0600);
  };
  // Z85 secrets, no public keys.
  const std::string z85 = dir + "/secrets-z85.keys";
  write_text(z85, "server_secret: " + k->server.secret_z85 + "\nclient_secret: " +
                      k->client.secret_z85 + "\n");
  auto back = ReadCurveKeys(z85);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->server.public_z85, k->server.public_z85);
  EXPECT_EQ(back->client.public_z85, k->client.public_z85);
  EXPECT_EQ(back->server.secret_z85, k->server.secret_z85);
  // The chart's form: base64 secrets (randBytes 32), turned into the same Z85 keys.
  const std::string b64 = dir + "/secrets-b64.keys";
  ASSERT_EQ(Base64Of(k->server.secret_z85).size(), 44u);
  write_text(b64, "server_secret: " + Base64Of(k->server.secret_z85) + "\nclient_secret: " +
                      Base64Of(k->client.secret_z85) + "\n");
  back = ReadCurveKeys(b64);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->server.public_z85, k->server.public_z85);
  EXPECT_EQ(back->client.public_z85, k->client.public_z85);
  EXPECT_EQ(back->server.secret_z85, k->server.secret_z85);
  EXPECT_EQ(back->client.secret_z85, k->client.secret_z85);

  // Malformed ones are refused, naming the file.
  auto expect_refused = [](const std::string& path, const std::string& says) {
    auto r = ReadCurveKeys(path);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  };
  const std::string bad = dir + "/bad-secret.keys";
  std::string short_b64 = Base64Of(k->server.secret_z85);
  short_b64 = short_b64.substr(0, 40) + "AA==";  // 31 bytes
  write_text(bad, "server_secret: " + short_b64 + "\nclient_secret: " + k->client.secret_z85 + "\n");
  expect_refused(bad, "'server_secret' is not a 40-character Z85 CURVE key nor 32 bytes in base64");
  write_text(bad, "client_secret: " + k->client.secret_z85 + "\n");
  expect_refused(bad, "'server_secret' is missing");
  write_text(bad, "server_secret: " + k->server.secret_z85 + "\nserver_public: " +
                      k->client.public_z85 + "\nclient_secret: " + k->client.secret_z85 + "\n");
  expect_refused(bad, "server_secret does not belong to server_public");
}

TEST(ControlAuthFlags, ExactlyOneOfKeysOrInsecure) {
  auto none = ControlAuthFromFlags("", false, "test");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--insecure"), std::string::npos);
  EXPECT_FALSE(ControlAuthFromFlags("x.keys", true, "test").ok());
  auto insecure = ControlAuthFromFlags("", true, "test");
  ASSERT_TRUE(insecure.ok());
  EXPECT_FALSE(insecure->secure());
  const std::string path = TmpDir() + "/flags.keys";
  std::filesystem::remove(path);
  ASSERT_TRUE(WriteCurveKeys(path, *GenerateCurveKeys()).ok());
  auto secure = ControlAuthFromFlags(path, false, "test");
  ASSERT_TRUE(secure.ok()) << secure.status().ToString();
  EXPECT_TRUE(secure->secure());
}

struct CurvePair {
  ManualClock clock;
  CurveKeys keys;
  std::unique_ptr<ControlServer> server;
  std::unique_ptr<ControlClient> client;
  std::string endpoint;
  int lost = 0;
};

void MakeCurvePair(CurvePair* p) {
  auto k = GenerateCurveKeys();
  ASSERT_TRUE(k.ok());
  p->keys = *k;
  auto router = ZmqRouterTransport::Bind("tcp://127.0.0.1:0", Curve(p->keys));
  ASSERT_TRUE(router.ok()) << router.status().ToString();
  p->endpoint = (*router)->endpoint();
  EXPECT_NE((*router)->Describe().find("CURVE"), std::string::npos);
  ControlServer::Options so;
  so.heartbeat_ms = kBeatMs;
  p->server = std::make_unique<ControlServer>(std::move(router).value(), &p->clock, so);
  auto dealer = ZmqDealerTransport::Connect(p->endpoint, "decode-0", Curve(p->keys));
  ASSERT_TRUE(dealer.ok());
  ControlClient::Options co;
  co.id = "decode-0";
  co.role = wire::Role::DECODE;
  co.heartbeat_ms = kBeatMs;
  p->client = std::make_unique<ControlClient>(std::move(dealer).value(), &p->clock, co);
  p->client->on_server_lost = [p] { ++p->lost; };
  ASSERT_TRUE(p->client->Start().ok());
  for (int i = 0; i < 1000 && !p->client->registered(); ++i) {
    p->server->Poll(5, nullptr);
    p->client->Poll(5, nullptr);
  }
  ASSERT_TRUE(p->client->registered());
}

// Watches a socket's handshake (zmq_socket_monitor): true once it failed, false once it
// succeeded or after `timeout_ms` of real time with neither.
class HandshakeWatch {
 public:
  explicit HandshakeWatch(zmq::socket_t& s) : pair_(ZmqContext(), zmq::socket_type::pair) {
    static std::atomic<int> n{0};
    const std::string ep = "inproc://handshake-watch-" + std::to_string(++n);
    EXPECT_EQ(zmq_socket_monitor(static_cast<void*>(s), ep.c_str(),
                                 ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                     ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH),
              0);
    pair_.connect(ep);
  }
  // Returns the first handshake event seen within timeout_ms (0 = none).
  uint16_t Next(int timeout_ms) {
    pair_.set(zmq::sockopt::rcvtimeo, timeout_ms);
    zmq::message_t ev, addr;
    if (!pair_.recv(ev) || !pair_.recv(addr)) return 0;
    uint16_t id = 0;
    std::memcpy(&id, ev.data(), sizeof(id));
    return id;
  }

 private:
  zmq::socket_t pair_;
};

// Runs heartbeat time for `beats` intervals with both sides polling (and a token frame from
// the worker each beat): the live worker must stay registered on the same registration.
void ExpectUndisturbed(CurvePair& p, int beats) {
  const PeerInfo* before = p.server->FindPeer("decode-0");
  ASSERT_NE(before, nullptr);
  const uint64_t epoch = before->epoch;
  int got = 0;
  MessageHandler sh = [&](const std::string& peer, const proto::InMessage& in) -> Status {
    if (peer == "decode-0" && in.which() == proto::Body::TOKEN_CHUNK) ++got;
    return Status::Ok();
  };
  for (int b = 0; b < beats; ++b) {
    proto::OutMessage m;
    m.body().initTokenChunk().setRequestId(static_cast<uint64_t>(b + 1));
    ASSERT_TRUE(p.client->Send(m).ok());
    for (int i = 0; i < 4; ++i) {
      p.clock.Advance(kBeatMs / 4);
      p.server->Poll(5, sh);
      p.client->Poll(5, nullptr);
    }
  }
  for (int i = 0; i < 200 && got < beats; ++i) p.server->Poll(5, sh);
  EXPECT_EQ(p.lost, 0) << "the live worker lost its server";
  EXPECT_TRUE(p.client->registered());
  const PeerInfo* after = p.server->FindPeer("decode-0");
  ASSERT_NE(after, nullptr);
  EXPECT_EQ(after->epoch, epoch) << "the live worker had to register again";
  EXPECT_EQ(got, beats) << "frames of the live worker went missing";
}

TEST(ControlAuth, CurveWorkerRegistersAndStaysUp) {
  CurvePair p;
  MakeCurvePair(&p);
  ExpectUndisturbed(p, 12);
}

// The attack of issue point 1, without credentials: a plaintext DEALER claiming the worker's
// routing id. Its handshake fails (the server speaks CURVE), so it never takes the id over.
TEST(ControlAuth, PlaintextImpostorNeitherDisplacesNorSilencesTheWorker) {
  CurvePair p;
  MakeCurvePair(&p);
  const uint64_t malformed = p.server->counters().malformed;
  {
    zmq::socket_t spoof(ZmqContext(), zmq::socket_type::dealer);
    spoof.set(zmq::sockopt::routing_id, "decode-0");
    spoof.set(zmq::sockopt::linger, 0);
    HandshakeWatch watch(spoof);
    spoof.connect(p.endpoint);
    (void)spoof.send(zmq::buffer("x", 1), zmq::send_flags::dontwait);
    uint16_t ev = 0;
    for (int i = 0; i < 100 && ev == 0; ++i) {
      p.server->Poll(5, nullptr);
      p.client->Poll(0, nullptr);
      ev = watch.Next(50);
    }
    EXPECT_NE(ev, 0) << "no handshake event within 5 s";
    EXPECT_NE(ev, ZMQ_EVENT_HANDSHAKE_SUCCEEDED) << "a plaintext peer completed a handshake";
    ExpectUndisturbed(p, 12);  // with the impostor still connected
  }
  ExpectUndisturbed(p, 12);
  EXPECT_EQ(p.server->counters().malformed, malformed) << "a frame of the impostor got through";
}

// The same with CURVE and a key pair of its own (it knows the server's public key, which is
// not secret): the ZAP handler refuses it.
TEST(ControlAuth, ImpostorWithAnotherClientKeyIsRefusedByZap) {
  CurvePair p;
  MakeCurvePair(&p);
  const uint64_t refused = ZapRefusals();
  const uint64_t malformed = p.server->counters().malformed;
  {
    CurveKeys forged = p.keys;
    forged.client = GenerateCurveKeys()->client;
    zmq::socket_t spoof(ZmqContext(), zmq::socket_type::dealer);
    spoof.set(zmq::sockopt::routing_id, "decode-0");
    spoof.set(zmq::sockopt::linger, 0);
    spoof.set(zmq::sockopt::curve_serverkey, forged.server.public_z85);
    spoof.set(zmq::sockopt::curve_publickey, forged.client.public_z85);
    spoof.set(zmq::sockopt::curve_secretkey, forged.client.secret_z85);
    HandshakeWatch watch(spoof);
    spoof.connect(p.endpoint);
    (void)spoof.send(zmq::buffer("x", 1), zmq::send_flags::dontwait);
    uint16_t ev = 0;
    for (int i = 0; i < 100 && ev == 0; ++i) {
      p.server->Poll(5, nullptr);
      p.client->Poll(0, nullptr);
      ev = watch.Next(50);
    }
    EXPECT_EQ(ev, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    EXPECT_GT(ZapRefusals(), refused);
    ExpectUndisturbed(p, 12);
  }
  ExpectUndisturbed(p, 12);
  EXPECT_EQ(p.server->counters().malformed, malformed);
}

// A client of another cluster (wrong server key) cannot talk to this server either, and a
// worker of this cluster refuses a server without the cluster's server secret.
TEST(ControlAuth, KeysOfAnotherClusterDoNotConnect) {
  CurvePair p;
  MakeCurvePair(&p);
  auto other = GenerateCurveKeys();
  ASSERT_TRUE(other.ok());
  auto dealer = ZmqDealerTransport::Connect(p.endpoint, "prefill-9", Curve(*other));
  ASSERT_TRUE(dealer.ok());
  ControlClient::Options co;
  co.id = "prefill-9";
  co.role = wire::Role::PREFILL;
  co.heartbeat_ms = kBeatMs;
  ControlClient stranger(std::move(dealer).value(), &p.clock, co);
  ASSERT_TRUE(stranger.Start().ok());
  for (int i = 0; i < 200; ++i) {
    p.server->Poll(2, nullptr);
    stranger.Poll(2, nullptr);
  }
  EXPECT_FALSE(stranger.registered());
  EXPECT_EQ(p.server->FindPeer("prefill-9"), nullptr);
  ExpectUndisturbed(p, 4);
}

}  // namespace
}  // namespace pw::transport
