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

#include "common/formats/model_config.h"
#include "common/status.h"

namespace pw::serve {

struct ModelSource {
  std::string dir;           // absolute
  std::string default_name;  // "ORG/NAME" for a cache snapshot, else the directory's name
  ModelConfig config;
  uint64_t checkpoint_bytes = 0;  // every safetensors file (the workers map them)
  // Bytes of one int8 copy of the dense matrices (--dense int8), at most: every 2-D tensor but
  // the routed experts' and the embedding (counted once more where lm_head is tied to it), rows
  // in the int8 layout (q8.h Q8MatrixValueBytes) and one fp32 scale per row. An upper bound:
  // the router's gate and the few matrices the engine keeps in bf16 are counted too.
  uint64_t dense_int8_bytes = 0;
  std::string tokenizer_dir;      // absolute: `dir`, or where --tokenizer points
  int32_t tokenizer_vocab = 0;    // one past the tokenizer's largest id
};

// Checks `model_dir` as above, its tokenizer in `tokenizer` when that is not "" (a directory or
// a tokenizer.json: services/common/tokenizer_dir.h); errors are kInvalidArgument / kNotFound /
// kUnsupported with the message a user acts on.
Result<ModelSource> OpenModelSource(const std::string& model_dir, const std::string& tokenizer = "");

// "ORG/NAME" when `dir` is .../models--ORG--NAME/snapshots/REV, "" otherwise.
std::string CacheSnapshotName(const std::string& dir);

}  // namespace pw::serve
