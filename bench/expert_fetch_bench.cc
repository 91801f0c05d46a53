// pw-bench-expert-fetch: one synchronous expert fetch as the decode worker makes it on a miss
// (PlaneMover::FetchNow: every part's gets posted at once over UCX, then each part's checksum and
// the LUTs' int8 quantization), in one process between two UCX workers, with each checksum kind
// a manifest can name. The expert has the OLMoE-dimension model's shapes at 4 bits by default
// (hidden 2048, expert FFN 1024: gate_up 2048 x 2048 and down 2048 x 1024, four bit-planes and
// the 4-bit LUT each: 3.1 MiB), so the figures are the get / check phases of
// pagedweight_expert_fetch_phase_seconds without the broker's wake-up.
//
//   pw-bench-expert-fetch [--hidden H] [--ffn F] [--bits B] [--reps K]
// Prints the median (and min / max) of K fetches per kind: total, get, check.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "services/transport/ucx.h"
#include "services/workers/weights/plane_mover.h"

namespace {

using namespace pw;
using workers::MovePart;

struct Stat {
  double median = 0, min = 0, max = 0;
};
Stat Of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2] * 1e3, v.front() * 1e3, v.back() * 1e3};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"synchronous expert fetch: get and checksum phases"};
  int hidden = 2048, ffn = 1024, bits = 4, reps = 50, tile_rows = 64;
  app.add_option("--hidden", hidden, "model hidden size")->check(CLI::Range(64, 65536));
  app.add_option("--ffn", ffn, "expert FFN size")->check(CLI::Range(64, 65536));
  app.add_option("--bits", bits, "width fetched (planes and LUT)")->check(CLI::Range(3, 8));
  app.add_option("--reps", reps, "fetches per checksum kind")->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  auto ctx = transport::ucx::Context::Create().value();
  auto owner = transport::ucx::Worker::Create(*ctx).value();
  auto client = transport::ucx::Worker::Create(*ctx).value();
  owner->StartProgressThread();
  client->StartProgressThread();

  // The store: each block's planes, then its LUT (fp16 values in [-1, 1]).
  struct Block {
    int rows, cols;
  };
  const Block blocks[] = {{2 * ffn, hidden}, {hidden, ffn}};
  std::vector<uint8_t> store;
  std::mt19937 rng(1);
  struct Layout {
    uint64_t plane_off[8], lut_off;
    size_t plane_bytes, lut_bytes;
  } layout[2];
  for (int b = 0; b < 2; ++b) {
    const size_t row_bytes = static_cast<size_t>(blocks[b].cols) / 8;
    layout[b].plane_bytes = row_bytes * static_cast<size_t>(blocks[b].rows);
    for (int p = 0; p < bits; ++p) {
      layout[b].plane_off[p] = store.size();
      for (size_t i = 0; i < layout[b].plane_bytes; ++i)
        store.push_back(static_cast<uint8_t>(rng()));
    }
    layout[b].lut_off = store.size();
    layout[b].lut_bytes = (static_cast<size_t>(blocks[b].rows) << bits) * 2;
    for (size_t i = 0; i < layout[b].lut_bytes / 2; ++i) {
      const uint16_t h = static_cast<uint16_t>(0x3000 + (rng() % 0x0C00)) | ((rng() & 1) << 15);
      store.push_back(static_cast<uint8_t>(h & 0xff));
      store.push_back(static_cast<uint8_t>(h >> 8));
    }
  }
  auto region = transport::ucx::MemoryRegion::Register(*ctx, store.data(), store.size()).value();

  // Destination pages and parts, per kind (checksums differ).
  std::vector<std::vector<uint8_t>> pages;
  std::vector<std::vector<float>> scales;
  auto parts_for = [&](wire::ChecksumKind kind) {
    std::vector<MovePart> parts;
    for (int b = 0; b < 2; ++b) {
      const int rows = blocks[b].rows;
      for (int p = 0; p <= bits; ++p) {
        MovePart m;
        m.lut = p == bits;
        m.lut_bits = m.lut ? bits : 0;
        m.rows = rows;
        m.tile_rows = tile_rows;
        m.row_bytes = m.lut ? size_t{1} << bits : static_cast<size_t>(blocks[b].cols) / 8;
        m.remote_offset = m.lut ? layout[b].lut_off : layout[b].plane_off[p];
        m.bytes = m.lut ? layout[b].lut_bytes : layout[b].plane_bytes;
        m.checksum = proto::PartChecksumOf(kind, store.data() + m.remote_offset, m.bytes);
        for (int r = 0; r < rows; r += tile_rows) {
          pages.emplace_back(static_cast<size_t>(tile_rows) * m.row_bytes);
          m.pages.push_back(pages.back().data());
        }
        if (m.lut) {
          scales.emplace_back(static_cast<size_t>(rows));
          m.scales = scales.back().data();
        }
        parts.push_back(std::move(m));
      }
    }
    return parts;
  };
  pages.reserve(4096);
  scales.reserve(16);
  std::printf(
      "expert: gate_up %d x %d, down %d x %d, %d bits: %.2f MiB in %d parts; %d fetches per kind\n",
      blocks[0].rows, blocks[0].cols, blocks[1].rows, blocks[1].cols, bits,
      static_cast<double>(store.size()) / (1 << 20), 2 * (bits + 1), reps);
  std::printf("%-10s %24s %24s %24s\n", "checksum", "fetch ms med (min-max)", "get ms", "check ms");
  for (wire::ChecksumKind kind : {wire::ChecksumKind::FNV1A64, wire::ChecksumKind::CRC32C}) {
    workers::PlaneMover::Options o;
    o.checksum_kind = kind;
    auto mover = workers::PlaneMover::Start(*client, owner->Address(), region->PackedRkey(),
                                            region->base(), store.size(), o);
    if (!mover.ok()) return std::fprintf(stderr, "%s\n", mover.status().ToString().c_str()), 1;
    const std::vector<MovePart> parts = parts_for(kind);
    std::vector<double> total, get, check;
    for (int r = 0; r < reps + 2; ++r) {
      workers::FetchTimes t;
      const auto t0 = std::chrono::steady_clock::now();
      Status st = (*mover)->FetchNow(parts, &t);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
      if (r < 2) continue;  // warm-up
      total.push_back(s);
      get.push_back(t.get_s);
      check.push_back(t.check_s);
    }
    const Stat a = Of(total), g = Of(get), c = Of(check);
    std::printf("%-10s %8.3f (%.3f-%.3f) %10.3f (%.3f-%.3f) %10.3f (%.3f-%.3f)\n",
                proto::PartChecksumName(kind).c_str(), a.median, a.min, a.max, g.median, g.min,
                g.max, c.median, c.min, c.max);
  }
  return 0;
}
