// Quantizes a whole checkpoint into an .apw store (the logic behind pw-quantize):
//   1. calibration: prefills the calibration text in windows of `ctx` tokens (the lm_head
//      only for a window's last position), recording per expert block sum_t x_tj^2 over the
//      tokens routed to it (gate_up: the expert's input hidden states; down: SiLU(gate)*up).
//      The text is calib_path, or by default the bundled one (common/calibration_text.h)
//      through the model's tokenizer. With calib_random_tokens > 0 the tokens are instead that
//      many ids drawn uniformly from the model's vocabulary (seeded; no text, no tokenizer),
//      also the default for a checkpoint without a tokenizer (kDefaultRandomCalibrationTokens;
//      calibration_tokens.h) such as make_synthetic_moe's, where the statistics only need to
//      be plausible;
//   2. sensitivity of block i: h_j = (sum_j + n0 * hbar_j) / (n_i + n0), hbar = the layer's
//      mean over all routed tokens (same projection), n0 = prior_tokens: a rarely routed expert
//      leans on its layer's statistics instead of getting zero; then h_j >= floor_rel * mean(hbar);
//   3. every block quantized (quantizer.h) and written with its damage table and token count.
// Deterministic: same model, text (or random-token count and seed) and options give the same
// bytes, with or without resume_dir, and whether or not the build was interrupted.
// With resume_dir the build's progress is kept there (quant/store_build_dir.h): a build killed
// part-way and started again reuses the calibration statistics and continues the store's .tmp
// after the last layer recorded, then publishes the store and removes the directory. The
// store's bytes are written once either way.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace pw::anyprec {

struct QuantizeModelOptions {
  std::string model_dir;
  std::string calib_path;      // UTF-8 text ("" and no random tokens: the default, above)
  std::string out_path;        // .apw store (written atomically)
  std::string tokenizer_path;  // default: <model_dir>/tokenizer.json (unused with random tokens)
  int64_t calib_random_tokens = 0;  // > 0: calibrate on this many random token ids, not text
  uint64_t calib_seed = 0;          // seed of those ids
  int seed_bits = 3;
  int max_bits = 8;
  int threads = 1;
  int ctx = 256;                  // calibration window in tokens
  int64_t max_calib_tokens = 0;   // 0 = the whole file
  int prior_tokens = 16;          // n0 above
  double floor_rel = 1e-3;
  bool progress = true;           // progress bar with ETA on stderr (with resume_dir: one
                                  // line per quantized layer)
  std::string resume_dir;         // "" = keep nothing; see the top of this file
  // Where the model hash is remembered between runs (common/formats/model_hash_cache.h);
  // "" = hashed here.
  std::string model_hash_cache;
};

struct QuantizeModelReport {
  int64_t calib_tokens = 0;
  int num_blocks = 0;
  double calib_seconds = 0;
  double quantize_seconds = 0;
  double total_seconds = 0;
  std::string calibration;           // what the calibration ids came from (DescribeCalibration)
  bool calibration_reused = false;  // resume_dir held the calibration statistics
  int layers_reused = 0;            // layers an earlier build had written (resume_dir)
  bool hash_remembered = false;     // model_hash_cache held the model hash: no expert byte hashed
  bool hash_beside_forward = false; // the hash ran on its own thread during the forward passes
  // Where the time went (wall seconds; pw-quantize --verbose prints them): loading the model
  // (weights mapped, dense matrices prepared), its hash (every expert byte read), the
  // calibration tokens (tokenizing), the forward passes, the blocks' sensitivities, the per-row
  // fit (QuantizeBlock, which converts each row's bf16 weights), writing blocks (CRC, pwrite; with
  // resume_dir also flushing each layer and recording it), and assembling: with resume_dir
  // checking an earlier build's blocks, then the table, header, fsync and rename.
  double load_seconds = 0, hash_seconds = 0, tokens_seconds = 0, forward_seconds = 0;
  double prepare_seconds = 0, fit_seconds = 0, write_seconds = 0, assemble_seconds = 0;
};

Result<QuantizeModelReport> QuantizeModel(const QuantizeModelOptions& options);

}  // namespace pw::anyprec
