// The memory-read bandwidth probe shared by pw-bench-engine (the floor of a decode step) and
// pw-bench-kernels (the `memread` cases): how fast the best read loop this CPU can run streams
// a buffer far larger than the last-level cache.
//
// One sequential stream per thread does not reach what the memory system delivers: the
// hardware prefetchers track several streams per core, and a core keeps more lines in flight
// when it walks several distant regions at once. So the probe reads with S interleaved streams
// per thread (S in kProbeStreams): a thread's range is cut into S contiguous parts and the loop
// reads one 64-byte line (or, for S < 4, 4/S consecutive lines) from each part in turn, with
// 64-byte loads: one AVX-512 load where the CPU has AVX-512F, else two AVX2 loads, else eight
// 64-bit loads (chosen at run time). The best S is reported with its rate; the floors use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pw::bench {

// Stream counts the read loop is built for.
inline constexpr int kProbeStreams[] = {1, 2, 4, 8, 16};
bool IsProbeStreamCount(int streams);

// The instruction set the read loop uses on this CPU: "avx512", "avx2" or "scalar".
const char* ReadIsaName();

// Reads every byte of [p, p + n) with `streams` interleaved streams (a kProbeStreams entry;
// others read as 1 stream) and returns a sum of what it read (to keep the loads alive). p
// need not be aligned; pieces that start on 64-byte boundaries read whole lines.
uint64_t ReadStreams(const void* p, size_t n, int streams);

struct ProbeOptions {
  size_t bytes = size_t{3} << 29;  // 1.5 GiB: the buffer, read whole in every pass
  std::vector<int> streams = {1, 2, 4, 8, 16};
  int passes = 5;                  // timed passes per stream count (median); one warm-up first
};

struct StreamRate {
  int streams = 0;
  double wall = 0;  // bytes / wall second of the pass (median over passes)
  double cpu = 0;   // bytes / (sum of the threads' CPU seconds / threads): while on a core
};

struct ThreadsRate {
  int threads = 0;
  std::vector<StreamRate> by_streams;  // in ProbeOptions::streams order
  int best_streams = 0;                // the stream count with the highest wall rate
  double wall = 0;                     // that highest wall rate
  int best_cpu_streams = 0;            // the stream count with the highest CPU-time rate
  double cpu = 0;                      // that highest CPU-time rate
};

// Allocates the buffer (64-byte aligned, huge pages advised, every page written), then for each
// entry of `threads` (each thread reads its contiguous share of the whole buffer per pass) and
// each stream count runs the passes. Errors (empty lists, a stream count not in kProbeStreams,
// a buffer that cannot be allocated) end the process with a message: this is a benchmark.
std::vector<ThreadsRate> ProbeReadBandwidth(const ProbeOptions& options,
                                            const std::vector<int>& threads);

// Times reads of the first bytes of a buffer of its own, one at a time, for a floor measured
// beside the work it bounds (pw-bench-engine --floor-pairs: a decode step, then a read of the
// step's bytes, alternated, so a host whose memory rate moves from one second to the next moves
// both halves of each pair alike). The buffer is allocated, advised for huge pages and written
// once; each read runs `threads` threads of `streams` interleaved streams, as a probe pass does.
class ReadTimer {
 public:
  ReadTimer(size_t bytes, int threads, int streams);  // ends the process if it cannot allocate
  ~ReadTimer();
  ReadTimer(const ReadTimer&) = delete;
  ReadTimer& operator=(const ReadTimer&) = delete;

  // Wall seconds to read the buffer's first `bytes` (at most its size, rounded down to 64).
  double ReadSeconds(size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "2 threads: 1 stream 18.4, 2 streams 25.0, ... GB/s wall; best 16 streams: 33.1 GB/s wall
// (34.0 GB/s per CPU second, best at 16)" — one line, no newline.
std::string DescribeRate(const ThreadsRate& rate);

// Parses "1,2,4" (entries must be kProbeStreams values); false on anything else.
bool ParseStreamList(const std::string& s, std::vector<int>* out);

}  // namespace pw::bench
