#include "engine/runner/block_times.h"

namespace pw::engine {

const char* BlockKindName(BlockKind k) {
  switch (k) {
    case BlockKind::kFullAttention: return "full attention";
    case BlockKind::kLinearAttention: return "linear attention";
    case BlockKind::kLatentAttention: return "latent attention";
    case BlockKind::kMlp: return "mlp";
  }
  return "?";
}

}  // namespace pw::engine
