#include "bench/bandwidth_probe.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>

namespace pw::bench {
namespace {

using ReadFn = uint64_t (*)(const uint8_t*, size_t);

// Lines read from each stream per step: one line per stream from 4 streams up, so a step
// always issues at least 4 independent line loads.
constexpr int LinesPerStream(int streams) { return streams >= 4 ? 1 : 4 / streams; }

// The layout every variant follows: `n` is cut into S parts of `part` bytes (a multiple of the
// step), read in lockstep; what is left after S * part is read line by line, then byte by byte.
template <int S>
constexpr size_t PartBytes(size_t n) {
  constexpr size_t step = size_t{64} * LinesPerStream(S);
  return n / (S * step) * step;
}

uint64_t TailBytes(const uint8_t* p, size_t from, size_t n) {
  uint64_t out = 0;
  for (size_t i = from; i < n; ++i) out += p[i];
  return out;
}

template <int S>
__attribute__((target("avx512f"))) uint64_t ReadAvx512(const uint8_t* p, size_t n) {
  constexpr int K = LinesPerStream(S);
  const size_t part = PartBytes<S>(n);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t off = 0; off < part; off += size_t{64} * K) {
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
#pragma GCC unroll 4
      for (int k = 0; k < K; ++k) {
        const __m512i v = _mm512_loadu_si512(p + s * part + off + 64 * k);
        switch ((s * K + k) & 3) {
          case 0: a0 = _mm512_add_epi64(a0, v); break;
          case 1: a1 = _mm512_add_epi64(a1, v); break;
          case 2: a2 = _mm512_add_epi64(a2, v); break;
          default: a3 = _mm512_add_epi64(a3, v); break;
        }
      }
    }
  }
  size_t i = S * part;
  for (; i + 64 <= n; i += 64) a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t out = 0;
  for (uint64_t v : lanes) out += v;
  return out + TailBytes(p, i, n);
}

template <int S>
__attribute__((target("avx2"))) uint64_t ReadAvx2(const uint8_t* p, size_t n) {
  constexpr int K = LinesPerStream(S);
  const size_t part = PartBytes<S>(n);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t off = 0; off < part; off += size_t{64} * K) {
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
#pragma GCC unroll 4
      for (int k = 0; k < K; ++k) {
        const uint8_t* q = p + s * part + off + 64 * k;
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
        if (((s * K + k) & 1) == 0) {
          a0 = _mm256_add_epi64(a0, lo);
          a1 = _mm256_add_epi64(a1, hi);
        } else {
          a2 = _mm256_add_epi64(a2, lo);
          a3 = _mm256_add_epi64(a3, hi);
        }
      }
    }
  }
  size_t i = S * part;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  uint64_t out = 0;
  for (uint64_t v : lanes) out += v;
  return out + TailBytes(p, i, n);
}

template <int S>
uint64_t ReadScalar(const uint8_t* p, size_t n) {
  constexpr int K = LinesPerStream(S);
  const size_t part = PartBytes<S>(n);
  uint64_t acc[8] = {};
  for (size_t off = 0; off < part; off += size_t{64} * K) {
    for (int s = 0; s < S; ++s) {
      for (int k = 0; k < K; ++k) {
        uint64_t w[8];
        std::memcpy(w, p + s * part + off + 64 * k, 64);
        for (int j = 0; j < 8; ++j) acc[j] += w[j];
      }
    }
  }
  size_t i = S * part;
  for (; i + 64 <= n; i += 64) {
    uint64_t w[8];
    std::memcpy(w, p + i, 64);
    for (int j = 0; j < 8; ++j) acc[j] += w[j];
  }
  uint64_t out = 0;
  for (uint64_t v : acc) out += v;
  return out + TailBytes(p, i, n);
}

struct ReadKernels {
  const char* isa;
  ReadFn fn[5];  // kProbeStreams order
};

const ReadKernels& Kernels() {
  static const ReadKernels k = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
      return ReadKernels{"avx512", {ReadAvx512<1>, ReadAvx512<2>, ReadAvx512<4>, ReadAvx512<8>,
                                    ReadAvx512<16>}};
    }
    if (__builtin_cpu_supports("avx2")) {
      return ReadKernels{"avx2", {ReadAvx2<1>, ReadAvx2<2>, ReadAvx2<4>, ReadAvx2<8>, ReadAvx2<16>}};
    }
    return ReadKernels{"scalar", {ReadScalar<1>, ReadScalar<2>, ReadScalar<4>, ReadScalar<8>,
                                  ReadScalar<16>}};
  }();
  return k;
}

int StreamIndex(int streams) {
  for (size_t i = 0; i < std::size(kProbeStreams); ++i) {
    if (kProbeStreams[i] == streams) return static_cast<int>(i);
  }
  return -1;
}

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "bandwidth probe: %s\n", msg.c_str());
  std::exit(2);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Buffer {
  explicit Buffer(size_t n) : bytes(n) {
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t rounded = (n + kHuge - 1) / kHuge * kHuge;
    p = static_cast<uint8_t*>(std::aligned_alloc(kHuge, rounded));
    if (p == nullptr) Die("cannot allocate " + std::to_string(n) + " bytes");
    madvise(p, rounded, MADV_HUGEPAGE);
    auto* w = reinterpret_cast<uint64_t*>(p);
    for (size_t i = 0; i < rounded / 8; ++i) w[i] = i * 0x9e3779b97f4a7c15ull;  // every page
  }
  ~Buffer() { std::free(p); }
  uint8_t* p = nullptr;
  size_t bytes;
};

// One pass: `threads` threads each read their 64-byte aligned share of the buffer's first
// `bytes` (all of it by default) with `streams` streams. Returns wall seconds; *cpu_seconds =
// the sum of the threads' CPU seconds.
double Pass(const Buffer& buf, int threads, int streams, std::atomic<uint64_t>* sink,
            double* cpu_seconds, size_t bytes = 0) {
  const size_t n = bytes == 0 || bytes > buf.bytes ? buf.bytes : bytes / 64 * 64;
  const size_t lines = n / 64;
  std::vector<double> cpu(static_cast<size_t>(threads));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      const double c0 = ThreadCpuSeconds();
      const size_t b = lines * t / threads * 64;
      const size_t e = t + 1 == threads ? n : lines * (t + 1) / threads * 64;
      *sink += ReadStreams(buf.p + b, e - b, streams);
      cpu[static_cast<size_t>(t)] = ThreadCpuSeconds() - c0;
    });
  }
  for (auto& th : ts) th.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *cpu_seconds = 0;
  for (double c : cpu) *cpu_seconds += c;
  return wall;
}

}  // namespace

bool IsProbeStreamCount(int streams) { return StreamIndex(streams) >= 0; }

const char* ReadIsaName() { return Kernels().isa; }

uint64_t ReadStreams(const void* p, size_t n, int streams) {
  const int i = StreamIndex(streams);
  return Kernels().fn[i < 0 ? 0 : i](static_cast<const uint8_t*>(p), n);
}

std::vector<ThreadsRate> ProbeReadBandwidth(const ProbeOptions& o, const std::vector<int>& threads) {
  if (o.streams.empty() || threads.empty()) Die("no stream or thread counts to probe");
  for (int s : o.streams) {
    if (!IsProbeStreamCount(s)) Die("stream count " + std::to_string(s) + " is not 1, 2, 4, 8 or 16");
  }
  for (int t : threads) {
    if (t < 1) Die("thread count " + std::to_string(t) + " is below 1");
  }
  if (o.passes < 1 || o.bytes < size_t{64} << 20) Die("need at least 1 pass over at least 64 MiB");
  const Buffer buf(o.bytes / 64 * 64);
  std::atomic<uint64_t> sink{0};
  std::vector<ThreadsRate> out;
  for (int t : threads) {
    ThreadsRate r;
    r.threads = t;
    double cpu = 0;
    Pass(buf, t, o.streams.front(), &sink, &cpu);  // warm-up: page tables, huge pages, frequency
    for (int s : o.streams) {
      std::vector<double> wall_rate, cpu_rate;
      for (int i = 0; i < o.passes; ++i) {
        const double wall = Pass(buf, t, s, &sink, &cpu);
        wall_rate.push_back(static_cast<double>(buf.bytes) / wall);
        cpu_rate.push_back(static_cast<double>(buf.bytes) / (cpu / t));
      }
      StreamRate sr{s, Median(wall_rate), Median(cpu_rate)};
      if (sr.wall > r.wall) {
        r.wall = sr.wall;
        r.best_streams = s;
      }
      if (sr.cpu > r.cpu) {
        r.cpu = sr.cpu;
        r.best_cpu_streams = s;
      }
      r.by_streams.push_back(sr);
    }
    out.push_back(std::move(r));
  }
  if (sink.load() == 42) std::fprintf(stderr, " ");  // keep the sums alive
  return out;
}

struct ReadTimer::Impl {
  Impl(size_t bytes, int threads, int streams)
      : buf(bytes / 64 * 64), threads(threads), streams(streams) {}
  Buffer buf;
  int threads;
  int streams;
  std::atomic<uint64_t> sink{0};
};

ReadTimer::ReadTimer(size_t bytes, int threads, int streams) {
  if (threads < 1 || !IsProbeStreamCount(streams) || bytes < 64) {
    Die("a read timer needs 1 or more threads, a stream count of 1, 2, 4, 8 or 16 and 64 bytes");
  }
  impl_ = std::make_unique<Impl>(bytes, threads, streams);
}

ReadTimer::~ReadTimer() {
  if (impl_->sink.load() == 42) std::fprintf(stderr, " ");  // keep the sums alive
}

double ReadTimer::ReadSeconds(size_t bytes) {
  double cpu = 0;
  return Pass(impl_->buf, impl_->threads, impl_->streams, &impl_->sink, &cpu,
              bytes < 64 ? 64 : bytes);
}

std::string DescribeRate(const ThreadsRate& r) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%d thread%s:", r.threads, r.threads == 1 ? "" : "s");
  std::string s = buf;
  for (size_t i = 0; i < r.by_streams.size(); ++i) {
    const StreamRate& sr = r.by_streams[i];
    std::snprintf(buf, sizeof buf, "%s %d stream%s %.1f", i ? "," : "", sr.streams,
                  sr.streams == 1 ? "" : "s", sr.wall / 1e9);
    s += buf;
  }
  std::snprintf(buf, sizeof buf,
                " GB/s wall; best %d stream%s: %.1f GB/s wall (%.1f GB/s per CPU second, best at "
                "%d stream%s)",
                r.best_streams, r.best_streams == 1 ? "" : "s", r.wall / 1e9, r.cpu / 1e9,
                r.best_cpu_streams, r.best_cpu_streams == 1 ? "" : "s");
  return s + buf;
}

bool ParseStreamList(const std::string& s, std::vector<int>* out) {
  out->clear();
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || !IsProbeStreamCount(static_cast<int>(v))) return false;
    out->push_back(static_cast<int>(v));
    pos = comma + 1;
  }
  return !out->empty();
}

}  // namespace pw::bench
