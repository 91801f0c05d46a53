// The cache of any-precision stores `pw serve` builds, one per checkpoint, keyed by the model
// hash (common/formats/checkpoint_experts.h: config.json and every routed expert's bytes)
// combined with the hash of its calibration input (CalibrationKey: the calibration text and the
// tokenizer that turns it into ids), so a checkpoint moved or copied elsewhere finds its store,
// and a changed checkpoint, calibration text or tokenizer gets a new store:
//
//   <store_dir>/stores/<hash>.apw       the store, published by an atomic rename
//   <store_dir>/stores/<hash>.apw.tmp   the store being written (its only copy until published)
//   <store_dir>/stores/<hash>.partial/  a build in progress, or killed: its calibration and the
//                                       layers written to the .tmp; the next start resumes it
//                                       (quant/store_build_dir.h) and removes it when done
//   <store_dir>/stores/<hash>.lock      held (flock) by the process building it
// <hash> is the 64-bit StoreKey in 16 hex digits. store_dir defaults to $XDG_CACHE_HOME/pagedweight,
// else ~/.cache/pagedweight. Nothing is evicted automatically (docs/architecture.md, "pw serve").
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace pw::serve {

// $XDG_CACHE_HOME/pagedweight, else $HOME/.cache/pagedweight; kInvalidArgument when neither
// variable is set (then --store-dir is needed).
Result<std::string> DefaultStoreDir();

struct StorePaths {
  std::string key;      // 16 hex digits of the model hash
  std::string store;    // .apw
  std::string partial;  // resume directory of a build
  std::string lock;
};
// The hash of what a store is calibrated on: FNV-1a 64 over the bundled calibration text's hash
// (common/calibration_text.h, 8 bytes little-endian) followed by the bytes of the tokenizer.json
// that makes its ids. kNotFound / kInternal naming the file when it cannot be read.
Result<uint64_t> CalibrationKey(const std::string& tokenizer_json);
// The key of a checkpoint's store: FNV-1a 64 over the model hash and the calibration key, both
// little-endian.
uint64_t StoreKey(uint64_t model_hash, uint64_t calibration_hash);
StorePaths StorePathsFor(const std::string& store_dir, uint64_t store_key);

// How a missing store is built: pw-quantize (found beside `pw`) on the checkpoint.
struct StoreBuild {
  std::string quantize_bin;     // path of pw-quantize
  std::string model_dir;
  int threads = 1;
  // Calibration: pw-quantize's default, the bundled text through this tokenizer.json (the
  // checkpoint's, or the one `pw serve --tokenizer` names: pw serve refuses to run without
  // one), so the same checkpoint and tokenizer give the same store on every machine with the
  // same thread count.
  std::string tokenizer_json;
  // Where pw serve keeps the model hash (common/formats/model_hash_cache.h): pw-quantize takes
  // it from there instead of reading every expert byte again ("" = it hashes).
  std::string model_hash_cache;
};

// Makes sure paths.store exists: returns false when it was already there, true when it was
// built now (with pw-quantize --resume-dir paths.partial, its progress lines on stderr; a
// second process wanting the same store waits for the first). The build runs as a child that
// dies with this process, so killing `pw serve` leaves a partial directory the next start resumes.
Result<bool> EnsureStore(const StorePaths& paths, const StoreBuild& build);

}  // namespace pw::serve
