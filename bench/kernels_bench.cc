// pw-bench-kernels: any-precision GEMV/GEMM vs a dense bf16 GEMV and a plain memory read, at
// real expert shapes, reporting bytes_per_second.
//
// Names (one filter selects one case):
//   apgemv/<rows>x<cols>/b<bits>/t<tokens>  ApGemm at width bits (best backend); bytes per call =
//                                           bits planes + LUT_bits (what the kernel must read)
//   apq8gemv/<rows>x<cols>/b<bits>/t<tokens> the integer fast path (q8.h, best backend with one),
//                                           ("/cached": one block read over and over, in cache)
//                                           activation quantization included; bytes per call =
//                                           bits planes + the int8 LUT_bits and its row scales
//   q8dense/<rows>x<cols>/t<tokens>[/r63]   the int8 dense product (q8.h's DenseQ8Rows, the
//                                           engine's --dense int8 attention and lm_head), values
//                                           within 127 (/r63: within 63, the range AVX2 pairs),
//                                           activation quantization included; bytes = the int8
//                                           rows (Q8ActStride(cols) each) and their row scales
//   bf16gemv/<rows>x<cols>/t<tokens>        the engine's dense bf16 matmul; bytes = 2*rows*cols
//                                           (expert shapes, and 2048x2048 / 50304x2048: an
//                                           OLMoE-dimension attention projection and lm_head)
//   memread/<bytes>                         streaming read of <bytes> bytes per iteration, the
//                                           way the best read loop can (bench/bandwidth_probe.h:
//                                           the probe's best stream count, 64-byte loads; the
//                                           probe's table goes to stderr before the first case)
//   quantize/<rows>x<cols>/threads<n>       QuantizeBlock on random weights (one iteration)
// apgemv, bf16gemv and memread also exist with a "/threads<n>" suffix (n = the machine's cores):
// one call's rows (or bytes) split over a pool of n threads, as the engine splits an expert's
// rows (ApGemmRows per thread), timed in wall-clock seconds.
// Every case cycles through distinct blocks whose total exceeds 1 GiB (the last-level cache is
// smaller), so the figures measure memory, not cache. Single-thread rates are per CPU second of
// the benchmark thread (Google Benchmark's default), which keeps ratios between cases meaningful
// on a shared machine; threaded and quantize cases report wall time. Shapes: OLMoE expert
// (2048->1024, 1024->2048) and Mixtral expert (4096->14336, 14336->4096); rows = out features.
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench/bandwidth_probe.h"
#include "common/dtype.h"
#include "kernels/anyprec/anyprec.h"
#include "kernels/anyprec/pack.h"
#include "kernels/anyprec/q8.h"
#include "kernels/anyprec/quantizer.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/packed_bf16.h"
#include "kernels/cpu/thread_pool.h"

namespace pw::anyprec {
namespace {

constexpr size_t kPoolBytes = size_t{1152} << 20;    // weight bytes (planes or bf16)
constexpr size_t kWorkingSet = size_t{1088} << 20;   // > 1 GiB per case
constexpr size_t kLutPoolEntries = size_t{160} << 20;  // fp16 entries (320 MiB)

uint64_t Mix(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

// Pool of bytes usable both as bit-planes and as bf16 weights: every odd byte (the high byte of
// a little-endian bf16) is 0x3C..0x3F, so every bf16 is finite, normal and below 1 in magnitude.
const uint8_t* WeightPool() {
  static uint8_t* pool = [] {
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(size_t{2} << 20, kPoolBytes));
    madvise(p, kPoolBytes, MADV_HUGEPAGE);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    auto* w = reinterpret_cast<uint64_t*>(p);
    for (size_t i = 0; i < kPoolBytes / 8; ++i) {
      w[i] = (Mix(s) & 0x03ff03ff03ff03ffull) | 0x3c003c003c003c00ull;
    }
    return p;
  }();
  return pool;
}

// Finite fp16 centroids in [-1, 1).
const uint16_t* LutPool() {
  static uint16_t* pool = [] {
    auto* p = static_cast<uint16_t*>(std::aligned_alloc(64, kLutPoolEntries * 2));
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < kLutPoolEntries; ++i) {
      p[i] = F32ToF16(static_cast<float>(static_cast<int64_t>(Mix(s) % 2000001) - 1000000) * 1e-6f);
    }
    return p;
  }();
  return pool;
}

// int8 centroids in [-127, 127] and their row scales, for the fast-path cases.
const int8_t* Q8LutPool() {
  static int8_t* pool = [] {
    auto* p = static_cast<int8_t*>(std::aligned_alloc(64, kLutPoolEntries));
    uint64_t s = 0x5DEECE66Dull;
    for (size_t i = 0; i < kLutPoolEntries; ++i) p[i] = static_cast<int8_t>(static_cast<int>(Mix(s) % 255) - 127);
    return p;
  }();
  return pool;
}

struct Aligned {
  explicit Aligned(size_t bytes) : p(std::aligned_alloc(64, (bytes + 63) / 64 * 64)) {}
  ~Aligned() { std::free(p); }
  void* p;
};

std::vector<float> RandomFloats(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (auto& f : v) f = static_cast<float>(static_cast<int64_t>(Mix(seed) % 2001) - 1000) * 1e-3f;
  return v;
}

// The pool of a threaded case (null for one thread). Cases run one at a time, so one pool per
// size serves them all.
cpu::ThreadPool* Pool(int threads) {
  if (threads <= 1) return nullptr;
  static std::vector<std::unique_ptr<cpu::ThreadPool>> pools(64);
  auto& p = pools[static_cast<size_t>(std::min(threads, 63))];
  if (!p) p = std::make_unique<cpu::ThreadPool>(threads);
  return p.get();
}

// Runs piece(i, begin, end) for n_pieces contiguous ranges of [0, n): on the pool when there is
// one, inline otherwise.
template <typename F>
void SplitRange(cpu::ThreadPool* pool, size_t n, int n_pieces, F&& piece) {
  auto run = [&](size_t i) { piece(static_cast<int>(i), n * i / n_pieces, n * (i + 1) / n_pieces); };
  if (pool == nullptr || n_pieces <= 1) {
    for (int i = 0; i < n_pieces; ++i) run(static_cast<size_t>(i));
    return;
  }
  pool->ParallelFor(static_cast<size_t>(n_pieces), 1, 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) run(i);
  });
}

size_t ApBytesPerCall(int rows, int cols, int bits) {
  return bits * PlaneBytes(rows, cols) + (static_cast<size_t>(rows) << bits) * 2;
}

// Distinct blocks of `bits` planes from the weight pool, enough to cycle through more than the
// working set of `per_call` bytes each, in pages of about 64 KiB (tile_rows rows of one plane),
// as a paged pool would hand them over. LUT_bits points into the fp16 LUT pool.
std::vector<std::unique_ptr<PageLists>> PagedBlocks(int rows, int cols, int bits, size_t per_call) {
  const size_t plane_bytes = PlaneBytes(rows, cols);
  const size_t lut_entries = static_cast<size_t>(rows) << bits;
  const int n_blocks = static_cast<int>(std::min((kWorkingSet + per_call - 1) / per_call,
                                                  kPoolBytes / (bits * plane_bytes)));
  const int tile_rows = std::max<int>(1, static_cast<int>((size_t{64} << 10) / PlaneRowBytes(cols)));
  const uint8_t* pool = WeightPool();
  const uint16_t* luts = LutPool();
  std::vector<std::unique_ptr<PageLists>> blocks;
  for (int i = 0; i < n_blocks; ++i) {
    const uint8_t* bases[kNumPlanes] = {};
    for (int p = 0; p < bits; ++p) bases[p] = pool + (static_cast<size_t>(i) * bits + p) * plane_bytes;
    const uint16_t* lut_ptrs[kMaxBits + 1] = {};
    lut_ptrs[bits] = luts + (static_cast<size_t>(i) * lut_entries) % (kLutPoolEntries - lut_entries);
    blocks.push_back(std::make_unique<PageLists>(bases, lut_ptrs, rows, cols, tile_rows));
  }
  return blocks;
}

void BM_ApGemv(benchmark::State& state, int rows, int cols, int bits, int tokens, int threads) {
  const size_t per_call = ApBytesPerCall(rows, cols, bits);
  const auto blocks = PagedBlocks(rows, cols, bits, per_call);
  const int n_blocks = static_cast<int>(blocks.size());
  const auto x = RandomFloats(static_cast<size_t>(tokens) * cols, 42);
  std::vector<float> y(static_cast<size_t>(tokens) * rows);
  const size_t ws_bytes = ApGemmWorkspaceBytes(cols, tokens);
  std::vector<std::unique_ptr<Aligned>> ws;
  for (int t = 0; t < threads; ++t) ws.push_back(std::make_unique<Aligned>(ws_bytes));
  std::vector<Status> status(static_cast<size_t>(threads));
  cpu::ThreadPool* threads_pool = Pool(threads);
  const kernels::Backend backend = BestBackend();
  int i = 0;
  for (auto _ : state) {
    SplitRange(threads_pool, static_cast<size_t>(rows), threads, [&](int t, size_t r0, size_t r1) {
      status[t] = ApGemmRows(backend, blocks[i]->view(), bits, x.data(), tokens, y.data(),
                             static_cast<int>(r0), static_cast<int>(r1), {ws[t]->p, ws_bytes});
    });
    if (const auto bad = std::find_if(status.begin(), status.end(), [](const Status& s) { return !s.ok(); });
        bad != status.end()) {
      state.SkipWithError(bad->ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(y.data());
    if (++i == n_blocks) i = 0;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * per_call));
  state.counters["blocks"] = n_blocks;
  state.counters["weights_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * rows * cols * tokens, benchmark::Counter::kIsRate);
  state.SetLabel(BackendName(backend));
}

size_t Q8BytesPerCall(int rows, int cols, int bits) {
  return bits * PlaneBytes(rows, cols) + Q8LutValueBytes(rows, bits) + sizeof(float) * rows;
}

// Bytes of a dense int8 matrix: its rows in the activation layout and their row scales.
size_t Q8DenseBytesPerCall(int rows, int cols) {
  return Q8MatrixValueBytes(rows, cols) + sizeof(float) * rows;
}

// The timed loop of an integer fast-path case: the activations x [tokens][cols] quantized in
// every iteration (as the engine does per call), then rows_fn(acts, r0, r1) -> Status on each
// thread's share of `rows`; next() after each iteration moves to the case's next block.
template <typename RowsFn, typename Next>
void TimeQ8Calls(benchmark::State& state, int rows, int cols, int tokens, int threads,
                 const std::vector<float>& x, const float* y, RowsFn&& rows_fn, Next&& next) {
  Aligned acts_buf(Q8ActsBytes(tokens, cols));
  std::vector<Status> status(static_cast<size_t>(threads));
  cpu::ThreadPool* threads_pool = Pool(threads);
  for (auto _ : state) {
    Q8Acts acts;
    Status qs = QuantizeActs(x.data(), cols, tokens, cols, {acts_buf.p, Q8ActsBytes(tokens, cols)}, &acts);
    if (!qs.ok()) {
      state.SkipWithError(qs.ToString().c_str());
      break;
    }
    SplitRange(threads_pool, static_cast<size_t>(rows), threads, [&](int t, size_t r0, size_t r1) {
      status[t] = rows_fn(acts, static_cast<int>(r0), static_cast<int>(r1));
    });
    if (const auto bad = std::find_if(status.begin(), status.end(), [](const Status& s) { return !s.ok(); });
        bad != status.end()) {
      state.SkipWithError(bad->ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(y);
    next();
  }
}

// `cached`: every call reads the same block (it stays in the caches), so the case measures the
// kernel's own rate, not memory's.
void BM_ApQ8Gemv(benchmark::State& state, int rows, int cols, int bits, int tokens, int threads,
                 bool cached) {
  const size_t lut_bytes = Q8LutValueBytes(rows, bits);
  const size_t per_call = Q8BytesPerCall(rows, cols, bits);
  // The exact LUT pointers are not read by this path (ValidateView wants one).
  const auto blocks = PagedBlocks(rows, cols, bits, per_call);
  const int n_blocks = static_cast<int>(blocks.size());
  const int8_t* q8_luts = Q8LutPool();
  std::vector<Q8Lut> luts;
  std::vector<std::vector<float>> scales(static_cast<size_t>(n_blocks), std::vector<float>(rows, 1.f / 4096));
  for (int i = 0; i < n_blocks; ++i) {
    luts.push_back({q8_luts + (static_cast<size_t>(i) * lut_bytes) % (kLutPoolEntries - lut_bytes),
                    scales[i].data()});
  }
  const auto x = RandomFloats(static_cast<size_t>(tokens) * cols, 42);
  std::vector<float> y(static_cast<size_t>(tokens) * rows);
  const kernels::Backend backend = BestQ8Backend();
  int i = 0;
  TimeQ8Calls(
      state, rows, cols, tokens, threads, x, y.data(),
      [&](const Q8Acts& acts, int r0, int r1) {
        return ApGemmQ8Rows(backend, blocks[i]->view(), bits, luts[i], acts, y.data(), rows, r0, r1);
      },
      [&] {
        if (!cached && ++i == n_blocks) i = 0;
      });
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * per_call));
  state.counters["blocks"] = cached ? 1 : n_blocks;
  state.counters["weights_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * rows * cols * tokens, benchmark::Counter::kIsRate);
  state.SetLabel(BackendName(backend));
}

// The weight pool's bytes as int8 values within `range` (127 or kDenseQ8PairMax), made once
// per range.
const int8_t* DenseQ8Pool(int range) {
  static std::mutex mu;
  static std::map<int, int8_t*> pools;
  std::lock_guard<std::mutex> lock(mu);
  int8_t*& p = pools[range];
  if (p == nullptr) {
    p = static_cast<int8_t*>(std::aligned_alloc(size_t{2} << 20, kPoolBytes));
    madvise(p, kPoolBytes, MADV_HUGEPAGE);
    const auto* src = reinterpret_cast<const int8_t*>(WeightPool());
    for (size_t i = 0; i < kPoolBytes; ++i) p[i] = static_cast<int8_t>(std::clamp<int>(src[i], -range, range));
  }
  return p;
}

void BM_Q8Dense(benchmark::State& state, int rows, int cols, int tokens, int threads, int range) {
  const size_t per_call = Q8DenseBytesPerCall(rows, cols);
  const size_t value_bytes = Q8MatrixValueBytes(rows, cols);
  const int n_blocks = static_cast<int>(std::min(kPoolBytes / value_bytes, (kWorkingSet + per_call - 1) / per_call));
  // The pool's bytes within the range as the int8 weights: their values set the products, not
  // the speed.
  const int8_t* pool = DenseQ8Pool(range);
  std::vector<float> scales(static_cast<size_t>(rows), 1.f / 4096);
  const auto x = RandomFloats(static_cast<size_t>(tokens) * cols, 44);
  std::vector<float> y(static_cast<size_t>(tokens) * rows);
  const kernels::Backend backend = BestQ8Backend();
  int i = 0;
  TimeQ8Calls(
      state, rows, cols, tokens, threads, x, y.data(),
      [&](const Q8Acts& acts, int r0, int r1) {
        const Q8Matrix w{rows, cols, pool + static_cast<size_t>(i) * value_bytes, scales.data(), range};
        return DenseQ8Rows(backend, w, acts, y.data(), rows, r0, r1);
      },
      [&] {
        if (++i == n_blocks) i = 0;
      });
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * per_call));
  state.counters["blocks"] = n_blocks;
  state.SetLabel(BackendName(backend));
}

void BM_Bf16Gemv(benchmark::State& state, int rows, int cols, int tokens, int threads) {
  const size_t per_call = size_t{2} * rows * cols;
  const int n_blocks = static_cast<int>(std::min(kPoolBytes / per_call, (kWorkingSet + per_call - 1) / per_call));
  const auto* pool = reinterpret_cast<const uint16_t*>(WeightPool());
  const auto x = RandomFloats(static_cast<size_t>(tokens) * cols, 43);
  std::vector<float> y(static_cast<size_t>(tokens) * rows);
  const kernels::DenseKernels& k = cpu::Kernels();
  cpu::ThreadPool* threads_pool = Pool(threads);
  int i = 0;
  for (auto _ : state) {
    SplitRange(threads_pool, static_cast<size_t>(rows), threads, [&](int, size_t r0, size_t r1) {
      k.matmul_bf16(x.data(), cols, tokens, pool + static_cast<size_t>(i) * rows * cols, cols,
                    static_cast<int>(r0), static_cast<int>(r1), y.data(), rows);
    });
    benchmark::DoNotOptimize(y.data());
    if (++i == n_blocks) i = 0;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * per_call));
  state.counters["blocks"] = n_blocks;
  state.SetLabel(kernels::BackendName(cpu::BestIsa()));
}

// The same product over packed bf16 rows (kernels/cpu/packed_bf16.h): one normal matrix of the
// shape (standard deviation 0.02, a weight's), packed once and copied to a working set past the
// caches, as the bf16 case reads its pool.
void BM_PackedBf16Gemv(benchmark::State& state, int rows, int cols, int tokens, int threads) {
  static std::map<std::pair<int, int>, std::vector<cpu::PackedBf16Matrix>> cache;
  static std::mutex mu;
  std::vector<cpu::PackedBf16Matrix>* blocks;
  {
    std::lock_guard<std::mutex> lock(mu);
    blocks = &cache[{rows, cols}];
    if (blocks->empty()) {
      std::mt19937 rng(45);
      std::normal_distribution<float> d(0.f, 0.02f);
      std::vector<uint16_t> w(static_cast<size_t>(rows) * cols);
      for (auto& v : w) v = cpu::ToBf16Bits(d(rng));
      const cpu::PackedBf16Matrix m = cpu::PackBf16(w.data(), rows, cols);
      const size_t n = std::max<size_t>(1, (kWorkingSet + m.Bytes() - 1) / m.Bytes());
      blocks->assign(n, m);
    }
  }
  const size_t per_call = (*blocks)[0].Bytes();
  const auto x = RandomFloats(static_cast<size_t>(tokens) * cols, 43);
  std::vector<float> y(static_cast<size_t>(tokens) * rows);
  const kernels::DenseKernels& k = cpu::Kernels();
  cpu::ThreadPool* threads_pool = Pool(threads);
  size_t i = 0;
  for (auto _ : state) {
    const cpu::PackedBf16View v = (*blocks)[i].view();
    SplitRange(threads_pool, static_cast<size_t>(rows), threads, [&](int, size_t r0, size_t r1) {
      thread_local std::vector<uint16_t> scratch(size_t{128} << 10);
      cpu::MatmulPackedBf16(k, x.data(), cols, tokens, v, r0, r1, y.data(), rows, scratch.data(),
                            scratch.size());
    });
    benchmark::DoNotOptimize(y.data());
    if (++i == blocks->size()) i = 0;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * per_call));
  state.counters["blocks"] = static_cast<double>(blocks->size());
  state.SetLabel(kernels::BackendName(cpu::BestIsa()));
}

// The stream count the shared bandwidth probe (bench/bandwidth_probe.h) reads fastest with on
// `threads` threads. Probed once, when the first memread case runs (untimed), on 1 thread and
// on the machine's cores; the table goes to stderr.
int BestStreams(int threads) {
  static const std::vector<bench::ThreadsRate> rates = [] {
    std::vector<int> counts = {1};
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    if (cores > 1) counts.push_back(cores);
    bench::ProbeOptions po;
    std::fprintf(stderr, "memread: probing read bandwidth (%.2f GiB buffer, streams 1..16, %s loads)\n",
                 static_cast<double>(po.bytes) / (1 << 30), bench::ReadIsaName());
    auto r = bench::ProbeReadBandwidth(po, counts);
    for (const auto& t : r) std::fprintf(stderr, "memread: %s\n", bench::DescribeRate(t).c_str());
    return r;
  }();
  for (const auto& r : rates) {
    if (r.threads == threads) return r.best_streams;
  }
  return rates.back().best_streams;
}

// Reads `bytes` bytes per iteration from successive 64-byte aligned regions of the pool, the
// way the best read loop does: each thread's piece with the probe's best stream count for that
// many threads, 64-byte loads.
void BM_MemRead(benchmark::State& state, size_t bytes, int threads) {
  const uint8_t* pool = WeightPool();
  const int streams = BestStreams(threads);
  const size_t stride = (bytes + 63) / 64 * 64;
  const size_t n_regions = std::max<size_t>(1, kPoolBytes / stride);
  cpu::ThreadPool* threads_pool = Pool(threads);
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  size_t i = 0;
  for (auto _ : state) {
    // Pieces start on 64-byte boundaries, as the weight rows of the other cases do.
    const size_t lines = (bytes + 63) / 64;
    SplitRange(threads_pool, lines, threads, [&](int t, size_t l0, size_t l1) {
      const size_t b0 = l0 * 64, b1 = std::min(bytes, l1 * 64);
      sums[t] = b1 > b0 ? bench::ReadStreams(pool + i * stride + b0, b1 - b0, streams) : 0;
    });
    benchmark::DoNotOptimize(sums.data());
    if (++i == n_regions) i = 0;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["streams"] = streams;
  state.SetLabel(std::string(bench::ReadIsaName()) + ", " + std::to_string(streams) + " streams");
}

// One whole-block quantization (seed clustering, upscaling to 8 bits, damage table).
void BM_Quantize(benchmark::State& state, int rows, int cols, int threads) {
  std::vector<float> w(static_cast<size_t>(rows) * cols), h(cols);
  uint64_t s = 7;
  for (auto& v : w) {  // sum of uniforms: roughly Gaussian, as trained weights are
    double acc = 0;
    for (int i = 0; i < 4; ++i) acc += static_cast<double>(Mix(s) % 1000001) * 1e-6 - 0.5;
    v = static_cast<float>(acc * 0.02);
  }
  for (auto& v : h) v = static_cast<float>(0.1 + static_cast<double>(Mix(s) % 1000) * 1e-3);
  QuantizeOptions opt;
  opt.threads = threads;
  for (auto _ : state) {
    auto q = QuantizeBlock(w.data(), rows, cols, h.data(), opt);
    if (!q.ok()) {
      state.SkipWithError(q.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(q->damage[3]);
  }
  state.counters["weights_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * rows * cols, benchmark::Counter::kIsRate);
}

struct ShapeSpec {
  int rows, cols;
};

void RegisterAll() {
  const ShapeSpec shapes[] = {{1024, 2048}, {2048, 1024}, {14336, 4096}, {4096, 14336}};
  const int token_counts[] = {1, 4, 16};
  // The fast path also at 8 and 32 tokens (where the AMX backend takes over from AVX-512).
  const int q8_token_counts[] = {1, 4, 8, 12, 16, 32};
  // The dense kernel also at the token counts of batch-2/8/32 decode steps.
  const int bf16_token_counts[] = {1, 2, 4, 5, 7, 8, 16, 32};  // 5, 7: 1 and 3 tokens past a 4-token tile
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // Single-thread cases keep their plain names; threaded ones get "/threads<n>" and wall time.
  auto finish = [](benchmark::internal::Benchmark* b, int threads) {
    b->Unit(benchmark::kMicrosecond);
    if (threads > 1) b->UseRealTime();
  };
  auto suffix = [](int threads) { return threads > 1 ? "/threads" + std::to_string(threads) : std::string(); };
  std::vector<int> thread_counts = {1};
  if (cores > 1) thread_counts.push_back(cores);
  std::set<size_t> read_sizes;
  for (int threads : thread_counts) {
    for (const ShapeSpec& s : shapes) {
      for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
        for (int t : token_counts) {
          const std::string name = "apgemv/" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                                   "/b" + std::to_string(bits) + "/t" + std::to_string(t) + suffix(threads);
          finish(benchmark::RegisterBenchmark(name.c_str(), BM_ApGemv, s.rows, s.cols, bits, t, threads),
                 threads);
        }
        for (int t : q8_token_counts) {
          const std::string q8 = "apq8gemv/" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                                 "/b" + std::to_string(bits) + "/t" + std::to_string(t) + suffix(threads);
          finish(benchmark::RegisterBenchmark(q8.c_str(), BM_ApQ8Gemv, s.rows, s.cols, bits, t, threads,
                                              /*cached=*/false),
                 threads);
        }
        read_sizes.insert(ApBytesPerCall(s.rows, s.cols, bits));
        read_sizes.insert(Q8BytesPerCall(s.rows, s.cols, bits));
      }
      for (int t : bf16_token_counts) {
        const std::string name = "bf16gemv/" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                                 "/t" + std::to_string(t) + suffix(threads);
        finish(benchmark::RegisterBenchmark(name.c_str(), BM_Bf16Gemv, s.rows, s.cols, t, threads), threads);
      }
      read_sizes.insert(size_t{2} * s.rows * s.cols);
    }
    // The dense bf16 matrices of an OLMoE-dimension decode step: attention q/k/v/o
    // (2048x2048) and lm_head (50304x2048, 206 MB).
    for (const ShapeSpec& s : {ShapeSpec{2048, 2048}, ShapeSpec{50304, 2048}}) {
      for (int t : bf16_token_counts) {
        const std::string name = "bf16gemv/" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                                 "/t" + std::to_string(t) + suffix(threads);
        finish(benchmark::RegisterBenchmark(name.c_str(), BM_Bf16Gemv, s.rows, s.cols, t, threads), threads);
        const std::string packed = "bf16packedgemv/" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                                   "/t" + std::to_string(t) + suffix(threads);
        finish(benchmark::RegisterBenchmark(packed.c_str(), BM_PackedBf16Gemv, s.rows, s.cols, t, threads),
               threads);
        for (int range : {127, kDenseQ8PairMax}) {
          const std::string q8 = "q8dense/" + std::to_string(s.rows) + "x" + std::to_string(s.cols) + "/t" +
                                 std::to_string(t) + (range == 127 ? "" : "/r" + std::to_string(range)) +
                                 suffix(threads);
          finish(benchmark::RegisterBenchmark(q8.c_str(), BM_Q8Dense, s.rows, s.cols, t, threads, range), threads);
        }
      }
      read_sizes.insert(size_t{2} * s.rows * s.cols);
      read_sizes.insert(Q8DenseBytesPerCall(s.rows, s.cols));
    }
  }
  // The fast path on one block that stays in the caches (2-3 MB at the OLMoE shapes), one thread,
  // one token: its instruction rate, beside the DRAM cases above.
  for (const ShapeSpec& s : {ShapeSpec{1024, 2048}, ShapeSpec{2048, 1024}}) {
    for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
      const std::string name = "apq8gemv/" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                               "/b" + std::to_string(bits) + "/t1/cached";
      finish(benchmark::RegisterBenchmark(name.c_str(), BM_ApQ8Gemv, s.rows, s.cols, bits, 1, 1,
                                          /*cached=*/true),
             1);
    }
  }
  for (int threads : {1, 2}) {
    for (const ShapeSpec& s : {ShapeSpec{14336, 4096}, ShapeSpec{2048, 1024}}) {
      const std::string name = "quantize/" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                               "/threads" + std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(), BM_Quantize, s.rows, s.cols, threads)
          ->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
    }
  }
  for (int threads : thread_counts) {
    for (size_t bytes : read_sizes) {
      finish(benchmark::RegisterBenchmark(("memread/" + std::to_string(bytes) + suffix(threads)).c_str(),
                                          BM_MemRead, bytes, threads),
             threads);
    }
  }
}

}  // namespace
}  // namespace pw::anyprec

int main(int argc, char** argv) {
  pw::anyprec::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
