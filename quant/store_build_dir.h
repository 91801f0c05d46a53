// The parts of an .apw store build kept on disk so that a build killed part-way (SIGKILL, power
// loss) resumes where it stopped instead of starting over (pw-quantize --resume-dir, pw serve):
//
//   <dir>/build.txt           what the parts are of: the model hash and every option that
//                             changes the bytes (a directory holding another build's parts is
//                             emptied)
//   <dir>/calibration.bin     the calibration statistics (per expert block: routed tokens, then
//                             sum_t x_tj^2 over its input columns), with a CRC-32
//   <dir>/store-progress.bin  the store's blocks written so far (apw::ApwWriter::Progress: the
//                             bytes of the store's .tmp in use and their table entries), with a
//                             CRC-32, rewritten after each MoE layer once the .tmp is flushed
// Every file appears whole or not at all (written to a temporary name, flushed, renamed), so a
// file present is a step done. The store itself is written once, to its own .tmp beside its
// final name (ApwWriter::Resume continues it, checking every listed block); QuantizeModel
// publishes it when the last layer is in and then removes the directory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/formats/apw_store.h"
#include "common/status.h"

namespace pw::anyprec {

// Per expert block, indexed by ExpertBlockIndex (common/expert_block.h): what calibration
// recorded for it.
struct CalibrationStats {
  int num_layers = 0, num_experts = 0, hidden = 0, ffn = 0;
  std::vector<uint64_t> tokens;             // tokens routed to the block
  std::vector<std::vector<double>> sums;    // [cols] sum of x_j^2 (gate_up: hidden, down: ffn)
};

class StoreBuildDir {
 public:
  // Creates `dir` (and its parents) or reuses it when its build.txt equals `build`; a directory
  // made for another build (or with no build.txt) has its parts removed first.
  static Result<StoreBuildDir> Open(const std::string& dir, const std::string& build);

  // Whether `dir` holds saved calibration statistics (of this build or another): false for an
  // empty path or a directory without them. Needs no build description.
  static bool MayHoldCalibration(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool reused() const { return reused_; }

  // The saved statistics when present and of this shape; nullopt when absent. A file that is
  // present but damaged is kCorrupt naming it.
  Result<std::optional<CalibrationStats>> LoadCalibration(int num_layers, int num_experts, int hidden,
                                                          int ffn) const;
  Status SaveCalibration(const CalibrationStats& stats) const;

  // The store's progress (see above): nullopt when none was saved; a file present but damaged
  // is kCorrupt naming it.
  Status SaveStoreProgress(const apw::ApwWriter::Progress& progress) const;
  Result<std::optional<apw::ApwWriter::Progress>> LoadStoreProgress() const;

  // Removes the parts and the directory.
  Status Remove() const;

 private:
  std::string dir_;
  bool reused_ = false;
};

// Writes `bytes` to `path` atomically: a temporary file beside it, fsync, rename.
Status WriteFileAtomically(const std::string& path, const std::string& bytes);

}  // namespace pw::anyprec
