// Training the planner's prompt residual heads (common/formats/residual_heads.h) offline, the logic
// behind `pw-quantize residuals`.
//
// For every calibration prompt p (a window of prompt_tokens tokens of the calibration text, or
// of seeded random token ids) the engine runs the checkpoint's bf16 experts teacher-forced and
// records, per expert block i of layer l, n_p(e) (tokens of p routed to expert e) and
// S_p,i[j] = sum over those tokens of x_j^2 (the prompt's own, unnormalised Hessian diagonal).
//   feature  f_p,l[e] = n_p(e) / sum_e' n_p(e')            (the layer's routing histogram)
//   measured damage of p at (l, proj), the store's split identity (same codes, same LUTs):
//     M_p = sum_e sum_j S_p,i[j] * (err_i,lo[j] - err_i,hi[j])
//     err_i,b[j] = sum_r (w_rj - LUT_b[r][code_b(r, j)])^2   (b = lo: min width, hi: max width)
//   what the store's table says for the same routing:
//     T_p = sum_e n_p(e) * (D_i[lo] - D_i[hi])              (D_i: per routed calibration token)
//   target   y_p,l,proj = log(M_p / T_p)
// so y is the part of p's damage that routing counts (the planner's hot(mass)) do not explain:
// how far p's own activations on the layer's experts sit from the calibration mean. Each head is
// a ridge regression of y on f over the training prompts; every holdout_every-th prompt is
// held out and the R^2 and correlation of predicted vs measured y on those are recorded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/formats/residual_heads.h"
#include "common/status.h"

namespace pw::anyprec {

struct ResidualTrainOptions {
  std::string model_dir;
  std::string store_path;      // the .apw store the heads go beside (its damage table and codes)
  std::string calib_path;      // UTF-8 text split into prompts (unused with calib_random_tokens)
  std::string tokenizer_path;  // default: <model_dir>/tokenizer.json
  int64_t calib_random_tokens = 0;  // > 0: prompts of seeded random token ids instead of text
  uint64_t calib_seed = 0;
  int prompt_tokens = 64;      // tokens per calibration prompt
  int max_prompts = 0;         // 0 = every whole prompt of the text; else this many, evenly spread
  int holdout_every = 5;       // prompt k is held out when k % holdout_every == holdout_every - 1
  double ridge = 1e-2;         // L2 penalty, relative to the features' mean variance
  double clamp = 2.0;          // |residual| at most this (ResidualHeads::clamp)
  int threads = 1;
  std::string out_path;        // heads file (written atomically)
  // Non-empty: score these heads on the prompts instead (all held out; nothing written).
  std::string evaluate_heads;
};

// One measured sample: prompt p at (layer, proj).
struct ResidualSample {
  int prompt = 0, layer = 0;
  ExpertProj proj = ExpertProj::kGateUp;
  std::vector<double> feature;  // num_experts shares
  double target = 0;            // log(M_p / T_p)
  bool heldout = false;
};

struct ResidualTrainReport {
  int prompts = 0, train_prompts = 0, heldout_prompts = 0;
  int samples = 0;
  double heldout_r2 = 0, heldout_corr = 0;
  double train_r2 = 0;
  double target_sd = 0;  // standard deviation of the held-out targets about their heads' means
  double seconds = 0;
};

// Ridge regression y ~ bias + w . x (x centred; the penalty ridge * mean feature variance * n
// on w, none on the bias): returns {bias, w...}. InvalidArgument on empty or ragged input.
Result<std::vector<double>> FitRidgeHead(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                                         double ridge);

// Measures the samples (the engine over the prompts), fits and saves the heads.
Result<ResidualTrainReport> TrainResidualHeads(const ResidualTrainOptions& options);

// The fitting step alone, over measured samples: one head per (layer, proj) from the training
// samples, R^2 / correlation on the held-out ones. Samples of heads with fewer than 2 training
// samples leave that head at 0.
Result<ResidualTrainReport> FitResidualHeads(const std::vector<ResidualSample>& samples, double ridge,
                                             ResidualHeads* heads);

}  // namespace pw::anyprec
