// pw-bench-checksum: the expert-part checksums in GB/s on this CPU — FNV-1a 64 (the fetch
// path's checksum before control protocol 1.1), CRC-32 (the .apw store's sections), CRC-32C
// scalar and CRC-32C hardware (the fetch path's checksum now; Crc32c picks it at run time) —
// over a buffer the size of one expert (default 3.1 MiB, the OLMoE-dimension model's expert at
// 4 bits: in cache after the fetch wrote it) and over one far larger than the last-level cache,
// next to a plain read of the same buffers (memory speed on this machine, one thread).
//
//   pw-bench-checksum [--bytes N] [--big-bytes N] [--reps K]
// Each figure is the median of K timed passes after one warm-up pass.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "common/hash.h"

namespace {

double MedianGbps(const std::vector<uint8_t>& buf, int reps,
                  const std::function<uint64_t(const uint8_t*, size_t)>& fn, uint64_t* sink) {
  std::vector<double> rates;
  *sink += fn(buf.data(), buf.size());  // warm-up
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    *sink += fn(buf.data(), buf.size());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(static_cast<double>(buf.size()) / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"checksum throughput"};
  size_t bytes = 3250585, big = size_t{1} << 30;
  int reps = 21;
  app.add_option("--bytes", bytes, "the expert-sized buffer, bytes")
      ->check(CLI::Range(size_t{1}, size_t{1} << 34));
  app.add_option("--big-bytes", big, "the buffer larger than the cache, bytes (0: skip)");
  app.add_option("--reps", reps, "timed passes per figure (median)")->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  struct Fn {
    const char* name;
    std::function<uint64_t(const uint8_t*, size_t)> fn;
  };
  std::vector<Fn> fns = {
      // The reference: a plain read of every 8-byte word (four sums), what memory speed is here.
      {"read (64-bit sum)",
       [](const uint8_t* p, size_t n) {
         uint64_t s[4] = {0, 0, 0, 0};
         size_t i = 0;
         for (; i + 32 <= n; i += 32) {
           for (int k = 0; k < 4; ++k) {
             uint64_t v;
             std::memcpy(&v, p + i + 8 * k, 8);
             s[k] += v;
           }
         }
         for (; i < n; ++i) s[0] += p[i];
         return s[0] + s[1] + s[2] + s[3];
       }},
      {"fnv1a64", [](const uint8_t* p, size_t n) { return pw::Fnv1a64Of(p, n); }},
      {"crc32 (slicing-by-8)",
       [](const uint8_t* p, size_t n) { return uint64_t{pw::Crc32Scalar(p, n)}; }},
      {"crc32c scalar (slicing-by-8)",
       [](const uint8_t* p, size_t n) { return uint64_t{pw::Crc32cScalar(p, n)}; }},
  };
  if (pw::Crc32ClmulAvailable()) {
    fns.push_back({"crc32 pclmul (4 folds)",
                   [](const uint8_t* p, size_t n) { return uint64_t{pw::Crc32Clmul(p, n)}; }});
  } else {
    std::printf("no PCLMULQDQ: crc32 pclmul not measured\n");
  }
  if (pw::Crc32cHardwareAvailable()) {
    fns.push_back({"crc32c sse4.2 (3 lanes)",
                   [](const uint8_t* p, size_t n) { return uint64_t{pw::Crc32cHardware(p, n)}; }});
  } else {
    std::printf("no SSE4.2: crc32c hardware not measured\n");
  }
  uint64_t sink = 0;
  std::printf("%-30s %14s %14s\n", "checksum", "expert GB/s", big ? "large GB/s" : "");
  std::vector<uint8_t> small(bytes), large(big);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  for (const Fn& f : fns) {
    const double a = MedianGbps(small, reps, f.fn, &sink);
    const double b = big ? MedianGbps(large, std::max(1, reps / 4), f.fn, &sink) : 0;
    std::printf("%-30s %14.2f %14.2f\n", f.name, a, b);
    std::printf("  one %zu-byte expert: %.3f ms\n", bytes,
                static_cast<double>(bytes) / (a * 1e9) * 1e3);
  }
  std::printf("(sink %llu)\n", static_cast<unsigned long long>(sink & 1));
  return 0;
}
