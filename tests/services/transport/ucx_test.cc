// UCX data plane between two real processes (fork) on loopback: one-sided get and put into a
// registered region, bytes verified; bounds checks; a dead peer fails operations instead of
// hanging, with peer error handling (tcp) and without it (shared memory, deadlines and cancel
// flags). UCX state is created only after fork, in each process separately.
#include "services/transport/ucx.h"
#include "services/transport/pipe_io.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace pw::transport::ucx {
namespace {

constexpr size_t kRegionBytes = 8u << 20;


struct RegionInfo {
  std::string address, rkey;
  uint64_t base = 0, bytes = 0;
};
bool SendInfo(int fd, const Worker& w, const MemoryRegion& r) {
  uint64_t b = r.base(), n = r.size();
  return WriteBlob(fd, w.Address()) && WriteBlob(fd, r.PackedRkey()) && WriteAll(fd, &b, 8) &&
         WriteAll(fd, &n, 8);
}
bool RecvInfo(int fd, RegionInfo* info) {
  return ReadBlob(fd, &info->address) && ReadBlob(fd, &info->rkey) && ReadAll(fd, &info->base, 8) &&
         ReadAll(fd, &info->bytes, 8);
}

uint8_t Pattern(size_t i, uint8_t salt) {
  return static_cast<uint8_t>((i * 131 + salt) ^ (i >> 9));
}

// Child side of the put/get test: the initiator. Returns an exit code (0 = all good).
int InitiatorMain(int info_fd, int done_fd, Endpoint::ErrorMode mode) {
  RegionInfo info;
  if (!RecvInfo(info_fd, &info)) return 10;
  auto ctx = Context::Create();
  if (!ctx.ok()) return 11;
  auto worker = Worker::Create(**ctx);
  if (!worker.ok()) return 12;
  auto ep = Endpoint::Connect(**worker, info.address, mode);
  if (!ep.ok()) return 13;
  auto region = (*ep)->OpenRegion(info.rkey, info.base, info.bytes);
  if (!region.ok()) return 14;
  std::vector<uint8_t> buf(kRegionBytes / 2);
  // Get the first half and check the owner's pattern.
  if (!(*region)->Get(0, buf.data(), buf.size()).ok()) return 15;
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != Pattern(i, 1)) return 16;
  }
  // The first half again as a batch of uneven gets, posted at once, scattered in reverse order.
  {
    std::vector<uint8_t> back(buf.size(), 0);
    std::vector<RemoteRegion::GetSegment> gets;
    const size_t piece = back.size() / 29 + 5;
    for (size_t at = 0; at < back.size(); at += piece) {
      const size_t n = std::min(piece, back.size() - at);
      gets.push_back({at, back.data() + (back.size() - at - n), n});
    }
    if (!(*region)->GetAll(gets).ok()) return 25;
    for (const auto& g : gets) {
      const auto* got = static_cast<const uint8_t*>(g.local);
      for (size_t i = 0; i < g.bytes; ++i) {
        if (got[i] != Pattern(g.offset + i, 1)) return 26;
      }
    }
    std::vector<RemoteRegion::GetSegment> bad = {{0, back.data(), 8}, {kRegionBytes - 4, back.data(), 8}};
    if ((*region)->GetAll(bad).code() != StatusCode::kOutOfRange) return 27;
  }
  // Put a new pattern into the second half, in 37 uneven pieces, then flush.
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = Pattern(i, 2);
  size_t off = 0;
  const size_t piece = buf.size() / 37 + 3;
  while (off < buf.size()) {
    size_t n = std::min(piece, buf.size() - off);
    if (!(*region)->Put(kRegionBytes / 2 + off, buf.data() + off, n).ok()) return 17;
    off += n;
  }
  if (!(*ep)->Flush().ok()) return 18;
  // The same bytes again, as one batch of segments (all posted, then waited for together).
  std::vector<RemoteRegion::Segment> segs;
  for (off = 0; off < buf.size(); off += piece) {
    segs.push_back({kRegionBytes / 2 + off, buf.data() + off, std::min(piece, buf.size() - off)});
  }
  if (!(*region)->PutAll(segs).ok()) return 23;
  if (!(*ep)->Flush().ok()) return 24;
  // Out-of-range accesses are refused before reaching UCX.
  if ((*region)->Put(kRegionBytes - 4, buf.data(), 8).code() != StatusCode::kOutOfRange) return 19;
  if ((*region)->Get(~0ull - 2, buf.data(), 8).code() != StatusCode::kOutOfRange) return 20;
  char ok = 'k';
  if (!WriteAll(done_fd, &ok, 1)) return 21;
  // Wait for the owner to check the bytes before tearing down the endpoint.
  char bye;
  if (!ReadAll(info_fd, &bye, 1)) return 22;
  return 0;
}

class UcxModes : public ::testing::TestWithParam<Endpoint::ErrorMode> {};

TEST_P(UcxModes, PutAndGetBetweenTwoProcesses) {
  int info_pipe[2], done_pipe[2];
  ASSERT_EQ(pipe(info_pipe), 0);
  ASSERT_EQ(pipe(done_pipe), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(info_pipe[1]);
    close(done_pipe[0]);
    // info_pipe carries owner -> initiator; the final "bye" also comes over it.
    _exit(InitiatorMain(info_pipe[0], done_pipe[1], GetParam()));
  }
  close(info_pipe[0]);
  close(done_pipe[1]);
  // Owner: register a region, progress it from a thread, publish its coordinates.
  std::vector<uint8_t> mem(kRegionBytes);
  for (size_t i = 0; i < kRegionBytes / 2; ++i) mem[i] = Pattern(i, 1);
  auto ctx = Context::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  auto worker = Worker::Create(**ctx);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  auto region = MemoryRegion::Register(**ctx, mem.data(), mem.size());
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  (*worker)->StartProgressThread();
  ASSERT_TRUE(SendInfo(info_pipe[1], **worker, **region));
  char done = 0;
  bool got = ReadAll(done_pipe[0], &done, 1, 60000);
  if (got) {
    (*worker)->SyncWithProgress();  // the puts were written by the progress thread
    for (size_t i = 0; i < kRegionBytes / 2; ++i) {
      ASSERT_EQ(mem[kRegionBytes / 2 + i], Pattern(i, 2)) << "byte " << i << " of the put";
    }
  }
  char bye = 'b';
  (void)WriteAll(info_pipe[1], &bye, 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "initiator failed at step " << WEXITSTATUS(status);
  EXPECT_TRUE(got);
  close(info_pipe[1]);
  close(done_pipe[0]);
}

// Forks an owner that registers `bytes`, progresses them from a thread when `progress`, sends
// its coordinates and then waits to be killed.
pid_t StartOwner(size_t bytes, bool progress, RegionInfo* info) {
  int info_pipe[2];
  if (pipe(info_pipe) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(info_pipe[0]);
    static std::vector<uint8_t> mem;
    mem.assign(bytes, 0x5a);
    auto ctx = Context::Create();
    if (!ctx.ok()) _exit(1);
    auto worker = Worker::Create(**ctx);
    if (!worker.ok()) _exit(2);
    auto region = MemoryRegion::Register(**ctx, mem.data(), mem.size());
    if (!region.ok()) _exit(3);
    if (progress) (*worker)->StartProgressThread();
    if (!SendInfo(info_pipe[1], **worker, **region)) _exit(4);
    while (true) pause();  // until killed
  }
  close(info_pipe[1]);
  const bool ok = RecvInfo(info_pipe[0], info);
  close(info_pipe[0]);
  if (!ok) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST_P(UcxModes, DeadPeerFailsInsteadOfHanging) {
  RegionInfo info;
  pid_t pid = StartOwner(1u << 20, true, &info);
  ASSERT_GT(pid, 0);
  auto ctx = Context::Create();
  ASSERT_TRUE(ctx.ok());
  auto worker = Worker::Create(**ctx);
  ASSERT_TRUE(worker.ok());
  auto ep = Endpoint::Connect(**worker, info.address, GetParam());
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  auto region = (*ep)->OpenRegion(info.rkey, info.base, info.bytes);
  ASSERT_TRUE(region.ok());
  std::vector<uint8_t> buf(info.bytes);
  ASSERT_TRUE((*region)->Get(0, buf.data(), buf.size()).ok());
  EXPECT_EQ(buf[12345], 0x5a);
  kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  // Either the peer-failure callback or the deadline ends it; it must not hang.
  Status st;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5 && st.ok(); ++i) {
    st = (*region)->Put(0, buf.data(), buf.size(), 3000);
    if (st.ok()) st = (*ep)->Flush(3000);
    if (st.ok()) st = (*region)->Get(0, buf.data(), buf.size(), 3000);
  }
  EXPECT_FALSE(st.ok());
  EXPECT_LT(SecondsSince(t0), 60.0);
  EXPECT_FALSE((*ep)->healthy());
  EXPECT_EQ((*region)->Put(0, buf.data(), 8).code(), StatusCode::kUnavailable);
  EXPECT_EQ((*ep)->Flush().code(), StatusCode::kUnavailable);
}

// SIGKILL of the owner while puts are in flight: every call returns (error or not) within its
// deadline, the endpoint ends failed, and another peer is then served from the same context.
// Each endpoint runs on a worker of its own (ConnectOnOwnWorker, as the prefill worker and the
// plane mover connect): with kNone, a worker whose peer died with puts queued could fail to
// complete a later get to any other peer (a third of runs here), so the dead peer's worker goes
// with its endpoint.
TEST_P(UcxModes, OwnerKilledMidTransfer) {
  constexpr size_t kBytes = 32u << 20;
  // Both owners are forked before this process creates UCX state (UCX does not survive fork).
  RegionInfo info, info2;
  pid_t pid = StartOwner(kBytes, true, &info);
  ASSERT_GT(pid, 0);
  pid_t pid2 = StartOwner(1u << 20, true, &info2);
  ASSERT_GT(pid2, 0);
  auto ctx = Context::Create();
  ASSERT_TRUE(ctx.ok());
  {
    auto ep = Endpoint::ConnectOnOwnWorker(**ctx, info.address, GetParam());
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    auto region = (*ep)->OpenRegion(info.rkey, info.base, info.bytes);
    ASSERT_TRUE(region.ok());
    std::vector<uint8_t> src(kBytes, 3);
    std::atomic<int> passes{0};
    std::thread killer([&] {
      while (passes.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      kill(pid, SIGKILL);
    });
    Status st;
    const auto t0 = std::chrono::steady_clock::now();
    for (int pass = 0; pass < 1000 && st.ok(); ++pass) {
      std::vector<RemoteRegion::Segment> segs;
      for (size_t off = 0; off < kBytes; off += 256u << 10)
        segs.push_back({off, src.data() + off, 256u << 10});
      st = (*region)->PutAll(segs, 3000);
      if (st.ok()) st = (*ep)->Flush(3000);
      passes.fetch_add(1);
    }
    killer.join();
    ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
    // 1000 passes of 32 MiB into a dead peer cannot all succeed.
    EXPECT_FALSE(st.ok());
    EXPECT_LT(SecondsSince(t0), 120.0);
    EXPECT_FALSE((*ep)->healthy());
  }
  // Another owner, reached from a new endpoint of the same context, works.
  auto ep2 = Endpoint::ConnectOnOwnWorker(**ctx, info2.address, GetParam());
  ASSERT_TRUE(ep2.ok());
  auto region2 = (*ep2)->OpenRegion(info2.rkey, info2.base, info2.bytes);
  ASSERT_TRUE(region2.ok());
  std::vector<uint8_t> buf(info2.bytes);
  Status st2 = (*region2)->Get(0, buf.data(), buf.size(), 30000);
  EXPECT_TRUE(st2.ok()) << st2.ToString();
  EXPECT_EQ(buf[777], 0x5a);
  kill(pid2, SIGKILL);
  waitpid(pid2, nullptr, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, UcxModes,
                         ::testing::Values(Endpoint::ErrorMode::kPeer, Endpoint::ErrorMode::kNone),
                         [](const auto& info) {
                           return info.param == Endpoint::ErrorMode::kPeer ? std::string("Peer")
                                                                           : std::string("None");
                         });

// A cancel flag set from another thread ends a wait at once, well before its deadline, and
// leaves the endpoint failed (closed). The owner never progresses its worker, so with active
// message emulation of RMA nothing it is asked completes by itself.
TEST(Ucx, CancelFlagEndsAWait) {
  RegionInfo info;
  pid_t pid = StartOwner(8u << 20, /*progress=*/false, &info);
  ASSERT_GT(pid, 0);
  auto ctx = Context::Create();
  ASSERT_TRUE(ctx.ok());
  auto worker = Worker::Create(**ctx);
  ASSERT_TRUE(worker.ok());
  auto ep = Endpoint::Connect(**worker, info.address, Endpoint::ErrorMode::kNone);
  ASSERT_TRUE(ep.ok());
  auto region = (*ep)->OpenRegion(info.rkey, info.base, info.bytes);
  ASSERT_TRUE(region.ok());
  std::vector<uint8_t> buf(info.bytes, 1);
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel.store(true);
  });
  const auto t0 = std::chrono::steady_clock::now();
  Status st;
  // A get needs the owner's progress under active-message emulation: it waits until the
  // cancel flag stops it, not for the 10-minute deadline.
  st = (*region)->Get(0, buf.data(), buf.size(), 600000, &cancel);
  canceller.join();
  EXPECT_LT(SecondsSince(t0), 60.0);
  EXPECT_EQ(st.code(), StatusCode::kCancelled) << st.ToString();
  EXPECT_FALSE((*ep)->healthy());
  EXPECT_EQ((*ep)->Flush().code(), StatusCode::kUnavailable);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// A transfer cancelled while the owner is alive (a request cancelled mid-transfer): the
// endpoint is force-closed, the owner keeps running, and a new endpoint to it works.
TEST(Ucx, CancelAgainstALiveOwnerLeavesItServing) {
  constexpr size_t kBytes = 32u << 20;
  RegionInfo info;
  pid_t pid = StartOwner(kBytes, /*progress=*/true, &info);
  ASSERT_GT(pid, 0);
  auto ctx = Context::Create();
  ASSERT_TRUE(ctx.ok());
  auto worker = Worker::Create(**ctx);
  ASSERT_TRUE(worker.ok());
  std::vector<uint8_t> src(kBytes, 0x11);
  {
    auto ep = Endpoint::Connect(**worker, info.address, Endpoint::ErrorMode::kNone);
    ASSERT_TRUE(ep.ok());
    auto region = (*ep)->OpenRegion(info.rkey, info.base, info.bytes);
    ASSERT_TRUE(region.ok());
    std::vector<RemoteRegion::Segment> segs;
    for (size_t off = 0; off < kBytes; off += 256u << 10) {
      segs.push_back({off, src.data() + off, 256u << 10});
    }
    std::atomic<bool> cancel{true};  // cancelled before the puts could finish
    Status st = (*region)->PutAll(segs, 600000, &cancel);
    EXPECT_EQ(st.code(), StatusCode::kCancelled) << st.ToString();
    EXPECT_FALSE((*ep)->healthy());
  }
  // What the cancelled puts had posted has landed (or was dropped) by now: the check below
  // writes and reads back part of the same range.
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, WNOHANG), 0) << "the owner died";
  auto ep = Endpoint::Connect(**worker, info.address, Endpoint::ErrorMode::kNone);
  ASSERT_TRUE(ep.ok());
  auto region = (*ep)->OpenRegion(info.rkey, info.base, info.bytes);
  ASSERT_TRUE(region.ok());
  std::vector<uint8_t> pattern(1u << 20), back(1u << 20);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = Pattern(i, 9);
  ASSERT_TRUE((*region)->Put(4u << 20, pattern.data(), pattern.size(), 30000).ok());
  ASSERT_TRUE((*ep)->Flush(30000).ok());
  ASSERT_TRUE((*region)->Get(4u << 20, back.data(), back.size(), 30000).ok());
  EXPECT_EQ(back, pattern);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

TEST(Ucx, InProcessLoopbackAndBounds) {
  auto ctx = Context::Create();
  ASSERT_TRUE(ctx.ok());
  auto owner = Worker::Create(**ctx);
  auto user = Worker::Create(**ctx);
  ASSERT_TRUE(owner.ok() && user.ok());
  std::vector<uint8_t> mem(4096 + 37, 0);
  auto region = MemoryRegion::Register(**ctx, mem.data(), mem.size());
  ASSERT_TRUE(region.ok());
  (*owner)->StartProgressThread();
  auto ep = Endpoint::Connect(**user, (*owner)->Address());
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  auto rr = (*ep)->OpenRegion((*region)->PackedRkey(), (*region)->base(), (*region)->size());
  ASSERT_TRUE(rr.ok());
  std::vector<uint8_t> src(37);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i + 1);
  ASSERT_TRUE((*rr)->Put(4096, src.data(), src.size()).ok());
  ASSERT_TRUE((*ep)->Flush().ok());
  EXPECT_EQ(std::memcmp(mem.data() + 4096, src.data(), src.size()), 0);
  EXPECT_EQ((*rr)->Put(4097, src.data(), src.size()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ((*ep)->OpenRegion("", 1, 1).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(Endpoint::Connect(**user, "").status().code(), StatusCode::kInvalidArgument);
  // An endpoint on a worker of its own reads what the first one wrote.
  auto own = Endpoint::ConnectOnOwnWorker(**ctx, (*owner)->Address());
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  EXPECT_NE(&(*own)->worker(), user->get());
  EXPECT_EQ(&(*own)->worker().context(), ctx->get());
  auto own_rr = (*own)->OpenRegion((*region)->PackedRkey(), (*region)->base(), (*region)->size());
  ASSERT_TRUE(own_rr.ok());
  std::vector<uint8_t> back(src.size(), 0);
  ASSERT_TRUE((*own_rr)->Get(4096, back.data(), back.size()).ok());
  EXPECT_EQ(back, src);
  EXPECT_EQ(Endpoint::ConnectOnOwnWorker(**ctx, "").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(Ucx, LaneTransportsFromPrintedInfo) {
  // What UCX 1.13's ucp_ep_print_info prints for a shared-memory and a tcp endpoint.
  const char* shm =
      "#                 lane[0]:  3:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255] am am_bw#0\n"
      "#                 lane[1]:  4:posix/memory.0 md[3]          -> md[3]/posix/sysdev[255]\n"
      "#                 lane[2]:  5:cma/memory.0 md[4]            -> md[4]/cma/sysdev[255] rma_bw#0\n"
      "#                  put[0]: 0..<short>..4294967296..<bcopy>..(inf)\n";
  EXPECT_EQ(LaneTransports(shm), (std::vector<std::string>{"sysv", "posix", "cma"}));
  const char* tcp =
      "#                 lane[0]:  2:tcp/eth0.0 md[1]              -> md[1]/tcp/sysdev[255] am am_bw#0 keepalive wireup\n"
      "#                 lane[1]:  2:tcp/eth0.0 md[1]              -> md[1]/tcp/sysdev[255] rma_bw#0\n";
  EXPECT_EQ(LaneTransports(tcp), (std::vector<std::string>{"tcp"}));
  EXPECT_TRUE(LaneTransports("# UCP endpoint\n#  peer: <no debug data>\n").empty());
}

// A real endpoint names its transports: tcp when peer failure detection is asked for (UCX
// 1.13 then takes only tcp), shared memory between two workers of one process otherwise.
TEST(Ucx, EndpointNamesItsTransports) {
  if (std::getenv("PW_UCX_ERR_MODE") != nullptr) GTEST_SKIP() << "PW_UCX_ERR_MODE overrides the modes";
  auto ctx = Context::Create();
  ASSERT_TRUE(ctx.ok());
  auto owner = Worker::Create(**ctx);
  auto user = Worker::Create(**ctx);
  ASSERT_TRUE(owner.ok() && user.ok());
  (*owner)->StartProgressThread();
  auto tcp = Endpoint::Connect(**user, (*owner)->Address(), Endpoint::ErrorMode::kPeer);
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  auto t = (*tcp)->Transports();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t, "tcp");
  auto shm = Endpoint::Connect(**user, (*owner)->Address(), Endpoint::ErrorMode::kNone);
  ASSERT_TRUE(shm.ok()) << shm.status().ToString();
  auto s = (*shm)->Transports();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->find("tcp"), std::string::npos) << *s;
  EXPECT_TRUE(s->find("sysv") != std::string::npos || s->find("posix") != std::string::npos ||
              s->find("cma") != std::string::npos)
      << *s;
  (*shm)->Fail("test over");
  EXPECT_EQ((*shm)->Transports().status().code(), StatusCode::kUnavailable);
}

// The local addresses ("a.b.c.d:port", IPv6 as "[hex]:port") of this process's listening TCP
// sockets, from /proc/self/fd and /proc/net/tcp{,6}.
std::vector<std::string> OwnListeningAddresses() {
  std::set<std::string> inodes;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char link[256];
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
      if (n <= 0) continue;
      std::string l(link, static_cast<size_t>(n));
      if (l.rfind("socket:[", 0) == 0) inodes.insert(l.substr(8, l.size() - 9));
    }
    closedir(d);
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
      in >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (st != "0A" || inodes.count(inode) == 0) continue;  // 0A: LISTEN
      const size_t colon = local.find(':');
      const std::string ip = local.substr(0, colon);
      const unsigned port = std::stoul(local.substr(colon + 1), nullptr, 16);
      if (ip.size() == 8) {
        const unsigned long a = std::stoul(ip, nullptr, 16);  // little-endian on x86
        out.push_back(std::to_string(a & 255) + "." + std::to_string((a >> 8) & 255) + "." +
                      std::to_string((a >> 16) & 255) + "." + std::to_string(a >> 24) + ":" +
                      std::to_string(port));
      } else {
        out.push_back("[" + ip + "]:" + std::to_string(port));
      }
    }
  }
  return out;
}

TEST(UcxBindHost, InterfaceOfTheConfiguredHost) {
  EXPECT_EQ(*NetDeviceForHost("127.0.0.1"), "lo");
  EXPECT_EQ(*NetDeviceForHost("localhost"), "lo");
  EXPECT_EQ(*NetDeviceForHost("0.0.0.0"), "");
  EXPECT_EQ(NetDeviceForHost("203.0.113.77").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(NetDeviceForHost("not-an-ip").status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(SetBindHostFromEndpoint("tcp://203.0.113.77:5555").ok());
}

// A worker's UCX listeners (its TCP transport listens on each interface it uses) are on
// 127.0.0.1 only, by default and with the bind host set from a loopback endpoint. In a child
// process, like the other UCX tests: the parent creates no UCX state.
TEST(UcxBindHost, WorkerListensOnLoopbackOnly) {
  if (std::getenv("UCX_NET_DEVICES") != nullptr) GTEST_SKIP() << "UCX_NET_DEVICES is set";
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    int code = 0;
    std::string report;
    if (!SetBindHostFromEndpoint("tcp://127.0.0.1:5555").ok()) code = 20;
    auto ctx = Context::Create();
    auto worker = ctx.ok() ? Worker::Create(**ctx) : Result<std::unique_ptr<Worker>>(ctx.status());
    if (!worker.ok()) code = 21;
    for (const std::string& a : OwnListeningAddresses()) report += a + "\n";
    (void)WriteBlob(fds[1], report);
    _exit(code);
  }
  close(fds[1]);
  std::string report;
  ASSERT_TRUE(ReadBlob(fds[0], &report));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  std::istringstream in(report);
  std::string addr;
  int listeners = 0;
  while (std::getline(in, addr)) {
    ++listeners;
    EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << "UCX listens on " << addr;
  }
  EXPECT_GT(listeners, 0) << "no UCX listener found: the check proves nothing";
}

}  // namespace
}  // namespace pw::transport::ucx
