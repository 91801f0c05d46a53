#include "services/engine/expert_tiles.h"

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

}  // namespace pw::engine
