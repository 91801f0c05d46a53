// UCX (ucp) data plane: RAII wrappers for a context, a worker (with its progress thread), a
// registered memory region, an endpoint to a peer's worker, and one-sided put/get into a
// peer's registered region.
//
// How peers meet: the owner of registered memory publishes, over the control plane
// (proto UcxMemory), its worker address (Worker::Address), the packed rkey
// (MemoryRegion::PackedRkey), the region's base address and length. A peer connects an Endpoint
// to the worker address, opens a RemoteRegion from the rkey, base and length, and puts/gets by
// byte offset; every access is bounds-checked against the advertised length first.
//
// Progress (DESIGN.md, lessons): Debian's UCX 1.13 emulates RMA with active messages on shared
// memory and TCP, so the process that OWNS registered memory must keep calling
// ucp_worker_progress or its peers hang. Every process that registers memory therefore runs
// Worker::StartProgressThread(), which progresses while there is work and otherwise sleeps on
// the worker's event fd (or polls every 100 us where wakeup is unavailable).
//
// Failure detection (Endpoint::ErrorMode). kPeer asks UCX for peer error handling: a dead peer
// fails operations through the transport, but UCX 1.13 then selects only transports that can
// detect peer failure, which on one host means tcp over loopback (~10x slower than memory).
// kNone lets UCX use shared memory (sysv/posix/cma) and gives up transport-level detection; a
// dead peer is then noticed by the caller: every blocking call has a deadline, and a
// caller-owned cancel flag (set when the control plane declares the peer dead or the request
// is cancelled) ends a wait early. Either way the endpoint is then closed, so no operation is
// left referring to caller memory: after a cancel, once what was already posted has landed
// (flush, up to 1 s, so a live peer gets no late write from it), forcibly otherwise; after a
// deadline, forcibly at once (a late write to a peer that was only slow remains possible).
// The caller reconnects with a new Endpoint.
//
// Workers per peer: with kNone, a peer killed while puts to it are queued can leave the worker
// those puts were posted on unable to complete any later operation, to any peer (UCX 1.13:
// tests/services/transport/ucx_test.cc reproduced it in about a third of runs of a kill
// mid-transfer; a new endpoint on the same worker timed out too, a new worker on the same
// context did not). So an initiator that must outlive its peers connects with
// Endpoint::ConnectOnOwnWorker: each endpoint then progresses a worker of its own, destroyed
// with it, and a dead peer takes only that worker down.
// PW_UCX_ERR_MODE=peer|none in the environment overrides the mode every caller asks for.
//
// Threading: the context and workers are created in UCS_THREAD_MODE_MULTI; any thread may
// post put/get/flush while the progress thread runs. One Endpoint (and its RemoteRegions) is
// used by one thread at a time; only the cancel flags may be set from other threads. Blocking
// calls return once the operation completed, `timeout_ms` passed (kDeadlineExceeded) or the
// cancel flag was set (kCancelled); after either of the last two, or a peer failure
// (kUnavailable), the endpoint is failed and closed and refuses further operations.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"

namespace pw::transport::ucx {

// Where UCX listens. Its TCP transport opens a listening socket on every network interface it
// uses, so a Context is confined to the one interface that carries the process's configured
// bind host (127.0.0.1 by default: lo). "0.0.0.0" or "*" leaves UCX on every interface.
// UCX_NET_DEVICES in the environment wins over both. Call before Context::Create; errors when
// no interface has the address.
Status SetBindHost(const std::string& host);
// The host of a "tcp://HOST:PORT" endpoint, passed to SetBindHost.
Status SetBindHostFromEndpoint(const std::string& endpoint);
// The interface carrying IPv4 address `host` ("lo" for 127.0.0.1); "" for a wildcard.
Result<std::string> NetDeviceForHost(const std::string& host);

// The transport names of the lanes ucp_ep_print_info prints ("#  lane[0]:  2:tcp/lo.0 md[1]
// ..." -> "tcp"), distinct, in lane order.
std::vector<std::string> LaneTransports(std::string_view ep_info);

class Context {
 public:
  // Initialises ucp with RMA (+ wakeup). Transports come from UCX_TLS (default: all usable);
  // network devices from SetBindHost.
  static Result<std::unique_ptr<Context>> Create();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ucp_context_h handle() const { return ctx_; }

 private:
  explicit Context(ucp_context_h c) : ctx_(c) {}
  ucp_context_h ctx_;
};

class Worker {
 public:
  static Result<std::unique_ptr<Worker>> Create(Context& ctx);
  ~Worker();  // stops the progress thread first
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Opaque bytes a peer passes to Endpoint::Connect.
  const std::string& Address() const { return address_; }
  // Starts / stops the background progress thread (idempotent).
  void StartProgressThread();
  void StopProgressThread();
  bool progress_thread_running() const { return thread_.joinable(); }
  // One call to ucp_worker_progress; returns the number of events handled.
  unsigned Progress() { return ucp_worker_progress(worker_); }
  // Orders the calling thread after every write that peers' puts have completed into this
  // worker's registered memory. The progress thread performs those writes (emulated RMA) under
  // the worker's lock (thread mode MULTI); progressing once from this thread takes that lock,
  // so the writes happen-before what the caller reads next. Call it after learning over the
  // control plane that a peer's puts are done (KvReady → StartDecode), before reading the data.
  void SyncWithProgress() { (void)ucp_worker_progress(worker_); }
  ucp_worker_h handle() const { return worker_; }
  // The context this worker was created from.
  Context& context() const { return ctx_; }

 private:
  Worker(Context& ctx, ucp_worker_h w) : ctx_(ctx), worker_(w) {}
  void ProgressLoop();
  Context& ctx_;
  ucp_worker_h worker_;
  std::string address_;
  int efd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Memory registered with a context (ucp_mem_map of an existing buffer; the buffer stays owned
// by the caller and must outlive the region).
class MemoryRegion {
 public:
  static Result<std::unique_ptr<MemoryRegion>> Register(Context& ctx, void* addr, size_t bytes);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  // Packed remote key bytes (what peers need, with base() and size(), to access the region).
  const std::string& PackedRkey() const { return rkey_; }
  uint64_t base() const { return reinterpret_cast<uint64_t>(addr_); }
  size_t size() const { return bytes_; }

 private:
  MemoryRegion(Context& ctx, ucp_mem_h m, void* addr, size_t bytes)
      : ctx_(ctx), mem_(m), addr_(addr), bytes_(bytes) {}
  Context& ctx_;
  ucp_mem_h mem_;
  void* addr_;
  size_t bytes_;
  std::string rkey_;
};

class RemoteRegion;

// A connection from a local worker to a peer's worker.
class Endpoint {
 public:
  enum class ErrorMode {
    kPeer,  // UCP_ERR_HANDLING_MODE_PEER: transports that detect peer failure (tcp here)
    kNone,  // UCP_ERR_HANDLING_MODE_NONE: shared memory; deadlines and cancel flags only
  };
  // `remote_address`: the peer's Worker::Address() bytes, as received over the control plane.
  static Result<std::unique_ptr<Endpoint>> Connect(Worker& worker, std::string_view remote_address,
                                                   ErrorMode mode = ErrorMode::kPeer);
  // Connects from a new worker of `ctx` that this endpoint owns (no progress thread: its waits
  // progress it) and destroys after closing. Memory registered with `ctx` serves as local
  // buffers as usual. For initiators that reconnect after a peer died (see the header comment).
  static Result<std::unique_ptr<Endpoint>> ConnectOnOwnWorker(Context& ctx,
                                                              std::string_view remote_address,
                                                              ErrorMode mode = ErrorMode::kPeer);
  // The mode Connect uses when asked for `requested`: PW_UCX_ERR_MODE (peer|none) wins.
  static ErrorMode EffectiveMode(ErrorMode requested);
  ~Endpoint();  // closes (flushing when healthy, bounded by 2 s; forcibly otherwise)
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Opens the peer region [base, base + bytes) described by a packed rkey.
  // kCorrupt when the rkey bytes do not unpack.
  Result<std::unique_ptr<RemoteRegion>> OpenRegion(std::string_view packed_rkey, uint64_t base,
                                                   uint64_t bytes);
  // Waits until every put/get posted on this endpoint is complete at the peer.
  Status Flush(int timeout_ms = 30000, const std::atomic<bool>* cancel = nullptr);
  // Fails the endpoint and force-closes it now (the peer is known dead or restarted): pending
  // operations complete with an error and later ones return kUnavailable.
  void Fail(const char* why);
  // False once the peer failed, an operation timed out or was cancelled, or Fail was called.
  bool healthy() const { return !failed_.load(); }
  ErrorMode mode() const { return mode_; }
  // Waits on this endpoint poll the worker for `spins` rounds, then sleep `sleep_us` between
  // polls (0, the default: poll without sleeping). A background endpoint sharing few cores with
  // latency-critical work sets it, so its waits do not take a core from them. Set before use.
  void SetWaitBackoff(uint32_t spins, uint32_t sleep_us) {
    backoff_spins_ = spins;
    backoff_sleep_us_ = sleep_us;
  }
  Worker& worker() { return worker_; }
  ucp_ep_h handle() const { return ep_; }
  // The UCX transports of this endpoint's lanes, distinct, in lane order, joined by '+' ("tcp"
  // between hosts or network namespaces, "sysv+posix+cma" between processes of one host with
  // ErrorMode::kNone). UCX 1.13 has no ucp_ep_query for it (UCP_EP_ATTR_FIELD_TRANSPORTS came
  // in 1.14): read from ucp_ep_print_info. kUnavailable when the endpoint is closed or UCX
  // printed no lane.
  Result<std::string> Transports() const;

 private:
  friend class RemoteRegion;
  Endpoint(Worker& w, ucp_ep_h ep, ErrorMode mode) : worker_(w), ep_(ep), mode_(mode) {}
  Endpoint(std::unique_ptr<Worker> own, ErrorMode mode)
      : own_worker_(std::move(own)), worker_(*own_worker_), ep_(nullptr), mode_(mode) {}
  // Creates the ucp endpoint of `ep` (constructed with ep_ null) to `remote_address`.
  static Status CreateUcpEndpoint(Endpoint& ep, std::string_view remote_address);
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);
  // Waits for requests returned by *_nbx calls (null entries completed in place) and frees
  // them. On deadline, cancel or error the endpoint is failed and force-closed.
  Status Wait(std::span<const ucs_status_ptr_t> reqs, const char* what, int timeout_ms,
              const std::atomic<bool>* cancel);
  // Closes ep_ (force: without flushing) and waits up to 2 s for the close.
  void Close(bool force);
  std::unique_ptr<Worker> own_worker_;  // set by ConnectOnOwnWorker; outlives the close
  Worker& worker_;
  ucp_ep_h ep_;
  ErrorMode mode_;
  uint32_t backoff_spins_ = 0;
  uint32_t backoff_sleep_us_ = 0;
  std::atomic<bool> failed_{false};
};

// A peer's registered region, reached through an Endpoint (which must outlive it).
class RemoteRegion {
 public:
  ~RemoteRegion();
  RemoteRegion(const RemoteRegion&) = delete;
  RemoteRegion& operator=(const RemoteRegion&) = delete;

  // Copies `bytes` from local memory to region offset `offset`; returns once the local buffer
  // may be reused (call Endpoint::Flush before telling the peer the data is there).
  // kOutOfRange when [offset, offset + bytes) is outside the region.
  Status Put(uint64_t offset, const void* local, size_t bytes, int timeout_ms = 30000,
             const std::atomic<bool>* cancel = nullptr);
  // Several puts posted back to back, then waited for together (one deadline for all). Every
  // range is checked before the first is posted.
  struct Segment {
    uint64_t offset = 0;
    const void* local = nullptr;
    size_t bytes = 0;
  };
  Status PutAll(std::span<const Segment> segments, int timeout_ms = 30000,
                const std::atomic<bool>* cancel = nullptr);
  // Copies `bytes` from region offset `offset` into local memory; returns once they arrived.
  Status Get(uint64_t offset, void* local, size_t bytes, int timeout_ms = 30000,
             const std::atomic<bool>* cancel = nullptr);
  // Several gets posted back to back, then waited for together (one deadline for all). Every
  // range is checked before the first is posted.
  struct GetSegment {
    uint64_t offset = 0;
    void* local = nullptr;
    size_t bytes = 0;
  };
  Status GetAll(std::span<const GetSegment> segments, int timeout_ms = 30000,
                const std::atomic<bool>* cancel = nullptr);
  uint64_t size() const { return bytes_; }

 private:
  friend class Endpoint;
  RemoteRegion(Endpoint& ep, ucp_rkey_h rkey, uint64_t base, uint64_t bytes)
      : ep_(ep), rkey_(rkey), base_(base), bytes_(bytes) {}
  Status CheckRange(uint64_t offset, size_t bytes) const;
  Endpoint& ep_;
  ucp_rkey_h rkey_;
  uint64_t base_;
  uint64_t bytes_;
};

}  // namespace pw::transport::ucx
