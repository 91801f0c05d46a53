// pw-bench-ucx: KV-transfer throughput over UCX between two processes on this host, next to a
// plain memcpy of the same bytes in the same chunks.
//
//   pw-bench-ucx [--mib 256] [--reps 5] [--chunks-kib 32,256,1024,4096] [--modes none,peer]
//                [--owner-netns NAME --owner-host IP --host IP]
//
// The owner process registers a region of --mib MiB and progresses it from a thread (as a
// decode worker does with its KV pool); the initiator, once per endpoint error mode (none:
// shared memory, what the prefill worker uses for KV; peer: peer error handling, tcp here),
// writes the region chunk by chunk from its own buffer of the same size:
//   put     one blocking put per chunk (waits for each), one flush per pass
//   putall  every chunk of the pass posted at once, one wait, one flush (the prefill worker's
//           way: one put per run of contiguous blocks, all posted, then a flush)
//   get     one blocking get per chunk
// and memcpy copies the same bytes in the same chunks inside one process. Buffers are larger
// than the last-level cache only when --mib is (use >= 512 here to measure DRAM, not the cache).
// Prints one line per (mode, operation, chunk size): median GB/s over --reps passes.
// PW_BENCH_EP_INFO=1 prints each endpoint's UCX lanes (which transports carry RMA).
//
// Across hosts, as between two pods: --owner-netns NAME runs the owner in network namespace
// NAME (`ip netns add NAME`, /run/netns/NAME; root; with /sys remounted, as `ip netns exec`
// does), --owner-host and --host name the IPv4
// address each side's UCX uses (ucx::SetBindHost: its interface, e.g. the two ends of a veth
// pair). Without them each side's UCX stays on `lo`, and the owner's worker address then
// offers 127.0.0.1, which from the other namespace is the initiator's own loopback: its
// connection goes nowhere. With UCX_TLS=tcp (shared memory would otherwise still join two
// network namespaces of one host) this is the KV transfer between two nodes.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "services/transport/ucx.h"
#include "services/transport/pipe_io.h"

namespace {

using Clock = std::chrono::steady_clock;
using pw::transport::ReadAll;
using pw::transport::ReadBlob;
using pw::transport::WriteAll;
using pw::transport::WriteBlob;
using pw::transport::ucx::Context;
using pw::transport::ucx::Endpoint;
using pw::transport::ucx::MemoryRegion;
using pw::transport::ucx::Worker;


double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

int Fail(const char* what) {
  std::fprintf(stderr, "pw-bench-ucx: %s\n", what);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 256;
  int reps = 5;
  std::vector<size_t> chunks_kib = {32, 256, 1024, 4096};
  std::vector<std::string> modes = {"none", "peer"};
  std::string owner_netns, owner_host, host;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "pw-bench-ucx: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mib") {
      mib = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--reps") {
      reps = std::atoi(next().c_str());
    } else if (a == "--chunks-kib") {
      chunks_kib.clear();
      for (const std::string& v : SplitCommas(next())) {
        chunks_kib.push_back(std::strtoull(v.c_str(), nullptr, 10));
      }
    } else if (a == "--owner-netns") {
      owner_netns = next();
    } else if (a == "--owner-host") {
      owner_host = next();
    } else if (a == "--host") {
      host = next();
    } else if (a == "--modes") {
      modes = SplitCommas(next());
      for (const std::string& m : modes) {
        if (m != "none" && m != "peer") return Fail("--modes takes none and/or peer");
      }
    } else {
      std::fprintf(stderr,
                   "usage: pw-bench-ucx [--mib N] [--reps N] [--chunks-kib a,b,..] "
                   "[--modes none,peer] [--owner-netns NAME --owner-host IP --host IP]\n");
      return 2;
    }
  }
  if (mib == 0 || reps <= 0 || chunks_kib.empty() || modes.empty()) return Fail("bad arguments");
  for (size_t c : chunks_kib) {
    if (c == 0 || c * 1024 > mib << 20) return Fail("chunk size must be in (0, region]");
  }
  const size_t bytes = mib << 20;
  if (!owner_netns.empty() && (owner_host.empty() || host.empty())) {
    return Fail("--owner-netns needs --owner-host and --host (each side's address; lo's 127.0.0.1 "
                "does not reach across namespaces)");
  }
  if (!host.empty()) {
    pw::Status st = pw::transport::ucx::SetBindHost(host);
    if (!st.ok()) return Fail(("--host: " + st.ToString()).c_str());
  }

  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return Fail("pipe");
  pid_t pid = fork();
  if (pid < 0) return Fail("fork");
  if (pid == 0) {
    // Owner: registered region + progress thread, until the initiator says it is done (or its
    // end of the pipe closes: the owner keeps no write end of its own, and dies with it).
    close(to_child[1]);
    close(to_parent[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) _exit(9);
    if (!owner_netns.empty()) {
      const int fd = open(("/run/netns/" + owner_netns).c_str(), O_RDONLY | O_CLOEXEC);
      // As `ip netns exec` does: the namespace, and /sys remounted in a mount namespace of our
      // own, since UCX finds network devices under /sys/class/net (the old /sys shows the
      // initiator's).
      if (fd < 0 || setns(fd, CLONE_NEWNET) != 0 || unshare(CLONE_NEWNS) != 0 ||
          mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0 || umount2("/sys", MNT_DETACH) != 0 ||
          mount(owner_netns.c_str(), "/sys", "sysfs", 0, nullptr) != 0) {
        std::fprintf(stderr, "pw-bench-ucx: cannot enter network namespace %s: %s\n", owner_netns.c_str(),
                     std::strerror(errno));
        _exit(7);
      }
      close(fd);
    }
    if (!owner_host.empty()) {
      pw::Status st = pw::transport::ucx::SetBindHost(owner_host);
      if (!st.ok()) {
        std::fprintf(stderr, "pw-bench-ucx: --owner-host: %s\n", st.ToString().c_str());
        _exit(8);
      }
    }
    std::vector<uint8_t> mem(bytes, 1);
    auto ctx = Context::Create();
    if (!ctx.ok()) _exit(3);
    auto worker = Worker::Create(**ctx);
    if (!worker.ok()) _exit(4);
    auto region = MemoryRegion::Register(**ctx, mem.data(), mem.size());
    if (!region.ok()) _exit(5);
    (*worker)->StartProgressThread();
    uint64_t base = (*region)->base(), n = (*region)->size();
    if (!WriteBlob(to_parent[1], (*worker)->Address()) ||
        !WriteBlob(to_parent[1], (*region)->PackedRkey()) || !WriteAll(to_parent[1], &base, 8) ||
        !WriteAll(to_parent[1], &n, 8)) {
      _exit(6);
    }
    char bye;
    (void)ReadAll(to_child[0], &bye, 1, -1);
    _exit(0);
  }
  close(to_child[0]);
  close(to_parent[1]);
  std::string address, rkey;
  uint64_t base = 0, n = 0;
  if (!ReadBlob(to_parent[0], &address) || !ReadBlob(to_parent[0], &rkey) ||
      !ReadAll(to_parent[0], &base, 8) || !ReadAll(to_parent[0], &n, 8)) {
    return Fail("owner process did not start");
  }
  auto ctx = Context::Create();
  if (!ctx.ok()) return Fail(ctx.status().ToString().c_str());
  auto worker = Worker::Create(**ctx);
  if (!worker.ok()) return Fail(worker.status().ToString().c_str());

  std::vector<uint8_t> src(bytes, 7), dst(bytes, 9);
  const char* tls = std::getenv("UCX_TLS");
  std::printf("# region %zu MiB, %d reps, UCX_TLS=%s; GB/s = 1e9 bytes/s, median\n", mib, reps,
              tls ? tls : "(default)");
  if (!owner_netns.empty()) {
    std::printf("# owner in network namespace %s at %s, initiator at %s\n", owner_netns.c_str(),
                owner_host.c_str(), host.c_str());
  }
  std::printf("%-6s %-8s %10s %10s\n", "mode", "op", "chunk_KiB", "GB/s");
  int rc = 0;
  for (const std::string& mode : modes) {
    const auto want = mode == "none" ? Endpoint::ErrorMode::kNone : Endpoint::ErrorMode::kPeer;
    if (Endpoint::EffectiveMode(want) != want) {
      std::printf("# PW_UCX_ERR_MODE overrides mode %s\n", mode.c_str());
    }
    auto ep = Endpoint::Connect(**worker, address, want);
    if (!ep.ok()) return Fail(ep.status().ToString().c_str());
    auto region = (*ep)->OpenRegion(rkey, base, n);
    if (!region.ok()) return Fail(region.status().ToString().c_str());
    if (auto t = (*ep)->Transports(); t.ok()) std::printf("# mode %s: UCX transport %s\n", mode.c_str(), t->c_str());
    if (std::getenv("PW_BENCH_EP_INFO") != nullptr) {
      std::printf("# endpoint, mode %s:\n", mode.c_str());
      std::fflush(stdout);
      ucp_ep_print_info((*ep)->handle(), stdout);
    }
    for (size_t ck : chunks_kib) {
      const size_t chunk = ck * 1024;
      for (const char* op : {"put", "putall", "get", "memcpy"}) {
        const std::string o = op;
        std::vector<double> gbps;
        for (int r = 0; r < reps && rc == 0; ++r) {
          auto t0 = Clock::now();
          pw::Status st;
          if (o == "putall") {
            std::vector<pw::transport::ucx::RemoteRegion::Segment> segs;
            for (size_t off = 0; off < bytes; off += chunk) {
              segs.push_back({off, src.data() + off, std::min(chunk, bytes - off)});
            }
            st = (*region)->PutAll(segs);
          } else {
            for (size_t off = 0; off < bytes && st.ok(); off += chunk) {
              size_t len = std::min(chunk, bytes - off);
              if (o == "put") {
                st = (*region)->Put(off, src.data() + off, len);
              } else if (o == "get") {
                st = (*region)->Get(off, dst.data() + off, len);
              } else {
                std::memcpy(dst.data() + off, src.data() + off, len);
              }
            }
          }
          if (st.ok() && o.rfind("put", 0) == 0) st = (*ep)->Flush();
          if (!st.ok()) {
            std::fprintf(stderr, "pw-bench-ucx: %s %s: %s\n", mode.c_str(), op,
                         st.ToString().c_str());
            rc = 1;
            break;
          }
          double s = std::chrono::duration<double>(Clock::now() - t0).count();
          gbps.push_back(static_cast<double>(bytes) / s / 1e9);
        }
        if (rc != 0) break;
        std::printf("%-6s %-8s %10zu %10.2f\n", mode.c_str(), op, ck, Median(gbps));
        std::fflush(stdout);
      }
      if (rc != 0) break;
    }
    region->reset();
    ep->reset();
    if (rc != 0) break;
  }
  char bye = 'b';
  (void)WriteAll(to_child[1], &bye, 1);
  int status = 0;
  waitpid(pid, &status, 0);
  return rc;
}
