// The --lynx flags pw-eval and pw-bench-engine share, and the remap rule they select.
//
//   --lynx                      run a batch remap rule as the routing hook (decode batches)
//   --lynx-rule lynx|piggyback  LYNX (policies/lynx/lynx_remap.h) or the piggyback baseline
//   --lynx-alpha A --lynx-beta B  per-model override of the bins (default: from k/N)
//   --lynx-gate-weights renorm|mass
//   --lynx-exempt L0,L1,...     layers that keep the router's choice
//   --lynx-keep K'              piggyback: router choices each token keeps (default 1)
//   --lynx-config FILE          YAML with any of: rule, alpha, beta, gate_weights,
//                               exempt_layers [..], keep (flags given on the command line win)
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "policies/lynx/batch_remapper.h"

namespace CLI {
class App;
}

namespace pw::tools {

struct LynxFlags {
  bool on = false;
  std::string rule = "lynx";
  float alpha = 0.f;  // 0: default
  int beta = -1;      // -1: default
  std::string gate_weights = "renorm";
  std::string exempt;  // "0,3"
  int keep = 1;
  std::string config;
};

void AddLynxFlags(CLI::App* app, LynxFlags* f);

// The rule the flags name for a router of N experts choosing k; *description says which
// (e.g. "lynx alpha 3 beta 4 (default from k/N) renorm"). kInvalidArgument on bad flags.
Result<std::unique_ptr<lynx::BatchRemapper>> MakeRemapper(const LynxFlags& f, int num_experts,
                                                          int top_k, std::string* description);

}  // namespace pw::tools
