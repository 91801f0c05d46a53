// PiggybackRemapper: the baseline LYNX is compared with ("piggybacking" on experts the batch
// already loads, after OEA). Per MoE layer of a pure-decode batch:
//   base set P = union over tokens of each token's first k' router choices (k' < k);
//   each token keeps its first k' choices and fills its other k - k' slots with the members of
//   P it does not hold yet, best of its own logits first; when P has too few, with its own next
//   router choices (so every token keeps exactly k distinct experts).
// The distinct experts of the batch are then |P| plus the few fill-ins of small batches.
// Phase gate, exemption and gate weights as LYNX (lynx_remap.h). k' >= k: the identity.
#pragma once

#include <vector>

#include "policies/lynx/batch_remapper.h"
#include "policies/lynx/gate_weights.h"
#include "policies/lynx/remap_buffers.h"

namespace pw::lynx {

struct PiggybackOptions {
  int keep = 1;  // k': router choices every token keeps, >= 1
  GateWeights gate_weights = GateWeights::kRenormalize;
  std::vector<int> exempt_layers;
};

class PiggybackRemapper final : public BatchRemapper {
 public:
  explicit PiggybackRemapper(PiggybackOptions options);
  void Reserve(int max_tokens, int num_experts, int top_k) override;
  const RemapOutput& Remap(const RemapInput& in) override;
  const PiggybackOptions& options() const { return options_; }

 private:
  PiggybackOptions options_;
  RemapBuffers buf_;
  std::vector<int32_t> base_;    // experts of P, ascending
  std::vector<int32_t> cand_;    // [|P|]
  std::vector<int32_t> chosen_;  // [k]
};

}  // namespace pw::lynx
