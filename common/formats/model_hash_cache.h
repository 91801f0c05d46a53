// The model hash of a checkpoint (ModelHash, common/formats/checkpoint_experts.h: config.json
// and every routed expert's bytes) remembered between starts of `pw serve` and of the broker
// it starts (broker option `model_hash_cache`), so that a second start of a large checkpoint
// does not read all its experts again:
//
//   <store_dir>/hashes/<FNV-1a 64 of the directory's canonical path>.txt
//
// records the hash with the device, inode, size, mtime and ctime (nanoseconds) of every file of
// the directory it can depend on (config.json, *.safetensors, model.safetensors.index.json;
// symlinks followed, as in a Hugging Face cache snapshot). A later call whose files are exactly
// those, with the same five figures each, returns the recorded hash; anything else (a file
// added, removed, replaced or written: a write sets ctime to now, and no call sets ctime back)
// hashes the bytes again and rewrites the entry. An entry is written only when no file changed
// while it was hashed and every file's mtime and ctime are at least `settle_seconds` older than
// the start of the hashing, so that a write in the same clock tick as the recorded ctime cannot
// go unnoticed. A missing or unreadable entry is not an error: the hash is computed.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace pw {

struct CachedModelHash {
  uint64_t hash = 0;
  bool from_cache = false;  // the entry matched: no expert byte was read
};

Result<CachedModelHash> ModelHashCached(const std::string& model_dir, const std::string& store_dir,
                                        double settle_seconds = 1.0);

}  // namespace pw
