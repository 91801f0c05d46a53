// Teacher-forced perplexity over non-overlapping windows (pw-eval ppl and tests).
//
// Rule: the token ids are cut into consecutive, non-overlapping windows of `ctx` tokens
// (the last window may be shorter; a final window of a single token predicts nothing and is
// skipped). Each window is evaluated from an empty cache; inside it, token i (i >= 1) is
// predicted from tokens [0, i) of the same window. So a window of n tokens contributes n - 1
// predictions, and
//   nll_sum  = sum over predictions of -log softmax(logits)[target]   (natural log)
//   n_tokens = number of predictions
//   ppl      = exp(nll_sum / n_tokens)
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"

namespace pw::engine {

struct PerplexityResult {
  double nll_sum = 0;
  int64_t n_tokens = 0;  // predictions scored
  int64_t n_windows = 0;
  // Per prediction, in text order: -log p(target) and the window it belongs to (for paired
  // comparisons of two runs over the same text: tools/compare_nll.py).
  std::vector<float> token_nll;
  std::vector<int32_t> token_window;
  double ppl() const;
};

// Called after each window with (windows done, windows total).
using PerplexityProgress = std::function<void(int64_t, int64_t)>;

// kInvalidArgument when ctx < 2 or there are fewer than 2 ids; errors of ForwardLogits.
Result<PerplexityResult> Perplexity(Engine& engine, std::span<const int32_t> ids, int ctx,
                                    const PerplexityProgress& progress = nullptr);

}  // namespace pw::engine
