// UCX (ucp) data plane: RAII wrappers for a context, a worker (with its progress thread), a
// registered memory region, an endpoint to a peer's worker, and one-sided put/get into a
// peer's registered region.
//
// How peers meet: the owner of registered memory publishes, over the control plane
// (proto UcxMemory), its worker address (Worker::Address), the packed rkey
// (MemoryRegion::PackRkey), the region's base address and length. A peer connects an Endpoint
// to the worker address, opens a RemoteRegion from the rkey, base and length, and puts/gets by
// byte offset; every access is bounds-checked against the advertised length first.
//
// Progress (DESIGN.md, lessons): Debian's UCX 1.13 emulates RMA with active messages on shared
// memory and TCP, so the process that OWNS registered memory must keep calling
// ucp_worker_progress or its peers hang. Every process that registers memory therefore runs
// Worker::StartProgressThread(), which progresses while there is work and otherwise sleeps on
// the worker's event fd (or polls every 100 us where wakeup is unavailable).
//
// Threading: the context and workers are created in UCS_THREAD_MODE_MULTI; any thread may
// post put/get/flush while the progress thread runs. Blocking calls return once the operation
// completed or `timeout_ms` passed (kDeadlineExceeded; the endpoint is then marked failed).
// A peer that dies fails pending and later operations with kUnavailable (peer error handling).
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "common/status.h"

namespace pw::transport::ucx {

class Context {
 public:
  // Initialises ucp with RMA (+ wakeup). Transports come from UCX_TLS (default: all usable).
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
  ucp_worker_h handle() const { return worker_; }

 private:
  explicit Worker(ucp_worker_h w) : worker_(w) {}
  void ProgressLoop();
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
  // `remote_address`: the peer's Worker::Address() bytes, as received over the control plane.
  static Result<std::unique_ptr<Endpoint>> Connect(Worker& worker, std::string_view remote_address);
  ~Endpoint();  // closes (flushing when the peer is alive; forcibly otherwise)
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Opens the peer region [base, base + bytes) described by a packed rkey.
  // kCorrupt when the rkey bytes do not unpack.
  Result<std::unique_ptr<RemoteRegion>> OpenRegion(std::string_view packed_rkey, uint64_t base,
                                                   uint64_t bytes);
  // Waits until every put/get posted on this endpoint is complete at the peer.
  Status Flush(int timeout_ms = 30000);
  // False once the peer failed or an operation timed out.
  bool healthy() const { return !failed_.load(); }
  Worker& worker() { return worker_; }
  ucp_ep_h handle() const { return ep_; }

 private:
  friend class RemoteRegion;
  Endpoint(Worker& w, ucp_ep_h ep) : worker_(w), ep_(ep) {}
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);
  // Waits for a request returned by a *_nbx call; frees it.
  Status Wait(ucs_status_ptr_t req, const char* what, int timeout_ms);
  Worker& worker_;
  ucp_ep_h ep_;
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
  Status Put(uint64_t offset, const void* local, size_t bytes, int timeout_ms = 30000);
  // Copies `bytes` from region offset `offset` into local memory; returns once they arrived.
  Status Get(uint64_t offset, void* local, size_t bytes, int timeout_ms = 30000);
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
