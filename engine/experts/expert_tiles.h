// ExpertTiles: the work items of one dispatch over every expert of a MoE layer.
//
// A tile is one block's output rows [r0, r1) for one run of consecutive rows of the layer's
// ExpertLayerCall (a group's tokens, or a chunk of them when a kernel takes at most so many
// tokens at once). An expert layer runner lists the tiles of all experts' gate_up blocks (or
// all down blocks) and runs them in ONE thread-pool dispatch: the tiles are cut into a few
// contiguous runs per thread of about equal cost (rows x tokens), which the pool's threads
// claim in turn, so a layer pays two pool hand-offs instead of two per expert, a run crosses
// expert boundaries, and a thread that starts late leaves its runs to the others.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/thread_pool.h"

namespace pw::engine {

struct ExpertTile {
  int32_t group = 0;  // index into ExpertLayerCall::groups
  int32_t row0 = 0;   // first row of ExpertLayerCall::rows the tile computes
  int32_t tokens = 0; // consecutive rows from row0
  int32_t r0 = 0;     // output rows of the block, [r0, r1)
  int32_t r1 = 0;
  int32_t part = 0;   // 0: rows below the block's split (or no split), 1: rows from it
};

// Output rows per tile: a multiple of 16 (the dense kernels' row blocks), small enough that a
// layer's tiles balance over the threads, large enough to keep each weight stream long.
inline constexpr int32_t kExpertTileRows = 64;

// Appends the tiles of one block: rows [0, rows) in kExpertTileRows steps, never crossing
// `split` (0: none; e.g. I for a gate_up block stored as two matrices), for `tokens` rows
// of the call from row0.
void AppendExpertTiles(int32_t group, int32_t row0, int32_t tokens, int32_t rows, int32_t split,
                       std::vector<ExpertTile>* tiles);

// Whether b continues a: the same group, tokens and part, and b's rows start where a's end.
inline bool ContinuesTile(const ExpertTile& a, const ExpertTile& b) {
  return a.group == b.group && a.row0 == b.row0 && a.tokens == b.tokens && a.part == b.part &&
         b.r0 == a.r1;
}

// How RunExpertTiles hands a thread's run of tiles to fn.
enum class TileCalls {
  kEach,      // one call per tile
  kCoalesce,  // consecutive tiles that continue each other (ContinuesTile) as one call: one
              // long weight stream per block and thread instead of one per kExpertTileRows
};

// Cuts tiles into `pieces` contiguous runs of about equal cost (rows x tokens): run p is
// tiles [cut[p], cut[p + 1]), the tiles whose cost midpoint lies in [p, p + 1) * total / pieces
// (runs may be empty when a tile is larger than a share). cut has pieces + 1 entries.
void CutExpertTiles(const std::vector<ExpertTile>& tiles, int pieces, size_t* cut);

// Runs fn(tile) -> Status for every tile, on the pool in one dispatch when the work is worth
// one (cols x rows x tokens summed over tiles >= min_macs), else on the calling thread. The
// tiles are cut (CutExpertTiles) into up to cpu::ThreadPool::kChunksPerThread runs per thread,
// each run handed to one thread. Returns the first error in tile order (every tile runs even
// after an error). With TileCalls::kCoalesce, fn receives the union of each stretch of a run's
// tiles that continue each other (never across a block's split: AppendExpertTiles marks the
// two sides as different parts).
template <typename F>
Status RunExpertTiles(cpu::ThreadPool* pool, const std::vector<ExpertTile>& tiles, size_t cols,
                      size_t min_macs, F&& fn, TileCalls calls = TileCalls::kEach) {
  constexpr size_t kMaxPieces = 64;
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  uint64_t total = 0;
  for (const ExpertTile& t : tiles) total += static_cast<uint64_t>(t.r1 - t.r0) * t.tokens;
  auto run = [&](size_t b, size_t e) -> Status {
    Status first = Status::Ok();
    for (size_t i = b; i < e;) {
      Status s;
      if (calls == TileCalls::kCoalesce) {
        ExpertTile t = tiles[i++];
        while (i < e && ContinuesTile(t, tiles[i])) t.r1 = tiles[i++].r1;
        s = fn(static_cast<const ExpertTile&>(t));
      } else {
        s = fn(tiles[i++]);
      }
      if (!s.ok() && first.ok()) first = std::move(s);
    }
    return first;
  };
  if (threads <= 1 || tiles.size() < 2 || total * cols < min_macs) return run(0, tiles.size());
  const int pieces = static_cast<int>(std::min<size_t>(
      {cpu::ThreadPool::kChunksPerThread * static_cast<size_t>(threads), tiles.size(), kMaxPieces}));
  size_t cut[kMaxPieces + 1];
  CutExpertTiles(tiles, pieces, cut);
  Status status[kMaxPieces];
  pool->ParallelFor(static_cast<size_t>(pieces), 1, 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) status[i] = run(cut[i], cut[i + 1]);
  });
  for (Status& s : status) PW_RETURN_IF_ERROR(s);
  return Status::Ok();
}

}  // namespace pw::engine
