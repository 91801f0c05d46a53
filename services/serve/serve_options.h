// The options of `pw serve MODEL_DIR`, declared once (common/formats/options.h): its flags and
// the keys of its --config file come from DeclareServeOptions.
#pragma once

#include <cstdint>
#include <string>

#include "common/formats/options.h"
#include "common/dense_format.h"

namespace pw::serve {

struct ServeOptions {
  std::string model_dir;          // a checkpoint directory, sharded or not, or a Hugging Face
                                  // cache snapshot (.../models--ORG--NAME/snapshots/REV)
  std::string memory = "auto";    // the node's memory budget: bytes (suffixes K, M, G, T are
                                  // powers of 1024) or "auto" (memory_plan.h)
  std::string host = "127.0.0.1";  // every listener binds it
  int64_t port = 8000;            // the OpenAI API (the control ports are picked free)
  std::string tokenizer;          // "" = the checkpoint's; else a directory or its tokenizer.json
                                  // (services/common/tokenizer_dir.h), as vLLM's --tokenizer
  std::string served_model_name;  // "" = ORG/NAME of a cache snapshot, else the directory's name
  std::string bits = "auto";      // experts' width: auto (the widest that fits, at most
                                  // max_bits), 3..8, or 16 (the checkpoint's bf16 experts, no store)
  std::string max_bits = "auto";  // the planner's highest width: auto (the widest this CPU's fast
                                  // path runs at least as fast as bf16, anyprec::FastWidthLimit:
                                  // 8 with AVX-512 VBMI, 5 on AVX2; never below bits), or 3..8
  std::string prefill_bits = "auto";  // the prefill worker's experts: auto (the store at the
                                     // node's width when that is at most FastWidthLimit, else
                                     // the checkpoint's bf16) or 16 (always bf16)
  std::string store_dir;          // "" = $XDG_CACHE_HOME/pagedweight, else ~/.cache/pagedweight
  std::string run_dir;            // "" = <store_dir>/run/<model hash>-<port>
  int64_t quantize_threads = 0;   // threads of a store build (0 = every core)
  // The dense matrices' format: "auto" (ServeDense) or one of common/dense_format.h's names;
  // the lm_head's (kAsDense: what `dense` gives it). Copies made by each worker at start,
  // counted in the memory plan.
  std::string dense = "auto";
  DenseFormat lm_head = DenseFormat::kAsDense;
};

void DeclareServeOptions(options::OptionSet* s, ServeOptions* o);

}  // namespace pw::serve
