// What `pw serve` is given as MODEL_DIR, checked before anything is built or started: a
// Hugging Face checkpoint directory (model.safetensors, or the shards of
// model.safetensors.index.json), possibly a snapshot of the Hugging Face cache
// (.../models--ORG--NAME/snapshots/REV, whose files link into ../../blobs).
//
// Every refusal names the file and what to do: no config.json, a model_type no family serves
// (the supported ones listed), weights that do not open (a missing shard), no tokenizer.json
// (the router tokenizes every request: copy it in, or give --tokenizer), a tokenizer with ids
// beyond config.json's vocab_size (the tokenizer of another model).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/formats/model_config.h"
#include "common/status.h"
#include "common/dense_format.h"

namespace pw::serve {

struct DenseShape {
  int64_t rows = 0, cols = 0;
  bool lm_head = false;
};

struct ModelSource {
  std::string dir;           // absolute
  std::string default_name;  // "ORG/NAME" for a cache snapshot, else the directory's name
  ModelConfig config;
  uint64_t checkpoint_bytes = 0;  // every safetensors file (the workers map them)
  // The dense matrices a worker may copy (--dense, --lm-head): every 2-D tensor but the routed
  // experts' and the embedding (listed as the lm_head where that is tied to it). An upper
  // bound: the router's gate and the few matrices the engine keeps in bf16 are listed too.
  std::vector<DenseShape> dense_matrices;
  std::string tokenizer_dir;      // absolute: `dir`, or where --tokenizer points
  int32_t tokenizer_vocab = 0;    // one past the tokenizer's largest id
};

// Bytes of one worker's copies of `m`'s dense matrices in `dense` (the lm_head in `lm_head`,
// kAsDense: the same); 0 for bf16, which the worker reads from the checkpoint.
uint64_t DenseCopyBytes(const ModelSource& m, DenseFormat dense, DenseFormat lm_head);

// Checks `model_dir` as above, its tokenizer in `tokenizer` when that is not "" (a directory or
// a tokenizer.json: services/common/tokenizer_dir.h); errors are kInvalidArgument / kNotFound /
// kUnsupported with the message a user acts on.
Result<ModelSource> OpenModelSource(const std::string& model_dir, const std::string& tokenizer = "");

// "ORG/NAME" when `dir` is .../models--ORG--NAME/snapshots/REV, "" otherwise.
std::string CacheSnapshotName(const std::string& dir);

}  // namespace pw::serve
