// pw-bench-ucx-get: latency of a small scattered UCX get (a synchronous expert fetch's shape:
// one block's planes and LUT in several segments) between two workers of one process, each
// with its progress thread, as a function of how long the owner of the memory was idle before
// the get. The owner's progress thread spins for a while after activity and then sleeps until
// an event (services/transport/ucx.h), so a get after a pause pays its wake-up.
//
//   pw-bench-ucx-get [--bytes N] [--segments S] [--samples K] [--gaps-us 0,300,2000]
//                    [--backoff-spins N --backoff-sleep-us U]   (the client's wait backoff)
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <thread>
#include <vector>

#include "services/transport/ucx.h"

int main(int argc, char** argv) {
  CLI::App app{"UCX get latency after an idle gap"};
  size_t bytes = 61440;
  int segments = 8, samples = 200;
  std::vector<int> gaps{0, 100, 300, 1000, 2000, 5000};
  uint32_t spins = 0, sleep_us = 0;
  app.add_option("--bytes", bytes, "bytes per get (all segments)")->check(CLI::Range(size_t{1}, size_t{64} << 20));
  app.add_option("--segments", segments, "segments posted at once")->check(CLI::Range(1, 4096));
  app.add_option("--samples", samples, "gets per gap")->check(CLI::Range(1, 1000000));
  app.add_option("--gaps-us", gaps, "idle time before each get, µs")->delimiter(',');
  app.add_option("--backoff-spins", spins, "client endpoint: polls before sleeping");
  app.add_option("--backoff-sleep-us", sleep_us, "client endpoint: sleep between polls after that (0: spin)");
  CLI11_PARSE(app, argc, argv);
  using namespace pw::transport::ucx;
  auto ctx = Context::Create();
  if (!ctx.ok()) return std::fprintf(stderr, "%s\n", ctx.status().ToString().c_str()), 1;
  auto owner = Worker::Create(**ctx).value();
  auto client = Worker::Create(**ctx).value();
  owner->StartProgressThread();
  client->StartProgressThread();
  std::vector<uint8_t> mem(bytes * 2, 7), dst(bytes);
  auto region = MemoryRegion::Register(**ctx, mem.data(), mem.size()).value();
  auto ep = Endpoint::Connect(*client, owner->Address(), Endpoint::ErrorMode::kNone).value();
  ep->SetWaitBackoff(spins, sleep_us);
  auto rr = ep->OpenRegion(region->PackedRkey(), region->base(), mem.size()).value();
  std::vector<RemoteRegion::GetSegment> segs;
  const size_t seg = (bytes + static_cast<size_t>(segments) - 1) / static_cast<size_t>(segments);
  for (size_t off = 0; off < bytes; off += seg) {
    const size_t n = std::min(seg, bytes - off);
    segs.push_back({off * 2 % (mem.size() - n), dst.data() + off, n});
  }
  std::printf("%zu bytes in %zu gets, %d samples per gap, client backoff %u spins / %u us\n", bytes, segs.size(),
              samples, spins, sleep_us);
  std::printf("| idle before the get, us | mean us | median us | p90 us |\n|---:|---:|---:|---:|\n");
  for (int gap : gaps) {
    std::vector<double> t;
    for (int i = 0; i < samples; ++i) {
      if (gap > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap));
      const auto t0 = std::chrono::steady_clock::now();
      auto st = rr->GetAll(segs, 10000);
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      if (!st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
    }
    std::sort(t.begin(), t.end());
    const double mean = std::accumulate(t.begin(), t.end(), 0.0) / static_cast<double>(t.size());
    std::printf("| %d | %.1f | %.1f | %.1f |\n", gap, mean, t[t.size() / 2], t[t.size() * 9 / 10]);
  }
  return 0;
}
