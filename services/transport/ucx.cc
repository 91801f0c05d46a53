#include "services/transport/ucx.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "common/logging.h"

namespace pw::transport::ucx {

namespace {

std::string UcsError(const char* what, ucs_status_t st) {
  return std::string(what) + ": " + ucs_status_string(st);
}

// How long a cancelled wait lets already-posted operations land before force-closing.
constexpr uint64_t kCancelGraceMs = 1000;

uint64_t NowMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

std::mutex g_bind_mu;
std::string g_net_device = "lo";  // guarded by g_bind_mu; "" = every interface

}  // namespace

// ---------------------------------------------------------------- bind host

Result<std::string> NetDeviceForHost(const std::string& host) {
  if (host == "0.0.0.0" || host == "*" || host.empty()) return std::string();
  if (host == "localhost") return NetDeviceForHost("127.0.0.1");
  in_addr want{};
  if (inet_pton(AF_INET, host.c_str(), &want) != 1) {
    return InvalidArgument("bind host '" + host + "' is not an IPv4 address");
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return IoError("getifaddrs failed");
  std::string dev;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == want.s_addr) {
      dev = a->ifa_name;
      break;
    }
  }
  freeifaddrs(list);
  if (dev.empty()) return NotFound("no network interface has address " + host);
  return dev;
}

Status SetBindHost(const std::string& host) {
  PW_ASSIGN_OR_RETURN(std::string dev, NetDeviceForHost(host));
  std::lock_guard<std::mutex> lock(g_bind_mu);
  g_net_device = dev;
  return Status::Ok();
}

Status SetBindHostFromEndpoint(const std::string& endpoint) {
  std::string rest = endpoint;
  if (rest.rfind("tcp://", 0) == 0) rest = rest.substr(6);
  const size_t colon = rest.rfind(':');
  return SetBindHost(colon == std::string::npos ? rest : rest.substr(0, colon));
}

// ---------------------------------------------------------------- Context

Result<std::unique_ptr<Context>> Context::Create() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return Unavailable(UcsError("ucp_config_read", st));
  if (std::getenv("UCX_NET_DEVICES") == nullptr) {
    std::string dev;
    {
      std::lock_guard<std::mutex> lock(g_bind_mu);
      dev = g_net_device;
    }
    if (!dev.empty()) {
      st = ucp_config_modify(config, "NET_DEVICES", dev.c_str());
      if (st != UCS_OK) {
        ucp_config_release(config);
        return Unavailable(UcsError(("UCX NET_DEVICES=" + dev).c_str(), st));
      }
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // PW_UCX_WAKEUP=0 leaves out the wakeup feature (the progress thread then polls).
  const char* wake = std::getenv("PW_UCX_WAKEUP");
  const bool want_wakeup = wake == nullptr || std::string(wake) != "0";
  params.features = UCP_FEATURE_RMA | (want_wakeup ? UCP_FEATURE_WAKEUP : 0);
  params.mt_workers_shared = 1;
  ucp_context_h ctx = nullptr;
  st = ucp_init(&params, config, &ctx);
  if (st != UCS_OK && want_wakeup) {
    // Some transports lack wakeup support; RMA alone still works with a polling progress thread.
    params.features = UCP_FEATURE_RMA;
    st = ucp_init(&params, config, &ctx);
  }
  ucp_config_release(config);
  if (st != UCS_OK) return Unavailable(UcsError("ucp_init", st));
  return std::unique_ptr<Context>(new Context(ctx));
}

Context::~Context() { ucp_cleanup(ctx_); }

// ---------------------------------------------------------------- Worker

Result<std::unique_ptr<Worker>> Worker::Create(Context& ctx) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_MULTI;
  ucp_worker_h w = nullptr;
  ucs_status_t st = ucp_worker_create(ctx.handle(), &wp, &w);
  if (st != UCS_OK) return Unavailable(UcsError("ucp_worker_create", st));
  std::unique_ptr<Worker> worker(new Worker(ctx, w));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(w, &addr, &len);
  if (st != UCS_OK) return Unavailable(UcsError("ucp_worker_get_address", st));
  worker->address_.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(w, addr);
  int fd = -1;
  if (ucp_worker_get_efd(w, &fd) == UCS_OK) worker->efd_ = fd;
  return worker;
}

Worker::~Worker() {
  StopProgressThread();
  ucp_worker_destroy(worker_);
}

void Worker::StartProgressThread() {
  if (thread_.joinable()) return;
  stop_.store(false);
  thread_ = std::thread([this] { ProgressLoop(); });
}

void Worker::StopProgressThread() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  if (efd_ >= 0) ucp_worker_signal(worker_);
  thread_.join();
}

void Worker::ProgressLoop() {
  int idle_rounds = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    if (ucp_worker_progress(worker_) != 0) {
      idle_rounds = 0;
      continue;
    }
    // Spin briefly after activity (a transfer in flight), then sleep until an event.
    if (++idle_rounds < 2000) continue;
    if (efd_ >= 0) {
      ucs_status_t st = ucp_worker_arm(worker_);
      if (st == UCS_ERR_BUSY) continue;  // events pending: progress again
      if (st == UCS_OK) {
        pollfd p{efd_, POLLIN, 0};
        // Bounded wait: emulated RMA on some transports may not signal the fd.
        (void)poll(&p, 1, 1);
        continue;
      }
    }
    usleep(100);
  }
}

// ---------------------------------------------------------------- MemoryRegion

Result<std::unique_ptr<MemoryRegion>> MemoryRegion::Register(Context& ctx, void* addr,
                                                             size_t bytes) {
  if (addr == nullptr || bytes == 0) return InvalidArgument("cannot register an empty region");
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = addr;
  mp.length = bytes;
  ucp_mem_h mem = nullptr;
  ucs_status_t st = ucp_mem_map(ctx.handle(), &mp, &mem);
  if (st != UCS_OK)
    return ResourceExhausted(UcsError("ucp_mem_map", st) + " (" + std::to_string(bytes) +
                             " bytes)");
  std::unique_ptr<MemoryRegion> r(new MemoryRegion(ctx, mem, addr, bytes));
  void* packed = nullptr;
  size_t len = 0;
  st = ucp_rkey_pack(ctx.handle(), mem, &packed, &len);
  if (st != UCS_OK) return Internal(UcsError("ucp_rkey_pack", st));
  r->rkey_.assign(static_cast<const char*>(packed), len);
  ucp_rkey_buffer_release(packed);
  return r;
}

MemoryRegion::~MemoryRegion() { ucp_mem_unmap(ctx_.handle(), mem_); }

// ---------------------------------------------------------------- Endpoint

void Endpoint::OnError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* self = static_cast<Endpoint*>(arg);
  self->failed_.store(true);
  PW_LOG(WARNING) << "UCX endpoint to peer failed: " << ucs_status_string(status);
}

Endpoint::ErrorMode Endpoint::EffectiveMode(ErrorMode requested) {
  const char* em = std::getenv("PW_UCX_ERR_MODE");
  if (em == nullptr) return requested;
  const std::string v(em);
  if (v == "none") return ErrorMode::kNone;
  if (v == "peer") return ErrorMode::kPeer;
  return requested;
}

Status Endpoint::CreateUcpEndpoint(Endpoint& ep, std::string_view remote_address) {
  if (remote_address.empty()) return InvalidArgument("empty UCX worker address");
  std::string addr_copy(remote_address);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(addr_copy.data());
  // Peer error handling makes a dead peer fail operations instead of hanging them, but UCX
  // 1.13 then uses only transports that detect peer failure (tcp), not shared memory; without
  // it, deadlines, cancel flags and the forced close in Wait stand in (see the header).
  params.err_mode =
      ep.mode_ == ErrorMode::kNone ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  if (ep.mode_ == ErrorMode::kPeer) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_handler.cb = &Endpoint::OnError;
    params.err_handler.arg = &ep;
  }
  ucp_ep_h h = nullptr;
  ucs_status_t st = ucp_ep_create(ep.worker_.handle(), &params, &h);
  if (st != UCS_OK) {
    return Unavailable(UcsError("ucp_ep_create (malformed or unreachable worker address?)", st));
  }
  ep.ep_ = h;
  return Status::Ok();
}

Result<std::unique_ptr<Endpoint>> Endpoint::Connect(Worker& worker, std::string_view remote_address,
                                                    ErrorMode mode) {
  // Allocate first so the error callback has a stable pointer.
  std::unique_ptr<Endpoint> ep(new Endpoint(worker, nullptr, EffectiveMode(mode)));
  PW_RETURN_IF_ERROR(CreateUcpEndpoint(*ep, remote_address));
  return ep;
}

Result<std::unique_ptr<Endpoint>> Endpoint::ConnectOnOwnWorker(Context& ctx,
                                                               std::string_view remote_address,
                                                               ErrorMode mode) {
  if (remote_address.empty()) return InvalidArgument("empty UCX worker address");
  PW_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Create(ctx));
  std::unique_ptr<Endpoint> ep(new Endpoint(std::move(worker), EffectiveMode(mode)));
  PW_RETURN_IF_ERROR(CreateUcpEndpoint(*ep, remote_address));
  return ep;
}

void Endpoint::Close(bool force) {
  if (ep_ == nullptr) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep_, &p);
  ep_ = nullptr;
  if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
    const uint64_t deadline = NowMs() + 2000;
    while (ucp_request_check_status(req) == UCS_INPROGRESS && NowMs() < deadline) {
      worker_.Progress();
    }
    if (ucp_request_check_status(req) == UCS_INPROGRESS) {
      PW_LOG(WARNING) << "UCX endpoint close did not complete in 2 s";
    }
    ucp_request_free(req);  // released by UCX when it completes, if it has not yet
  }
}

Endpoint::~Endpoint() { Close(!healthy()); }

std::vector<std::string> LaneTransports(std::string_view ep_info) {
  std::vector<std::string> names;
  size_t pos = 0;
  while ((pos = ep_info.find("lane[", pos)) != std::string_view::npos) {
    // "lane[0]:  2:tcp/lo.0 md[1] ...": the name between the resource index's ':' and '/'.
    const size_t eol = std::min(ep_info.find('\n', pos), ep_info.size());
    const std::string_view line = ep_info.substr(pos, eol - pos);
    pos = eol;
    const size_t colon = line.find(':', line.find(']'));
    if (colon == std::string_view::npos) continue;
    const size_t start = line.find(':', line.find_first_not_of(' ', colon + 1));
    const size_t slash = line.find('/', start);
    if (start == std::string_view::npos || slash == std::string_view::npos) continue;
    std::string name(line.substr(start + 1, slash - start - 1));
    if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(std::move(name));
    }
  }
  return names;
}

Result<std::string> Endpoint::Transports() const {
  if (ep_ == nullptr) return Unavailable("UCX endpoint is closed");
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (f == nullptr) return Unavailable("open_memstream failed");
  ucp_ep_print_info(ep_, f);
  std::fclose(f);
  const std::string info(buf, len);
  std::free(buf);
  std::string joined;
  for (const std::string& n : LaneTransports(info)) joined += (joined.empty() ? "" : "+") + n;
  if (joined.empty()) return Unavailable("ucp_ep_print_info printed no lane: " + info);
  return joined;
}

void Endpoint::Fail(const char* why) {
  if (ep_ != nullptr) PW_LOG(INFO) << "UCX endpoint closed: " << why;
  failed_.store(true);
  Close(/*force=*/true);
}

Status Endpoint::Wait(std::span<const ucs_status_ptr_t> reqs, const char* what, int timeout_ms,
                      const std::atomic<bool>* cancel) {
  Status result;
  size_t pending = 0;
  for (ucs_status_ptr_t r : reqs) {
    if (UCS_PTR_IS_ERR(r)) {
      if (result.ok()) result = Unavailable(UcsError(what, UCS_PTR_STATUS(r)));
    } else if (r != nullptr) {
      ++pending;
    }
  }
  const uint64_t deadline = NowMs() + static_cast<uint64_t>(std::max(timeout_ms, 0));
  uint32_t spins = 0;
  while (pending > 0) {
    pending = 0;
    for (ucs_status_ptr_t r : reqs) {
      if (r != nullptr && !UCS_PTR_IS_ERR(r) && ucp_request_check_status(r) == UCS_INPROGRESS) {
        ++pending;
      }
    }
    if (pending == 0) break;
    worker_.Progress();
    if (backoff_sleep_us_ > 0 && spins >= backoff_spins_) usleep(backoff_sleep_us_);
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      if (result.ok()) result = Cancelled(std::string(what) + ": cancelled");
      break;
    }
    if ((++spins & 255) == 0 && NowMs() > deadline) {
      if (result.ok()) {
        result = DeadlineExceeded(std::string(what) + ": not complete after " +
                                  std::to_string(timeout_ms) + " ms");
      }
      break;
    }
  }
  // Cancelled (the request is abandoned, the peer may well be alive): let what is already
  // posted land, for a bounded grace period, so that no write of this endpoint reaches the
  // peer after a later write of another endpoint to the same memory.
  bool drained = false;
  if (result.code() == StatusCode::kCancelled && ep_ != nullptr) {
    ucp_request_param_t fp{};
    const ucs_status_ptr_t fr = ucp_ep_flush_nbx(ep_, &fp);
    const uint64_t grace =
        NowMs() +
        std::min<uint64_t>(kCancelGraceMs, static_cast<uint64_t>(std::max(timeout_ms, 0)));
    if (fr != nullptr && !UCS_PTR_IS_ERR(fr)) {
      while (ucp_request_check_status(fr) == UCS_INPROGRESS && NowMs() < grace) {
        worker_.Progress();
      }
      drained = ucp_request_check_status(fr) == UCS_OK;
      ucp_request_free(fr);
    } else {
      drained = fr == nullptr;
    }
  }
  for (ucs_status_ptr_t r : reqs) {
    if (r == nullptr || UCS_PTR_IS_ERR(r)) continue;
    const ucs_status_t st = ucp_request_check_status(r);
    if (st != UCS_INPROGRESS && st != UCS_OK && result.ok()) {
      result = Unavailable(UcsError(what, st));
    }
    // An unfinished request is released by UCX once it completes (the forced close below
    // completes it with an error).
    ucp_request_free(r);
  }
  if (!result.ok()) {
    failed_.store(true);
    // Closed now: nothing stays posted against the caller's buffers, and a dead peer cannot
    // hold the next wait. Forcibly unless everything posted has landed.
    Close(/*force=*/!drained);
  }
  return result;
}

Result<std::unique_ptr<RemoteRegion>> Endpoint::OpenRegion(std::string_view packed_rkey,
                                                           uint64_t base, uint64_t bytes) {
  if (packed_rkey.empty()) return Corrupt("empty rkey");
  if (bytes == 0 || base + bytes < base) return InvalidArgument("bad remote region bounds");
  if (ep_ == nullptr) return Unavailable("UCX endpoint failed");
  std::string copy(packed_rkey);
  ucp_rkey_h rkey = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(ep_, copy.data(), &rkey);
  if (st != UCS_OK) return Corrupt(UcsError("ucp_ep_rkey_unpack", st));
  return std::unique_ptr<RemoteRegion>(new RemoteRegion(*this, rkey, base, bytes));
}

Status Endpoint::Flush(int timeout_ms, const std::atomic<bool>* cancel) {
  if (!healthy() || ep_ == nullptr) return Unavailable("UCX endpoint failed");
  ucp_request_param_t p{};
  const ucs_status_ptr_t r = ucp_ep_flush_nbx(ep_, &p);
  return Wait({&r, 1}, "ucp_ep_flush_nbx", timeout_ms, cancel);
}

// ---------------------------------------------------------------- RemoteRegion

RemoteRegion::~RemoteRegion() { ucp_rkey_destroy(rkey_); }

Status RemoteRegion::CheckRange(uint64_t offset, size_t bytes) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return OutOfRange("remote range [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                      ") outside the peer's region of " + std::to_string(bytes_) + " bytes");
  }
  if (!ep_.healthy() || ep_.ep_ == nullptr) return Unavailable("UCX endpoint failed");
  return Status::Ok();
}

Status RemoteRegion::Put(uint64_t offset, const void* local, size_t bytes, int timeout_ms,
                         const std::atomic<bool>* cancel) {
  const Segment s{offset, local, bytes};
  return PutAll({&s, 1}, timeout_ms, cancel);
}

Status RemoteRegion::PutAll(std::span<const Segment> segments, int timeout_ms,
                            const std::atomic<bool>* cancel) {
  for (const Segment& s : segments) PW_RETURN_IF_ERROR(CheckRange(s.offset, s.bytes));
  std::vector<ucs_status_ptr_t> reqs;
  reqs.reserve(segments.size());
  for (const Segment& s : segments) {
    if (s.bytes == 0) continue;
    ucp_request_param_t p{};
    reqs.push_back(ucp_put_nbx(ep_.ep_, s.local, s.bytes, base_ + s.offset, rkey_, &p));
    if (UCS_PTR_IS_ERR(reqs.back())) break;  // Wait reports it
  }
  return ep_.Wait(reqs, "ucp_put_nbx", timeout_ms, cancel);
}

Status RemoteRegion::Get(uint64_t offset, void* local, size_t bytes, int timeout_ms,
                         const std::atomic<bool>* cancel) {
  PW_RETURN_IF_ERROR(CheckRange(offset, bytes));
  if (bytes == 0) return Status::Ok();
  ucp_request_param_t p{};
  const ucs_status_ptr_t r = ucp_get_nbx(ep_.ep_, local, bytes, base_ + offset, rkey_, &p);
  return ep_.Wait({&r, 1}, "ucp_get_nbx", timeout_ms, cancel);
}

Status RemoteRegion::GetAll(std::span<const GetSegment> segments, int timeout_ms,
                            const std::atomic<bool>* cancel) {
  for (const GetSegment& s : segments) PW_RETURN_IF_ERROR(CheckRange(s.offset, s.bytes));
  std::vector<ucs_status_ptr_t> reqs;
  reqs.reserve(segments.size());
  for (const GetSegment& s : segments) {
    if (s.bytes == 0) continue;
    ucp_request_param_t p{};
    reqs.push_back(ucp_get_nbx(ep_.ep_, s.local, s.bytes, base_ + s.offset, rkey_, &p));
    if (UCS_PTR_IS_ERR(reqs.back())) break;  // Wait reports it
  }
  return ep_.Wait(reqs, "ucp_get_nbx", timeout_ms, cancel);
}

}  // namespace pw::transport::ucx
