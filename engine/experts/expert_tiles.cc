#include "engine/experts/expert_tiles.h"

#include <algorithm>

namespace pw::engine {

void AppendExpertTiles(int32_t group, int32_t row0, int32_t tokens, int32_t rows, int32_t split,
                       std::vector<ExpertTile>* tiles) {
  auto part = [&](int32_t begin, int32_t end, int32_t index) {
    for (int32_t r = begin; r < end; r += kExpertTileRows) {
      tiles->push_back({group, row0, tokens, r, std::min(end, r + kExpertTileRows), index});
    }
  };
  if (split > 0 && split < rows) {
    part(0, split, 0);
    part(split, rows, 1);
  } else {
    part(0, rows, 0);
  }
}

void CutExpertTiles(const std::vector<ExpertTile>& tiles, int pieces, size_t* cut) {
  uint64_t total = 0;
  for (const ExpertTile& t : tiles) total += static_cast<uint64_t>(t.r1 - t.r0) * t.tokens;
  for (int i = 0; i <= pieces; ++i) cut[i] = tiles.size();
  cut[0] = 0;
  uint64_t before = 0;
  int p = 1;
  for (size_t i = 0; i < tiles.size() && p < pieces; ++i) {
    const uint64_t c = static_cast<uint64_t>(tiles[i].r1 - tiles[i].r0) * tiles[i].tokens;
    while (p < pieces && 2 * before + c >= 2 * total * static_cast<uint64_t>(p) / pieces)
      cut[p++] = i;
    before += c;
  }
}

}  // namespace pw::engine
