// `pw serve MODEL_DIR`: from a checkpoint directory to a running node in one command.
//   1. the directory is checked (model_source.h), the memory planned (memory_plan.h): a bad
//      directory or too little memory is refused here, before anything is built;
//   2. the any-precision store is found in the cache or built there (store_cache.h; skipped
//      with --bits 16);
//   3. the node file is written to the run directory (the schema of deploy/local.yaml:
//      services/common/node_config.h) and pw-cluster (beside `pw`) replaces this process to run
//      it: it prints the endpoint and a curl line with the served name, and drains on SIGTERM.
#pragma once

#include <string>

#include "common/status.h"
#include "services/serve/memory_plan.h"
#include "services/serve/serve_options.h"

namespace pw::serve {

// What the node file needs besides the options.
struct NodePlan {
  std::string model_dir, model_name, run_dir, bin_dir, store;  // store "" = bf16 experts
  std::string tokenizer_dir;  // "" = the model directory's (the router's default)
  std::string model_hash_cache;  // the broker remembers the model hash here ("" = hashes at start)
  MemoryPlan memory;
  int max_bits = 8;  // the planner's highest width (ServeOptions::max_bits resolved)
  DenseFormat dense = DenseFormat::kBf16;     // ServeOptions::dense resolved (ServeDense)
  DenseFormat lm_head = DenseFormat::kBf16;   // and the lm_head's
  int router_control_port = 0, broker_control_port = 0;
};

// The planner's highest width from --max-bits and --bits (ServeOptions): "auto" is
// anyprec::FastWidthLimit of this CPU's fast path, raised to a --bits given above it; a --bits
// above a given --max-bits is kInvalidArgument.
Result<int> PlannerMaxBits(const std::string& max_bits, const std::string& bits);

// The dense matrices' and the lm_head's formats of a node from --dense (`dense`: "auto" or a
// format's name) and --lm-head (kAsDense: what --dense gives it). auto: bf16 when the experts
// are bf16 (`bf16_experts`, --bits 16: the checkpoint served as it is), packed losslessly
// (bf16-packed, the same values in 0.75x the bytes) where its product is decoded in registers
// (`packed_fast`: cpu::PackingPays, AVX512-BF16 with bf16 activations); when the experts never
// exceed 4 bits (`max_bits`, the planner's ceiling) ap4, with an ap6 lm_head where the fast
// path runs 6 bits at speed (`fast_width` = anyprec::FastWidthLimit >= 6: AVX-512 VBMI) and an
// int8 one otherwise (docs/quality.md, "Dense matrices below 8 bits": +0.2 % perplexity); else
// int8 (no measurable perplexity change, half the bytes of bf16).
struct DenseChoice {
  DenseFormat dense = DenseFormat::kBf16;
  DenseFormat lm_head = DenseFormat::kBf16;
};
Result<DenseChoice> ServeDense(const std::string& dense, DenseFormat lm_head, bool bf16_experts, int max_bits,
                               int fast_width, bool packed_fast);

// The node file (YAML) of `plan`.
std::string NodeFileText(const ServeOptions& o, const NodePlan& plan);

// Runs steps 1-3. Returns only on an error (exec replaces the process otherwise); the status
// is printed by the caller. `bin_dir`: the directory of `pw` (pw-quantize and pw-cluster are
// found there).
Status RunServe(const ServeOptions& o, const std::string& bin_dir);

}  // namespace pw::serve
