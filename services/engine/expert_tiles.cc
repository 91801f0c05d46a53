#include "services/engine/expert_tiles.h"

#include <algorithm>

namespace pw::engine {

void AppendExpertTiles(int32_t group, int32_t row0, int32_t tokens, int32_t rows, int32_t split,
                       std::vector<ExpertTile>* tiles) {
  auto part = [&](int32_t begin, int32_t end) {
    for (int32_t r = begin; r < end; r += kExpertTileRows) {
      tiles->push_back({group, row0, tokens, r, std::min(end, r + kExpertTileRows)});
    }
  };
  if (split > 0 && split < rows) {
    part(0, split);
    part(split, rows);
  } else {
    part(0, rows);
  }
}

}  // namespace pw::engine
